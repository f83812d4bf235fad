"""How an aten kernel runs as a Hologram program.

An aten kernel describes its computation once, as a *builder* on
:class:`hologram.frontend.graph.Graph` tensors, and calls :func:`run`. The first call with a given
signature (op, static arguments, every operand's dtype/shape/strides, the outputs'
layouts, the backend) builds the program, compiles it and files its launch in the
process's launch cache (:func:`hologram.runtime.launch.launch_cache`, keys starting with
the op's name); later calls cost a cache lookup and a launch by address.

* Device tensors enter the program through their real strides (views, transposes and
  expanded tensors are read in place; the address is ``data_ptr()``, offset included).
* Python numbers and CPU 0-d tensors (torch's wrapped scalars) are 0-d runtime inputs:
  new values never recompile. Numbers arrive as bool, i64 or f64; builders cast them.
* Results are written into fresh tensors, contiguous or in the layout PyTorch's kernel
  would give (``layout=``, :mod:`.layout`), or into given ``out`` tensors through their
  strides (in-place ops and ``out=``), cast to the out dtype.
* With recorded execution on (:mod:`hologram_torch.lazy`), everything above happens at
  the call except the launch, which is recorded and runs at the region's cut.
"""

from __future__ import annotations

import ctypes
import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch

import hologram
from hologram import backends
from hologram.compiler.cache import deferred_writes
from hologram.errors import CompileError, DTypeError, HologramError
from hologram.frontend.graph import Graph, Tensor
from hologram.frontend.mixin import MAX_NDIM
from hologram.isa import dtypes as dt
from hologram.runtime.launch import launch_cache
from hologram_torch import fallback, lazy, memory, native
from hologram_torch.aten import layout as layout_
from hologram_torch.constants import NAME

ISA = {getattr(torch, name): t for t, name in dt.FULL_NAMES.items()}  # torch -> Atlas
TORCH = {v: k for k, v in ISA.items()}
_NUMBER = {bool: (dt.bool_, ctypes.c_bool), int: (dt.int64, ctypes.c_int64),
           float: (dt.float64, ctypes.c_double)}
#: The Python number types a kernel takes as a runtime value (passed boxed).
NUMBERS = frozenset(_NUMBER)
#: The Atlas dtype each of them arrives as.
NUMBER_TYPES = {kind: dtype for kind, (dtype, _) in _NUMBER.items()}
#: A bound for the kernels' own small caches (launches are bounded by the launch cache).
CACHE_ENTRIES = 16384


class Unsupported(Exception):
    """The operands are outside what a native kernel handles (e.g. a complex dtype): the
    caller runs the op through the CPU fallback instead."""


class Lacking(Unsupported):
    """The operands have a dtype that the device's backend lacks (f64 on webgpu), or need
    an operation on it that the backend lacks (i64 products on webgpu)."""


class _Entry:
    __slots__ = ("build", "key", "launch", "layouts", "lazy", "name", "single", "static")

    def __init__(self, launch, outs, single):
        self.launch = launch  # callable(addresses) or None when there is nothing to compute
        # (size, strides, nbytes, dtype) of each fresh result (strides None: contiguous;
        # otherwise a dense permutation, see layout.py)
        self.layouts = tuple(
            (list(shape), None if strides is None else list(strides),
             math.prod(shape) * dtype.itemsize, dtype) for shape, dtype, strides in outs)
        self.single = single  # the builder returned one tensor, not a tuple
        # what recording a launch needs (hologram_torch.lazy), set by run(): its key in the
        # launch cache, and the builder and static arguments it was compiled from
        self.key = self.name = self.build = self.static = None
        self.lazy = None  # the results' views, as lazy.record compares them (made there)


