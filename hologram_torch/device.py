"""``torch.hologram``: the device module, mirroring ``torch.cuda``, and the registration of
PrivateUse1 as ``hologram``.

The device's kernels are compiled by the Hologram backend chosen with
``HOLOGRAM_TORCH_BACKEND`` or :func:`hologram_torch.set_backend`, and its memory is that
backend's (:mod:`hologram_torch.memory`): host memory from a Hologram pool on the cpu
backend (and the reference interpreter), whose kernels run synchronously; GPU memory on
the cuda backend, whose kernels are queued in order on one stream (:func:`synchronize`
waits for them). There is one device, ``hologram:0``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
import warnings

import torch

from hologram.errors import DeviceError
from hologram_torch import native
from hologram_torch.constants import NAME


def _check_torch() -> None:
    # The Python PrivateUse1 hooks and device guard arrived with torch 2.9-ish and are
    # marked experimental: check for them rather than trusting a version number.
    from torch.utils import backend_registration as registration

    if not (hasattr(torch._C, "_acc")
            and hasattr(registration, "_setup_privateuseone_for_python_backend")):
        raise DeviceError(f"hologram_torch needs torch 2.13 (found {torch.__version__}), "
                          "whose Python PrivateUse1 hooks it builds on; install "
                          "'torch>=2.13,<2.14'")


# --- the device module ------------------------------------------------------------------

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    pass


_count = [1]  # the devices (HOLOGRAM_TORCH_DEVICES on host memory; set_device_count)


def set_device_count(count: int) -> None:
    """Record the devices the backend's choice made (``hologram_torch.aten.runner``)."""
    _count[0] = count


def device_count() -> int:
    return _count[0]


def current_device() -> int:
    return native.current_device() if _count[0] > 1 else 0


class InvalidDeviceError(DeviceError, RuntimeError):
    """A device index other than 0: a RuntimeError, as CUDA's 'invalid device ordinal'
    (``torch.cuda.set_device(1)`` on a machine with one GPU), and a :class:`DeviceError`."""


class WrongDeviceTypeError(DeviceError, ValueError):
    """Another device type where a hologram device is expected: a ValueError, as
    ``torch.cuda.set_device('cpu')`` raises."""


def invalid_ordinal(device: object) -> InvalidDeviceError:
    """The error for ``device`` (a ``torch.device`` or ``hologram:i``), an index past the
    devices."""
    count = _count[0]
    there = (f"there is one {NAME} device, {NAME}:0" if count == 1 else
             f"there are {count} {NAME} devices, {NAME}:0 to {NAME}:{count - 1}")
    return InvalidDeviceError(f"{NAME} error: invalid device ordinal: {device} does not "
                              f"exist; {there} (HOLOGRAM_TORCH_DEVICES=N makes N of them "
                              "on host memory)")


def _index(device: object) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != NAME:
            raise WrongDeviceTypeError(f"expected a {NAME} device, got {device}; pass "
                                       f"'{NAME}' or '{NAME}:0'")
        index = current_device() if device.index is None else device.index
    if not 0 <= index < _count[0]:
        raise invalid_ordinal(f"{NAME}:{index}")
    return index


def set_device(device: object) -> None:
    """Make ``device`` this thread's current device: where tensors made without an index
    go (``device='hologram'``), as ``torch.cuda.set_device``."""
    index = _index(device)
    if _count[0] > 1:
        native.set_current_device(index)  # torch's device guard answers it


def get_device_name(device: object = None) -> str:
    _index(device)
    from hologram_torch.aten import runner  # lazy: it needs the registered device

    return f"Hologram ({runner.backend()} backend)"


class DeviceProperties(types.SimpleNamespace):
    """What :func:`get_device_properties` tells: ``name``, ``total_memory`` (bytes) and
    ``multi_processor_count``: on host memory, the host's memory and CPUs; on a GPU, the
    GPU's (its driver's answers)."""


def get_device_properties(device: object = None) -> DeviceProperties:
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    driver = getattr(memory.allocator(), "driver", None)
    if driver is not None:
        found = driver.properties()
        return DeviceProperties(**{**found, "name": f"{get_device_name()}: {found['name']}"})
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not every platform names them
        total = 0
    return DeviceProperties(name=get_device_name(), total_memory=total,
                            multi_processor_count=os.cpu_count() or 1)


