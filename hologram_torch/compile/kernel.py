"""One partition of an ATen graph run as one Hologram program.

:class:`FusedKernel` replaces a partition's submodule. On the first call with a
*signature* (every tensor's dtype, shape, strides and device type, and the value of every
integer or float argument, which is how dynamic dimensions arrive) it interprets the
submodule's FX graph on :class:`hologram.frontend.graph.Graph` tensors, node by node
through the lowering table, and compiles the resulting program through
:func:`hologram.compile` (the program cache, memory and disk, keyed by canonical form). The
launch is filed in the process's launch cache (:func:`hologram.runtime.launch.launch_cache`,
the one the SDK's ops, ``hg.jit`` and the eager device use) under the partition and the
signature; later calls cost the key, the outputs' allocation and one native call.

Inputs are read where they are (CPU tensors, ``hologram`` tensors in host memory, or in a
GPU's memory on the cuda and webgpu backends): their addresses and real strides go into
the program, so views and expanded tensors cost no copy. On a GPU the program is the
device backend's, and a CPU scalar among its inputs (a 0-d tensor) is read from the
device's copy of its value (as eagerly: ``runner.stage_host_operands``). Outputs are
fresh tensors on the inputs' device, written in the layout the graph expects (its meta
strides when dense, else contiguous).

A signature whose program cannot be built runs the submodule as PyTorch would, and is
counted (``eager_fallbacks``): a graph never fails for a lowering's sake.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import time
import weakref
from dataclasses import dataclass

import torch
import torch.fx

import hologram
from hologram import backends
from hologram.errors import HologramError
from hologram.frontend.graph import Graph, Tensor
from hologram.runtime.launch import launch_cache
from hologram_torch import lazy, memory
from hologram_torch.aten import runner
from hologram_torch.compile import graph_lowerings, stats
from hologram_torch.compile.options import Options
from hologram_torch.lowering.common import ISA, TORCH, Unsupported

aten = torch.ops.aten

log = logging.getLogger(__name__)

_LAUNCHES = launch_cache()


@dataclass(frozen=True)
class _Entry:
    launch: object  # CompiledProgram.launch, or None when every output is empty
    outputs: tuple  # (shape, strides, dtype, contiguous, device or None) of each output
    tensors: tuple  # the positions of the tensor arguments (the program's inputs)
    #: Per pair of trailing 0-d outputs (a bool: an index is out of range; an int64: the
    #: first such index): the error raised, its message with ``{value}`` for that index.
    checks: tuple = ()
    #: Does the program run on a GPU's memory (its CPU scalars read from device copies)?
    on_device: bool = False

    def __post_init__(self):
        # One ready allocator per output: a launch calls them without re-reading layouts.
        object.__setattr__(self, "allocators", tuple(_allocator(*o) for o in self.outputs))


_EAGER = object()  # a signature that runs the submodule eagerly


class _Owner:
    """The first element of a partition's keys in the launch cache (compared by identity,
    so two partitions' signatures never meet)."""

    __slots__ = ()