#: The process's launch cache. run()'s keys are ``(name, static, backend, host,
#: *operands[, outs])``; shortcuts' are ``(SHORTCUT, key)``.
_cache = _LAUNCHES = launch_cache()
_recent = _LAUNCHES.recent  # the hot lookup; a miss falls back to _LAUNCHES.get
#: run()'s keys whose program the backend refused for a dtype it lacks (:class:`Lacking`),
#: with the reason: such calls go to the CPU fallback without building the program again.
_refused: dict[tuple, str] = {}
#: Do native front kernels (hologram_torch/csrc/ops.cpp) run the hot ops' calls?
FRONT = native.fast_active()


#: Backends whose memory the device can hold tensors in besides host memory: their
#: allocations' handles are device addresses (a tensor's ``data_ptr()``, offsets
#: included), which their programs launch on (webgpu's are made up, see
#: :mod:`hologram.backends.webgpu.memory`).
DEVICE_MEMORY_BACKENDS = ("cuda", "webgpu", "metal", "vulkan")


def _host_choice() -> str:
    """``HOLOGRAM_BACKEND`` when it names a host backend (cpu, interp), else cpu, else the
    interpreter (``HOLOGRAM_BACKEND=webgpu`` configures the SDK, not this device)."""
    name = hologram.config.get().backend
    if name not in ("cpu", "interp") or not backends.backend_class(name).is_available():
        name = "cpu" if backends.backend_class("cpu").is_available() else "interp"
    return name


def _choose(name: str) -> str:
    """The backend ``name`` names for the device. ``"auto"``: cuda on an NVIDIA GPU (never
    its emulation), else webgpu on a GPU adapter (never a CPU emulation such as
    lavapipe), else :func:`_host_choice`; it never fails."""
    if name == "auto":
        for gpu in ("cuda", "webgpu"):
            if backends.backend_class(gpu).auto_available():
                return gpu
        return _host_choice()
    return hologram.backend.validate_backend(name)  # checked, errors worded, as everywhere


def _select(name: str) -> None:
    """Run the device on backend ``name`` (chosen by :func:`_choose`): its memory becomes
    the device's (refused once tensors live in other memory)."""
    memory.defer(None)  # (a choice deferred at import is overridden)
    allocator = _allocators.get(name)
    if allocator is None:
        allocator = _allocators[name] = backends.get(name).allocator()
    host = allocator.host_visible
    memory.use_memory(None if host else allocator, name)
    if not host:
        _scalars.reserve()
        # pin_memory() gives page-locked memory of the GPU's driver (not the emulation's)
        driver = getattr(allocator, "driver", None)
        if hasattr(driver, "page_locking"):
            native.page_lock(driver.page_locking())
    _state["backend"] = name
    _HOST[0] = host
    # Python floats arrive as f64 where the backend computes in f64, else as f32 (webgpu,
    # as CUDA's kernels take a float scalar in float for float32 tensors).
    wide = backends.get(name).supports("load", dt.float64)
    _state["lacks"] = frozenset() if wide else frozenset({torch.float64})
    _NUMBER[float] = (dt.float64, ctypes.c_double) if wide else (dt.float32, ctypes.c_float)
    NUMBER_TYPES[float] = _NUMBER[float][0]
    count = _devices(name, host)
    # The native front kernels launch with host addresses of numbers: on device memory,
    # ops dispatch from Python; so do they where several devices exist (a kernel's
    # results go to its operands' device, which the registry's guard decides).
    native.set_front(host and count == 1)


def _devices(name: str, host: bool) -> int:
    """Make the devices ``HOLOGRAM_TORCH_DEVICES`` asks for, on host memory (several share
    the host's memory, as JAX's host platform device count does); a backend with memory
    of its own has one, with a warning where more were asked for."""
    from hologram_torch import device

    count = hologram.config.get().torch_devices
    if count > 1 and not (host and native.set_device_count(count)):
        why = (f"the {name} backend's device is one GPU" if not host else
               f"they need the device's native library: {native.reason()}")
        warnings.warn(f"HOLOGRAM_TORCH_DEVICES={count}: one {NAME} device, as {why}",
                      stacklevel=3)
        count = 1
    memory.set_devices(count)
    device.set_device_count(count)
    return count