class device(contextlib.AbstractContextManager):
    """``with torch.hologram.device(1):`` — makes that device current in the block (as
    ``torch.cuda.device``); checks the index."""

    def __init__(self, device: object = None):
        self.idx = _index(device)
        self.prev = 0

    def __enter__(self) -> device:
        self.prev = current_device()
        set_device(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        set_device(self.prev)
        return None


def synchronize(device: object = None) -> None:
    """Run the recorded ops still pending (:mod:`hologram_torch.lazy`), and wait for the
    kernels and copies queued on every stream of a GPU backend (on host memory kernels
    run synchronously, so nothing else is ever pending)."""
    _index(device)
    from hologram_torch import streams  # lazy: it needs the registered device

    streams.synchronize()


def manual_seed(seed: int) -> None:
    """Random ops on the device draw from torch's CPU generator (the Python device
    interface cannot provide a device generator), so the CPU seed is the device's seed."""
    torch.random.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    # torch.manual_seed calls this after seeding the CPU generator: nothing more to do.
    pass


def seed() -> None:
    torch.random.default_generator.seed()


def seed_all() -> None:
    pass


def initial_seed() -> int:
    return torch.random.default_generator.initial_seed()


def get_rng_state(device: object = None) -> torch.Tensor:
    return torch.random.default_generator.get_state()


def set_rng_state(state: torch.Tensor, device: object = None) -> None:
    torch.random.default_generator.set_state(state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def memory_allocated(device: object = None) -> int:
    """Bytes held by live tensors (blocks, rounded to their size class)."""
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    return memory.stats()["allocated_bytes"]


def max_memory_allocated(device: object = None) -> int:
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    return memory.stats()["peak_allocated_bytes"]


def memory_reserved(device: object = None) -> int:
    """Bytes the memory holds from the OS or the driver (live blocks plus its cache)."""
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    return memory.stats()["reserved_bytes"]


def memory_stats(device: object = None) -> dict:
    """The memory's counters (see :meth:`hologram.backends.hostmem.Pool.stats`, on a GPU
    :meth:`hologram.backends.cuda.runtime.DeviceMemory.stats`), plus the
    ``torch.cuda``-style names ``allocated_bytes.all.current``, ``.peak`` and
    ``reserved_bytes.all.current``."""
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    stats = memory.stats()
    stats["allocated_bytes.all.current"] = stats["allocated_bytes"]
    stats["allocated_bytes.all.peak"] = stats["peak_allocated_bytes"]
    stats["reserved_bytes.all.current"] = stats["reserved_bytes"]
    return stats


def reset_peak_memory_stats(device: object = None) -> None:
    _index(device)
    from hologram_torch import memory  # lazy: it needs the registered device

    memory.allocator().reset_peak_stats()


def empty_cache() -> None:
    """Return the memory's cached (free) blocks to the OS or the driver."""
    from hologram_torch import memory  # lazy: it needs the registered device

    memory.empty_cache()


_MODULE_FUNCTIONS = (
    is_available, is_initialized, _is_in_bad_fork, _lazy_init, device_count, current_device,
    set_device, get_device_name, get_device_properties, device, synchronize, manual_seed,
    manual_seed_all, seed, seed_all, initial_seed, get_rng_state, set_rng_state,
    get_amp_supported_dtype, memory_allocated, max_memory_allocated, memory_reserved,
    memory_stats, reset_peak_memory_stats, empty_cache,
)


#: What the module takes from :mod:`hologram_torch.streams` on first use (it needs the
#: registered device); ``from_dlpack`` comes from :mod:`hologram_torch.dlpack`.
_STREAM_NAMES = ("Stream", "Event", "current_stream", "default_stream", "set_stream",
                 "stream")


def _stream_attribute(name: str) -> object:
    if name in _STREAM_NAMES:
        from hologram_torch import streams

        return getattr(streams, name)
    if name == "from_dlpack":
        from hologram_torch import dlpack

        return dlpack.from_dlpack
    raise AttributeError(f"module 'torch.{NAME}' has no attribute {name!r}")


def _module() -> types.ModuleType:
    module = types.ModuleType(f"torch.{NAME}", __doc__)
    for fn in _MODULE_FUNCTIONS:
        setattr(module, fn.__name__, fn)
    module.__getattr__ = _stream_attribute
    return module


# --- module conversions keep each Parameter ----------------------------------------------
#
# ``Module._apply`` (behind ``.to``, ``.cpu()``, ``.hologram()``, ``.to_empty``) keeps a
# Parameter object when ``torch._has_compatible_shallow_copy_type(param, converted)`` holds
# and assigns ``param.data``; the C++ check lists CPU, CUDA and a few other backends, not
# PrivateUse1. For a move between the CPU and this device it therefore makes a new
# Parameter per module attribute, so weights tied by sharing one Parameter (embedding and
# output layer) come apart, and an optimizer built before the move holds stale objects.
# ``param.data = x`` cannot be allowed from Python (the same check runs in C++), so after
# torch's conversion the converted tensor is moved into the original Python object with
# ``torch._C._swap_tensor_impl`` (the primitive under ``torch.utils.swap_tensors``): the
# object keeps its class, attributes and identity, and now holds the device tensor (with
# its gradient), as ``param.data = x`` gives on CUDA.

def _crosses_device(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Did the conversion move ``old`` between the CPU and this device (where torch made a
    new Parameter only because the device is not on its list)?"""
    kinds = {old.device.type, new.device.type}
    return (NAME in kinds and kinds <= {NAME, "cpu"} and old.layout == torch.strided
            and new.layout == torch.strided and not _python_tensor(old)
            and not _python_tensor(new)
            and not torch._has_compatible_shallow_copy_type(old, new))


def _python_tensor(t: torch.Tensor) -> bool:
    """A fake tensor or tensor subclass dispatching to Python: torch's own rules apply."""
    return torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python)


def _adopt(old: torch.nn.Parameter, new: torch.nn.Parameter) -> bool:
    """Give ``old`` the converted tensor ``new`` holds; False where that is unsafe."""
    # Another C++ owner of old's tensor (a live autograd graph's AccumulateGrad node, a
    # view's base) would keep using the tensor the Python object no longer holds.
    if old._use_count() != 1 or new._use_count() != 1:
        warnings.warn(
            f"a Parameter moved between the CPU and {NAME} is still referenced by a view "
            "or a live autograd graph, so the module now holds a new Parameter object "
            "(weights tied by sharing that Parameter are no longer shared): move the "
            "module before running it, or after backward()", UserWarning, stacklevel=4)
        return False
    torch._C._swap_tensor_impl(old, new)
    # Tensor hooks are registered on the tensor (the one old held before): register the
    # object's hook dictionaries again on the tensor it holds now.
    for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
        hooks = getattr(old, attr)
        if hooks:
            setattr(old, attr, hooks)
    return True


def _module_apply(original):
    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        before = dict(self._parameters)
        result = original(self, fn, recurse)
        if (torch.__future__.get_overwrite_module_params_on_conversion()
                or torch.__future__.get_swap_module_params_on_conversion()):
            return result  # the user chose torch's other behaviours: leave them alone
        adopted: set[int] = set()  # one Parameter under several names of this module
        for key, old in before.items():
            new = self._parameters.get(key)
            if old is None or new is None or new is old:
                continue
            if id(old) in adopted or (_crosses_device(old, new) and _adopt(old, new)):
                adopted.add(id(old))
                self._parameters[key] = old
        return result

    _apply._hologram_original = original
    return _apply


def _keep_parameters_on_conversion() -> None:
    module = torch.nn.Module
    if not hasattr(module._apply, "_hologram_original"):
        module._apply = _module_apply(module._apply)


# --- registration -----------------------------------------------------------------------

def register() -> None:
    """Rename PrivateUse1 to ``hologram`` and install the device module, the hooks and the
    device guard (idempotent); module conversions keep their Parameter objects.

    The hooks are the native ones (:mod:`hologram_torch.native`: they add the pinned-memory
    allocator) when they can be built and loaded, else the Python ones below, which answer
    the same questions without it."""
    _check_torch()
    _keep_parameters_on_conversion()
    if torch._C._get_privateuse1_backend_name() == NAME:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    # torch takes the first hooks registered in a process and ignores later ones, so the
    # Python hooks passed below only serve where the native ones could not be registered.
    native.register()

    class Hooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, device_index: int) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    class Guard(torch._C._acc.DeviceGuard):
        def type_(self):
            return torch._C._autograd.DeviceType.PrivateUse1

    module = _module()
    _setup_privateuseone_for_python_backend(NAME, backend_module=module, hook=Hooks(),
                                            device_guard=Guard())
    sys.modules[module.__name__] = module
