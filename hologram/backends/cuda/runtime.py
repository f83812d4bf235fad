"""Running compiled (sm_80/sm_90) artifacts through a driver (:mod:`.driver`): device
memory with accounting, the kernel parameters read from each compiled kernel's metadata,
launch configuration, and the program that launches every kernel in order.

The backend uses it where a GPU is found (:func:`.backend.gpu`). **Not run on hardware
yet**: tested only against a fake driver (tests/test_cuda_runtime.py, docs/cuda.md).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.backends.base import Allocator, Executable
from hologram.errors import DeviceError, OutOfMemoryError, ShapeError

#: The largest grid.x of a launch (2**31 - 1).
MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class Launch:
    """How one compiled kernel is launched."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    buffers: tuple[int, ...]  # program buffer indices, one per visible pointer parameter
    global_scratch: int  # bytes per program instance (Triton's global_scratch_size)
    profile_scratch: int


def launch_of(kernel: dict, compiled: dict) -> Launch:
    """The launch of one kernel: its grid (one program instance per ``XBLOCK`` grid
    points), ``32 * num_warps`` threads, and the shared memory and scratch sizes from the
    compiled kernel's metadata (never assumed)."""
    md = compiled["metadata"]
    if md["name"] != kernel["name"]:
        raise DeviceError(f"cuda: compiled kernel {md['name']} does not match {kernel['name']}")
    grid = kernel["grid"]
    if grid > MAX_GRID_X:
        raise DeviceError(f"cuda: kernel {kernel['name']} needs {grid} program instances, "
                          f"more than {MAX_GRID_X}; split the program")
    return Launch(kernel["name"], (grid, 1, 1), (32 * md["num_warps"], 1, 1), md["shared"],
                  tuple(kernel["buffers"]), md.get("global_scratch_size", 0),
                  md.get("profile_scratch_size", 0))


def parameters(launch: Launch, pointers: dict[int, int], scratch: tuple[int, int]) -> list[int]:
    """The kernel's parameters: one device pointer per buffer it touches, in its
    signature's order, then the two hidden pointers Triton 3.9.0 appends (global and
    profile scratch; 0 where the metadata gives no scratch)."""
    missing = [b for b in launch.buffers if b not in pointers]
    if missing:
        raise ShapeError(f"cuda: kernel {launch.name} needs buffers {missing}, not given")
    return [pointers[b] for b in launch.buffers] + [
        scratch[0] if launch.global_scratch else 0,
        scratch[1] if launch.profile_scratch else 0]


class DeviceMemory(Allocator):
    """Device allocations through the driver, with ``torch.cuda``-style counters and a
    limit (``OutOfMemoryError`` naming the request and the usage)."""

    device = "cuda"
    dlpack_device_type = 2  # kDLCUDA
    host_visible = False

    def __init__(self, driver: Any, memory_limit: int | None = None):
        self.driver = driver
        self.limit = memory_limit
        self.sizes: dict[int, int] = {}
        self.peak = 0
        self.count = 0

    @property
    def allocated(self) -> int:
        return sum(self.sizes.values())

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)
        if self.limit is not None and self.allocated + nbytes > self.limit:
            raise OutOfMemoryError(f"cuda: allocating {nbytes} bytes would pass the memory "
                                   f"limit of {self.limit} ({self.allocated} in use); free "
                                   "buffers or raise the limit")
        try:
            pointer = self.driver.mem_alloc(nbytes)
        except OutOfMemoryError as err:
            raise OutOfMemoryError(f"{err} (requested {nbytes} bytes, {self.allocated} in "
                                   f"use by this allocator)") from err
        self.sizes[pointer] = nbytes
        self.count += 1
        self.peak = max(self.peak, self.allocated)
        return pointer

    def free(self, allocation: int) -> None:
        if allocation not in self.sizes:
            raise DeviceError(f"cuda: {allocation:#x} is not an allocation of this allocator "
                              "(freed twice?)")
        self.driver.mem_free(allocation)
        del self.sizes[allocation]

    def handle(self, allocation: int) -> int:
        return allocation

    def _check(self, allocation: int, nbytes: int, what: str) -> None:
        size = self.sizes.get(allocation)
        if size is None or nbytes > size:
            raise ShapeError(f"cuda: {what} of {nbytes} bytes does not fit allocation "
                             f"{allocation:#x} ({size} bytes)")

    def copy_in(self, allocation: int, source: np.ndarray) -> None:
        self._check(allocation, source.nbytes, "copy in")
        self.driver.copy_in(allocation, source)

    def copy_out(self, allocation: int, destination: np.ndarray) -> None:
        self._check(allocation, destination.nbytes, "copy out")
        self.driver.copy_out(destination, allocation)

    def synchronize(self) -> None:
        self.driver.synchronize()

    def stats(self) -> dict[str, int]:
        return {"allocated_bytes": self.allocated, "peak_allocated_bytes": self.peak,
                "allocations": len(self.sizes), "num_alloc_calls": self.count}

    @property
    def memory_limit(self) -> int | None:
        return self.limit

    def set_memory_limit(self, limit: int | None) -> None:
        self.limit = limit


class DeviceProgram(Executable):
    """A compiled artifact loaded through ``driver``: one module per kernel, temporaries
    and scratch owned by the program, every kernel launched in order on the stream."""

    def __init__(self, artifact: bytes, driver: Any, memory: DeviceMemory):
        header = json.loads(artifact)
        if "compiled" not in header:
            raise DeviceError(f"cuda: program {header['program']} was not built for a GPU "
                              "target; build it with target='sm_80' or 'sm_90'")
        self.driver, self.memory = driver, memory
        self.name = header["program"]
        self.params = header["params"]
        if header["interpreted"]:
            raise DeviceError(f"cuda: program {self.name} has kernels the renderer cannot "
                              "express; they run only emulated so far")
        self.launches = [launch_of(k, c) for k, c in zip(header["kernels"], header["compiled"])]
        self.functions = []
        for c in header["compiled"]:
            module = driver.load_module(base64.b64decode(c["cubin"]))
            self.functions.append(driver.function(module, c["name"]))
        self.temps = {i: memory.alloc((max(nbytes, 1),), np.uint8)
                      for i, nbytes in header["temps"].items()}
        self.scratch = []
        for launch in self.launches:
            instances = launch.grid[0] * launch.grid[1] * launch.grid[2]
            self.scratch.append(tuple(
                memory.alloc((size * instances,), np.uint8) if size else 0
                for size in (launch.global_scratch, launch.profile_scratch)))

    def launch(self, handles: tuple[int, ...]) -> None:
        if len(handles) != len(self.params):
            raise ShapeError(f"cuda program {self.name}: takes {len(self.params)} buffers, "
                             f"got {len(handles)}")
        pointers = {int(i): p for i, p in self.temps.items()}
        pointers.update(zip(self.params, handles))
        for launch, function, scratch in zip(self.launches, self.functions, self.scratch):
            if launch.grid[0] == 0:
                continue
            self.driver.launch(function, launch.grid, launch.block, launch.shared,
                               parameters(launch, pointers, scratch))