_HOST = [True]  # is the device's memory host memory (read on every launch)
_allocators: dict = {}  # one per backend the device ran on (its memory's owner)
_state: dict = {"lacks": frozenset()}  # backend; lacks: dtypes it lacks (torch dtypes)
_LAZY = lazy._state  # {"on": ...}: read on every launch


def backend() -> str:
    return _state["backend"]


def host_memory() -> bool:
    """Is the device's memory host memory (launches take host addresses of numbers)?"""
    return _HOST[0]


def set_backend(name: str) -> None:
    _select(_choose(name))
    shortcuts.clear()  # they hold kernels of the previous backend
    _refused.clear()


class _Shortcut:
    """The first element of shortcut keys in the launch cache (a marker)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SHORTCUT"


SHORTCUT = _Shortcut()


class Shortcuts:
    """Kernels' own signature -> entry, for hot ops whose signature is cheaper to form than
    run()'s key (see :func:`remember` and :func:`launch_fresh`): a view of the launch
    cache's ``(SHORTCUT, key)`` entries, so they share its bound and LRU eviction.
    Cleared with the backend."""

    __slots__ = ()

    def get(self, key: tuple) -> _Entry | None:
        key = (SHORTCUT, key)
        return _recent(key) or _LAUNCHES.get(key)

    def __contains__(self, key: tuple) -> bool:
        return (SHORTCUT, key) in _LAUNCHES

    def __len__(self) -> int:
        return sum(1 for k, _ in _LAUNCHES.items() if k[0] is SHORTCUT)

    def put(self, key: tuple, entry: _Entry) -> None:
        _LAUNCHES.put((SHORTCUT, key), entry)

    def clear(self) -> None:
        _LAUNCHES.discard(lambda k: k[0] is SHORTCUT)
        native.clear_fast()  # the front kernels' entries hold the same programs


shortcuts = Shortcuts()


def _select_at_import() -> None:
    """``HOLOGRAM_TORCH_BACKEND`` (default auto). This runs on ``import torch`` (the device
    autoloads): a backend that cannot run here is warned about, not raised; and a GPU
    backend (cuda, webgpu, named or ``auto`` where a GPU may be) is only probed when the
    device's memory is first needed, so that importing torch loads no GPU driver and
    makes no CUDA context or wgpu device, as PyTorch's own CUDA initializes lazily."""
    wanted = hologram.config.get().torch_backend
    gpus = [name for name in ("cuda", "webgpu")
            if backends.backend_class(name).may_be_available()]
    if wanted in DEVICE_MEMORY_BACKENDS or (wanted == "auto" and gpus):
        # (until resolved: no host launches)
        _state["backend"], _HOST[0] = wanted if wanted != "auto" else gpus[0], False
        native.set_front(False)
        memory.defer(lambda: _resolve(wanted))
        return
    try:
        _select(_choose(wanted))
    except HologramError as e:
        warnings.warn(f"HOLOGRAM_TORCH_BACKEND={wanted}: {e}; the device uses 'auto'",
                      stacklevel=2)
        _select(_choose("auto"))


def _resolve(wanted: str) -> None:
    """The backend chosen at import (``wanted``: a GPU backend or auto), probed now. A GPU
    backend that cannot run here gives the host backend, with a warning where it was
    named."""
    try:
        _select(_choose(wanted))
    except HologramError as e:
        host = _host_choice()
        warnings.warn(f"HOLOGRAM_TORCH_BACKEND={wanted}: {e}; the device uses {host}",
                      stacklevel=4)
        _select(host)