class FusedKernel(torch.nn.Module):
    """A partition's FX submodule, run as one Hologram program per signature."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, options: Options):
        super().__init__()
        self.gm = gm
        self.name = name
        self.options = options
        # Keys of the launch cache start with this token: it owns no launch itself, and
        # the partition's entries leave the cache with the partition.
        self._owner = owner = _Owner()
        weakref.finalize(self, _LAUNCHES.discard, lambda key: key[0] is owner)
        self._builds = 0
        self._single = not isinstance(_output_node(gm).args[0], (tuple, list))

    def forward(self, *args):
        key = (self._owner, *_signature(args))
        entry = _LAUNCHES.recent(key) or _LAUNCHES.get(key)
        if entry is None:
            entry = self._build(key, args)
        if entry is _EAGER:
            return self.gm(*args)
        return self._launch(entry, args)

    def _launch(self, entry: _Entry, args):
        lazy.sync("compiled graph")  # its inputs may be pending recorded results
        addresses = [args[i].data_ptr() for i in entry.tensors]
        if entry.on_device:
            runner.stage_host_operands([args[i] for i in entry.tensors], addresses)
        outs = [allocate() for allocate in entry.allocators]
        if entry.checks:
            self._run(entry, addresses, outs)
            first = len(outs) - 2 * len(entry.checks)
            for j, (error, message) in enumerate(entry.checks):
                if outs[first + 2 * j].item():
                    raise error(message.format(value=outs[first + 2 * j + 1].item()))
            del outs[first:]
        else:
            self._run(entry, addresses, outs)
        return outs[0] if self._single else tuple(outs)

    def _run(self, entry: _Entry, addresses: list, outs: list) -> None:
        if entry.launch is not None:
            addresses.extend(o.data_ptr() for o in outs)
            threads = self.options.threads
            if threads is None:
                entry.launch(tuple(addresses))
            else:  # the process's setting is put back (as an explicit count)
                previous = hologram.get_num_threads()
                hologram.set_num_threads(threads)
                try:
                    entry.launch(tuple(addresses))
                finally:
                    hologram.set_num_threads(previous)

    def _build(self, key: tuple, args) -> _Entry | object:
        start = time.perf_counter()
        try:
            entry = build(self.gm, self.name, args, self.options)
        except (Unsupported, HologramError) as e:
            log.info("hologram: %s runs eagerly for this signature: %s", self.name, e)
            stats.add("eager_fallbacks")
            entry = _EAGER
        except Exception:  # a bug of ours must not fail the user's model: logged, eager
            log.warning("hologram: %s runs eagerly, building its program failed", self.name,
                        exc_info=True)
            stats.add("eager_fallbacks")
            entry = _EAGER
        else:
            stats.add("programs")
            if self._builds:
                stats.add("recompiles")
            self._builds += 1
        stats.add_time(time.perf_counter() - start)
        return _LAUNCHES.put(key, entry)


def _signature(args, tensor=torch.Tensor) -> tuple:
    """What a program is specialized on: each tensor's dtype, sizes, strides and device,
    each number's type and value. Computed on every call (it is most of the calling cost
    of a small region), so one comprehension with the fewest attribute reads."""
    return tuple([(a.dtype, a.size(), a.stride(), a.device) if isinstance(a, tensor)
                  else (type(a), a) for a in args])


def _allocator(shape, strides, dtype, contiguous, device):
    """A function of no arguments returning a new, uninitialized output tensor."""
    if device is not None:  # a hologram tensor
        if contiguous:
            nbytes = math.prod(shape) * dtype.itemsize
            return functools.partial(memory.new, list(shape), None, nbytes, dtype)
        return functools.partial(torch.empty_strided, shape, strides, dtype=dtype,
                                 device=device)
    return functools.partial(torch.empty_strided, shape, strides, dtype=dtype)


def _output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def build(gm: torch.fx.GraphModule, name: str, args, options: Options) -> _Entry:
    """Lower ``gm`` on the concrete arguments ``args`` into one program and compile it."""
    on_gpu = not memory.host_memory() and any(
        isinstance(a, torch.Tensor) and not a.is_cpu for a in args)
    backend = options.backend(on_gpu)
    if on_gpu:  # the program addresses the device's memory: the device's backend only
        if backend != runner.backend():
            raise Unsupported(f"the graph's hologram tensors are in the {runner.backend()} "
                              f"backend's memory, which backend {backend!r} cannot address")
        if any(isinstance(a, torch.Tensor) and a.is_cpu and a.dim() for a in args):
            raise Unsupported("a CPU tensor that is not a scalar among tensors in a GPU's "
                              "memory")
    elif not backends.get(backend).allocator().host_visible:
        raise Unsupported(f"backend {backend!r} computes on memory the host cannot see, and "
                          "the graph's tensors are in host memory")
    g = Graph(name)
    env: dict[torch.fx.Node, object] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise HologramError(f"{name}: {len(args)} arguments for {len(placeholders)} inputs")
    for i, (node, a) in enumerate(zip(placeholders, args)):
        if isinstance(a, torch.Tensor):
            if a.dtype not in ISA:
                raise Unsupported(f"input dtype {a.dtype}")
            env[node] = g.strided_input(f"x{i}", ISA[a.dtype], tuple(a.shape),
                                        tuple(a.stride()))
        else:
            env[node] = a
    checks = []  # (0-d bool: an index is out of range, 0-d int64: the first, the error)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            env[node] = lower_node(g, node, env)
            checks += [(*_first_bad(g, bad, index), error)
                       for bad, index, error in _index_checks(g, node, env)]
        elif node.op not in ("placeholder", "output"):
            raise Unsupported(f"{node.op} node {node.name}")
    out = _output_node(gm).args[0]
    results = out if isinstance(out, (tuple, list)) else (out,)
    # Outputs go where the graph says they are (a CPU 0-d constant among hologram tensors
    # does not make the results CPU tensors); without meta, where the first input is.
    default = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    layouts = []
    for node in results:
        value = env[node]
        if not isinstance(value, Tensor):
            raise Unsupported(f"output {node} is not a tensor")
        dtype, strides = _expected_layout(node, value)
        target = ISA[dtype]
        if value.dtype is not target:
            value = g.cast(value, target)
        contiguous = strides == tuple(memory.contiguous_strides(value.shape))
        meta = node.meta.get("val")
        device = meta.device if isinstance(meta, torch.Tensor) else default
        device = None if device is None or device.type == "cpu" else device
        if on_gpu and device is None:
            raise Unsupported(f"output {node} is a CPU tensor of a program on a GPU")
        layouts.append((value.shape, strides, dtype, contiguous, device, value))
    tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    if all(math.prod(shape) == 0 for shape, *_ in layouts):
        return _Entry(None, tuple(layout[:5] for layout in layouts), tensors)
    for j, (_, strides, _, contiguous, _, value) in enumerate(layouts):
        g.output(f"out{j}", value, None if contiguous else strides)
    checked = default if on_gpu else None  # (the program writes them: on the GPU too)
    for j, (flag, value, _) in enumerate(checks):
        g.output(f"check{j}", flag)
        g.output(f"check{j}_index", value)
        layouts += [((), (), torch.bool, True, checked), ((), (), torch.int64, True, checked)]
    compiled = hologram.compile(g.program(), backend, options.compile_options())
    return _Entry(compiled.launch, tuple(layout[:5] for layout in layouts), tensors,
                  tuple(error for *_, error in checks), on_gpu)


def _first_bad(g: Graph, bad: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """(whether any element of ``bad`` is set, ``index`` where the first one is, int64)."""
    flag, value = g.first_where(bad, index)
    return flag, value if value.dtype.name == "i64" else g.cast(value, "i64")


#: Writes by index whose index (argument 2) must lie in [0, size) along ``dim`` (argument
#: 1), and the error eager PyTorch raises otherwise.
_WRITES_ALONG_DIM = {
    **dict.fromkeys((aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
                     aten.scatter.value_reduce, aten.scatter_add.default,
                     aten.scatter_reduce.two, aten.index_add.default), RuntimeError),
    aten.index_copy.default: IndexError,
}
#: Those whose index may also count from the end ([-size, size)).
_FROM_THE_END = (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
_NLL_LOSS = (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)


def _index_checks(g: Graph, node: torch.fx.Node, env: dict) -> list[tuple[Tensor, Tensor,
                                                                           tuple]]:
    """For a lookup by index (``embedding``, ``index.Tensor``, ``index_select``,
    ``gather``, ``nll_loss``'s class) or a write by index (the scatter family,
    ``index_add``, ``index_copy``, ``index_fill``, ``index_put``): per index tensor, a
    bool tensor of its shape set where a value is out of range, the index tensor, and the
    error eager PyTorch raises then (its type, and its message with ``{value}`` for the
    first such value). The program's gathers and scatters clamp such indices
    (docs/isa.md); the kernel raises after the launch instead of returning what they read
    or wrote. Other nodes: none."""
    target, a = node.target, node.args

    def along(dim_arg: int, index_arg: int, counts_from_end: bool, error: type):
        src = env[a[0]]
        dim = a[dim_arg] % max(src.ndim, 1)
        size = src.shape[dim] if src.ndim else 1
        return [(a[index_arg], size, -size if counts_from_end else 0, None,
                 (error, f"index {{value}} is out of bounds for dimension {dim} with size "
                         f"{size}"))]

    if target is aten.embedding.default:
        lookups = [(a[1], env[a[0]].shape[0], 0, None,
                    (IndexError, "index out of range in self"))]
    elif target is aten.gather.default:  # no index counts from the end (eager's check)
        lookups = along(1, 2, False, RuntimeError)
    elif target is aten.index_select.default:
        # no index from the end here either; eager's CPU kernel for dim 1 has its own error
        src = env[a[0]]
        dim = a[1] % max(src.ndim, 1)
        size = src.shape[dim] if src.ndim else 1
        error = ((RuntimeError, f"INDICES element is out of DATA bounds, id={{value}} "
                                f"axis_dim={size}") if dim == 1 and src.ndim > 1
                 else (IndexError, "index out of range in self"))
        lookups = [(a[2], size, 0, None, error)]
    elif target in _NLL_LOSS:  # (self, target, weight, reduction, ignore_index)
        x = env[a[0]]
        lookups = [(a[1], x.shape[min(x.ndim, 2) - 1], 0, a[4],
                    (IndexError, "Target {value} is out of bounds."))]
    elif target in _WRITES_ALONG_DIM:
        lookups = along(1, 2, False, _WRITES_ALONG_DIM[target])
    elif target in _FROM_THE_END:
        lookups = along(1, 2, True, IndexError)
    elif target in (aten.index.Tensor, aten.index_put.default, aten._index_put_impl.default):
        src = env[a[0]]
        lookups = [(i, src.shape[d], -src.shape[d], None, (IndexError,
                    f"index {{value}} is out of bounds for dimension {d} with size "
                    f"{src.shape[d]}"))
                   for d, i in enumerate(a[1]) if i is not None]
    else:
        return []
    checks = []
    for index, size, low, allowed, error in lookups:
        idx = env.get(index) if isinstance(index, torch.fx.Node) else None
        if isinstance(idx, Tensor) and idx.dtype.is_int and math.prod(idx.shape):
            bad = g.binary("or", g.binary("lt", idx, low), g.binary("ge", idx, size))
            if allowed is not None:  # nll_loss's ignore_index
                bad = g.binary("and", bad, g.binary("ne", idx, allowed))
            checks.append((bad, idx, error))
    return checks


def _expected_layout(node: torch.fx.Node, value: Tensor) -> tuple[torch.dtype, tuple]:
    """The output's dtype and strides: the graph's (meta) when they are concrete and dense,
    so downstream eager code sees eager's layout; else the lowering's dtype, contiguous."""
    contiguous = tuple(memory.contiguous_strides(value.shape))
    meta = node.meta.get("val")
    if not isinstance(meta, torch.Tensor):
        return TORCH[value.dtype], contiguous
    dtype = meta.dtype
    if dtype not in ISA:
        raise Unsupported(f"output dtype {dtype}")
    try:
        shape = tuple(int(n) for n in meta.shape)
        strides = tuple(int(s) for s in meta.stride())
    except (TypeError, ValueError):  # symbolic
        return dtype, contiguous
    if shape != value.shape:
        if all(isinstance(n, int) for n in meta.shape):
            raise HologramError(f"{node.name}: lowered to shape {list(value.shape)}, the "
                                f"graph says {list(shape)}")
        return dtype, contiguous
    if math.prod(shape) and torch._prims_common.is_non_overlapping_and_dense_or_false(meta):
        return dtype, strides
    return dtype, contiguous


def lower_node(g: Graph, node: torch.fx.Node, env: dict):
    """The graph value(s) of one ``call_function`` node, its inputs already in ``env``."""
    args = torch.fx.node.map_arg(node.args, env.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
    if node.target is operator.getitem:
        value, index = args
        if value[index] is None:
            raise Unsupported(f"{node.name}: an absent result")
        return value[index]
    if not isinstance(node.target, torch._ops.OpOverload):
        raise Unsupported(f"{node.target} is not an ATen op")
    return graph_lowerings.lower(node.target, g, *args, **kwargs)