class _Scalars:
    """Device copies of scalar operands (numbers, CPU scalars) by their bytes, on device
    memory: a training loop's constants (learning rate, betas, 0.5, 2) are copied to the
    device once, not per launch. A copy from the host waits for the stream's work
    (``cuMemcpyHtoD`` from pageable memory), so a new value is a synchronization.

    The copies live in :data:`SLOTS` slots of one block, taken when the device's memory
    is chosen, and are reused least recently used first. Never a block of their own at a
    cut: a recorded region may still write the block of a temporary that died before the
    cut, which the allocator would hand out again. A region uses fewer values than there
    are slots, so its own values stay put while it runs. Threads share the slots: a lock
    keeps two new values from taking one slot."""

    SLOTS, SLOT = 4096, 16  # 16: the kernels assume 16-byte aligned pointers

    def __init__(self) -> None:
        self.block: torch.UntypedStorage | None = None
        self.slots: OrderedDict[bytes, int] = OrderedDict()
        self.lock = threading.Lock()

    def reserve(self) -> None:
        if self.block is None:
            self.block = memory.storage(self.SLOTS * self.SLOT)

    def address(self, value: bytes) -> int:
        with self.lock:
            slot = self.slots.get(value)
            if slot is None:
                self.reserve()
                full = len(self.slots) >= self.SLOTS
                slot = self.slots.popitem(last=False)[1] if full else len(self.slots)
                self.slots[value] = slot
                memory.write(self.block.data_ptr() + slot * self.SLOT,
                             np.frombuffer(value, np.uint8))
            else:
                self.slots.move_to_end(value)
            return self.block.data_ptr() + slot * self.SLOT


_scalars = _Scalars()
#: The device address of a copy of a scalar operand's bytes (on device memory).
device_scalar = _scalars.address
_select_at_import()


def stage_host_operands(args: Sequence, addresses: list) -> None:
    """On device memory: ``addresses`` with each host operand's (a boxed number, a CPU 0-d
    tensor) replaced by the address of a device copy of its value."""
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor):
            if x.is_cpu:
                addresses[i] = device_scalar(memory.host_bytes(x.contiguous()).tobytes())
        else:
            addresses[i] = device_scalar(bytes(_NUMBER[type(x)][1](x)))


def remember(shortcut: tuple, name: str, static: tuple, args: Sequence,
             result: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> None:
    """File the entry :func:`run` just used for ``(name, static, args)`` (device tensors;
    fresh results, or ``out``) under ``shortcut``, a key the caller forms from its own
    operands (and, with ``out``, the layout of ``out``: its launch writes there), and with
    the native front kernel running this call, if any (``result``: what the launch
    produced, :func:`native.file_fast`)."""
    if not _fileable(args):
        return
    entry = used_entry(name, static, args, out)
    if entry is not None and entry.single and (out is None or entry.launch is not None):
        shortcuts.put(shortcut, entry)
        native.file_fast(entry, tuple(args), result)


def file_front(name: str, static: tuple, args: Sequence, outs: tuple,
               given: bool = False, checks: tuple = ()) -> None:
    """File the call the front kernel on this thread runs, if any, as the launch :func:`run`
    just made for ``(name, static, args)`` into ``outs``: its fresh results, or with
    ``given`` the ``out`` it was given (results made by the caller and arguments written
    in place); the op returns some of them, or None in place of others (a masked-off
    gradient) (:func:`native.file_fast`, with its index ``checks``). For ops whose
    kernel's decision depends only on the call's signature and on those checks."""
    if FRONT and _fileable(args):
        entry = used_entry(name, static, args, outs if given else None)
        if entry is not None:
            native.file_fast(entry, tuple(args), tuple(outs), checks)


def _fileable(args: Sequence) -> bool:
    """Are these a filed call's kind of operands: device tensors and numbers only?"""
    return all(type(x) in _NUMBER if not isinstance(x, torch.Tensor) else not x.is_cpu
               for x in args)


def used_entry(name: str, static: tuple, args: Sequence,
               out: Sequence[torch.Tensor] | None = None) -> _Entry | None:
    """The entry :func:`run` used (or would use) for these arguments, if compiled."""
    key = [name, static, _state["backend"], False]
    for x in args:
        if isinstance(x, torch.Tensor):
            key.append((x.dtype,) if x.is_cpu else (x.dtype, x.shape, x.stride()))
        else:
            key.append(type(x))
    if out is not None:
        key.append(tuple((o.dtype, o.shape, o.stride()) for o in out))
    return _LAUNCHES.get(tuple(key))


def launch_fresh(entry: _Entry, args: Sequence) -> torch.Tensor:
    """Run a remembered entry on ``args`` (device tensors, the last of them possibly a
    number, as :func:`run` takes them) into a fresh result."""
    out = memory.new(*entry.layouts[0])
    if entry.launch is not None:
        if _LAZY["on"]:
            lazy.record(entry, args, (out,), False)
        else:
            _launch_remembered(entry, args, out)
    if FRONT:  # a front kernel that lost its entries (bounded tables, a new backend)
        native.file_fast(entry, tuple(args), out)
    return out


def launch_into(entry: _Entry, args: Sequence, out: torch.Tensor) -> None:
    """Run a remembered entry on ``args`` (device tensors, the last of them possibly a
    number) into ``out``, the tensor it was remembered writing (in place)."""
    if _LAZY["on"]:
        lazy.record(entry, args, (out,), True)
    else:
        _launch_remembered(entry, args, out)
    if FRONT:  # see launch_fresh
        native.file_fast(entry, tuple(args), out)


def _launch_remembered(entry: _Entry, args: Sequence, out: torch.Tensor) -> None:
    if type(args[-1]) in _NUMBER:  # boxed; the box must outlive the launch
        box = _NUMBER[type(args[-1])][1](args[-1])
        # (on device memory, the address of the value's device copy)
        number = ctypes.addressof(box) if _HOST[0] else device_scalar(bytes(box))
        entry.launch((*[x.data_ptr() for x in args[:-1]], number, out.data_ptr()))
    else:
        entry.launch((*[x.data_ptr() for x in args], out.data_ptr()))


def supported(*tensors: torch.Tensor) -> bool:
    return all(t.dtype in ISA for t in tensors)


def lacking(*tensors: torch.Tensor) -> bool:
    """Does the device's backend lack one of these tensors' dtypes (f64 on webgpu)? For
    kernels that must decide before they run anything (several programs, a random draw):
    the CPU fallback that follows is counted as one for a lacking dtype."""
    lacks = _state["lacks"]
    if any(t.dtype in lacks for t in tensors):
        fallback.lacked()
        return True
    return False


def run(name: str, build: Callable, args: Sequence, static: tuple = (),
        out: Sequence[torch.Tensor] | None = None, host: bool = False,
        layout: Callable | None = None):
    """Compute ``build(graph, *args-as-graph-tensors, *static)`` on ``args``.

    Returns the result tensor (or a tuple, when the builder returns one): fresh tensors
    (laid out by ``layout``), or ``out`` (whose shapes must be the results' shapes; values
    are cast to the out dtypes). ``out`` may alias inputs element for element (in-place
    elementwise ops); other overlaps must be staged by the caller. Raises
    :class:`Unsupported` for operands no kernel can take (the caller falls back to the
    CPU).

    ``host``: the operands are CPU tensors, computed on in place (zero-copy), and fresh
    results are CPU tensors (:mod:`hologram_torch.functional` on CPU tensors). Otherwise
    CPU tensors are 0-d scalars mixed with device tensors.

    ``layout``: how fresh device results are laid out, ``layout(args, static, shapes)``
    returning each result's strides (or None: contiguous), called once per compiled
    signature (see :mod:`.layout`); by default they are contiguous. It must be a function
    of ``name`` and ``static`` (the key holds those, not ``layout``).
    """
    # The hot path of every device op: one pass over the arguments builds the signature
    # key and the launch addresses (numbers are boxed; the boxes must outlive the launch).
    key = [name, static, _state["backend"], host]
    addresses = []
    boxes = []
    for x in args:
        if isinstance(x, torch.Tensor):
            key.append((x.dtype,) if not host and x.is_cpu else
                       (x.dtype, x.shape, x.stride()))
            addresses.append(x.data_ptr())
        else:
            kind = type(x)
            key.append(kind)
            box = _NUMBER[kind][1](x) if kind in _NUMBER else None
            boxes.append(box)
            addresses.append(ctypes.addressof(box) if box is not None else 0)
    if out is not None:
        key.append(tuple((o.dtype, o.shape, o.stride()) for o in out))
    key = tuple(key)
    entry = _recent(key) or _LAUNCHES.get(key)
    if entry is None:
        refused = _refused.get(key)
        if refused is not None:  # (no program again: the backend still lacks the dtype)
            fallback.lacked()
            raise Lacking(refused)
        try:
            entry = _compile(name, build, args, static, out, host, layout)
        except Lacking as e:
            if len(_refused) >= CACHE_ENTRIES:
                _refused.clear()
            _refused[key] = str(e)
            raise
        entry.key, entry.name, entry.build, entry.static = key, name, build, static
        entry = _LAUNCHES.put(key, entry)
    given = out is not None
    if out is None:
        out = [memory.new(*fresh) if not host else torch.empty(fresh[0], dtype=fresh[3])
               for fresh in entry.layouts]
    if entry.launch is not None:
        if _LAZY["on"] and not host:
            lazy.record(entry, args, out, given)
        else:
            for o in out:
                addresses.append(o.data_ptr())
            if not (_HOST[0] or host):  # (host: CPU tensors, computed on in place)
                stage_host_operands(args, addresses)
            entry.launch(tuple(addresses))
    return out[0] if entry.single else tuple(out)


def _compile(name: str, build: Callable, args: Sequence, static: tuple,
             out: Sequence[torch.Tensor] | None, host: bool,
             layout: Callable | None = None) -> _Entry:
    g = Graph(name.replace(".", "_"))
    inputs = []
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor):
            if x.dtype not in ISA:
                raise Unsupported(f"{name}: dtype {x.dtype}")
            if x.dim() > MAX_NDIM:  # (torch takes more; its CPU kernel then runs)
                raise Unsupported(f"{name}: {x.dim()} dimensions")
            if x.is_cpu and not host:
                if x.dim() != 0:
                    raise HologramError(
                        f"{name}: a CPU tensor of shape {list(x.shape)} cannot be mixed with "
                        "hologram tensors (only 0-d CPU scalars can); move it with "
                        ".to('hologram')")
                inputs.append(g.input(f"x{i}", ISA[x.dtype], ()))
            else:
                inputs.append(g.strided_input(f"x{i}", ISA[x.dtype], tuple(x.shape),
                                              tuple(x.stride())))
        else:
            if type(x) not in _NUMBER:  # complex, or not a number at all
                raise Unsupported(f"{name}: argument {x!r}")
            inputs.append(g.input(f"x{i}", _NUMBER[type(x)][0], ()))
    result = build(g, *inputs, *static)
    single = isinstance(result, Tensor)
    results = (result,) if single else tuple(result)
    if out is None:
        strides = None
        if layout is not None and not host:
            strides = layout(args, static, [r.shape for r in results])
        strides = strides or [None] * len(results)
        layouts = [(r.shape, r.dtype, None if s is None or s == layout_.contiguous(r.shape)
                    else tuple(s)) for r, s in zip(results, strides)]
    else:
        if len(out) != len(results):
            raise HologramError(f"{name}: {len(results)} results for {len(out)} outputs")
        layouts = []
        for r, o in zip(results, out):
            if o.dtype not in ISA:
                raise Unsupported(f"{name}: out dtype {o.dtype}")
            if tuple(o.shape) != r.shape:
                raise HologramError(f"{name}: result {list(r.shape)} does not fit out "
                                    f"{list(o.shape)}")
            layouts.append((r.shape, ISA[o.dtype], tuple(o.stride())))
    outs = tuple((shape, TORCH[dtype], strides) for shape, dtype, strides in layouts)
    if all(math.prod(shape) == 0 for shape, _, _ in layouts):
        return _Entry(None, outs, single)
    for j, (r, (_, dtype, strides)) in enumerate(zip(results, layouts)):
        r = r if r.dtype is dtype else g.cast(r, dtype)
        g.output(f"out{j}", r, strides)
    # The op waits for its kernel: the cache entry is written on a background thread.
    with deferred_writes():
        # (CPU tensors computed on in place: on host memory, whatever the device's is)
        compiled = compile_program(g.program(), "cpu" if host and not _HOST[0]
                                   else backend())
    return _Entry(compiled.launch, outs, single)


def compile_program(program, backend_name: str):
    """``hologram.compile(program, backend_name)``, loaded; :class:`Unsupported` where the
    backend cannot run it (webgpu: f64 and i64 products; a CPU emulation's loop limit),
    so that the op runs through the CPU fallback."""
    try:
        compiled = hologram.compile(program, backend_name)  # (loaded: pipelines made)
    except (DTypeError, CompileError) as e:
        if backend_name not in DEVICE_MEMORY_BACKENDS:  # (the host backends take it all)
            raise
        if isinstance(e, DTypeError):
            fallback.lacked()
            raise Lacking(f"{program.name}: {e}") from e
        raise Unsupported(f"{program.name}: {e}") from e
    return compiled


def run_on(backend_name: str, name: str, build: Callable, args: Sequence,
           static: tuple = ()):
    """Compute ``build(graph, *args-as-graph-tensors, *static)`` on a backend whose memory
    the host cannot see (webgpu, cuda): the operands are copied into its memory and the
    results back (a compiled program called on NumPy arrays does both), and the results
    are contiguous tensors on the first operand's device. The program cache keeps the
    compiled program by its canonical form, so a repeated call compiles nothing."""
    g = Graph(name.replace(".", "_"))
    inputs, arrays, device = [], [], None
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor):
            if x.dtype not in ISA:
                raise Unsupported(f"{name}: dtype {x.dtype}")
            device = device or x.device
            inputs.append(g.input(f"x{i}", ISA[x.dtype], tuple(x.shape)))
            arrays.append(_to_numpy(x))
        else:
            if type(x) not in _NUMBER:
                raise Unsupported(f"{name}: argument {x!r}")
            t = _NUMBER[type(x)][0]
            inputs.append(g.input(f"x{i}", t, ()))
            arrays.append(np.array(x, dtype=t.storage))
    result = build(g, *inputs, *static)
    single = isinstance(result, Tensor)
    results = (result,) if single else tuple(result)
    for j, r in enumerate(results):
        g.output(f"out{j}", r)
    got = hologram.compile(g.program(), backend_name)(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    out = tuple(_from_numpy(a, r.dtype).to(device) for a, r in zip(got, results))
    return out[0] if single else out


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    x = x.detach().cpu().contiguous()
    if x.dtype is torch.bfloat16:  # NumPy has no bfloat16: its bits, as Atlas stores them
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


def _from_numpy(a: np.ndarray, dtype: dt.DType) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if dtype is dt.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# --- helpers for builders ---------------------------------------------------------------

def opmath(dtype: dt.DType) -> dt.DType:
    """The dtype torch computes a float dtype's arithmetic in (half types in float32)."""
    return dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype


def cast(t: Tensor, dtype: dt.DType) -> Tensor:
    return t if t.dtype is dtype else t.graph.cast(t, dtype)
