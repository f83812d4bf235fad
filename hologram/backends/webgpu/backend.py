"""The ``webgpu`` backend (and ``metal``, ``vulkan``): WGSL compute shaders through wgpu.

**Compile** (:meth:`WebGpuBackend.compile`, no device needed): the target passes for
its :meth:`~WebGpuBackend.capabilities` (no f64, no i64, 32-bit storage), then one
WGSL shader per kernel (:mod:`.render`). The artifact is JSON: the shaders, each kernel's
bindings, mode and workgroup counts, and the program's buffers.

**Load** (:meth:`WebGpuBackend.load`): each shader becomes a compute pipeline on the
process's device (a shader that fails validation raises :class:`CompileError` with the
WGSL and wgpu's message). :meth:`_Executable.launch` binds one allocation per parameter
(temporaries are the executable's own; a handle inside an allocation passes its offset to
the shaders, :mod:`.memory`), records every kernel's dispatch in one compute pass and
submits it; bind groups are cached per set of buffers.

Names: ``webgpu`` runs on wgpu's high-performance adapter, whatever it is (on a machine
without a GPU, Mesa's lavapipe); ``metal`` and ``vulkan`` only on an adapter with that
backend. ``"auto"`` may take ``webgpu`` on a GPU adapter, never on a CPU emulation
(:meth:`WebGpuBackend.auto_available`). A driver that flushes f32 subnormals to zero
(WGSL allows it) is found by a probe when the device opens
(:meth:`WebGpuBackend.flushes_subnormals`).
"""

from __future__ import annotations

import importlib.util
import json
import threading
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from hologram.backends.base import Allocator, Backend, Executable
from hologram.codegen import schedule
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities, Split
from hologram.errors import CompileError, DeviceError, ShapeError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Program

from . import device as devices
from . import memory
from . import render as render_module
from .render import EMULATED_LOOP_LIMIT, WORKGROUP, dispatch, render

#: The artifact format's version (part of the target identity, so old cache entries are
#: never loaded by a newer runtime).
FORMAT = "wgsl-4"
#: WebGPU's capabilities: no f64, no i64 arithmetic (two words, :data:`_I64_OPS`), 32-bit
#: storage only (f16 with the shader-f16 feature is not used), float min/max left to the
#: renderer (it orders the bits), gather (render.py: the operand clamped in its own
#: register, the element summed in wrapping u32) and scatter (render.py: one invocation
#: per grid point makes its writes in index order; the schedule keeps only disjoint
#: dimensions on the grid).
_CAPS = Capabilities(f64=False, i64=False, narrow_storage=False, ieee_minmax=True,
                     gather=True, scatter=True, fission=True)
#: i64 is two 32-bit words (low, high): memory (a gather's values and operands too),
#: casts, reductions, compares, select, the wrapping arithmetic below and C's division and
#: remainder (a long division, bitlib.py); no contraction.
_I64_OPS = frozenset({"load", "gather", "store", "scatter", "const", "index", "cast", "reduce",
                      "select",
                      "add", "sub", "mul", "div", "mod", "min", "max", "and", "or", "xor",
                      "not", "neg", "abs", "sign", "eq", "ne", "lt", "le", "gt", "ge"})
_BIND_GROUPS = 256  # bind groups remembered per kernel
_SPLIT_WORK = render_module.SPLIT_WORK  # the default split threshold


class WebGpuBackend(Backend):
    name: ClassVar[str] = "webgpu"
    _available: ClassVar[dict[str, bool]] = {}
    _auto: ClassVar[dict[str, bool]] = {}

    @classmethod
    def may_be_available(cls) -> bool:
        """Whether a GPU adapter may be here, known without loading a driver: wgpu
        installed and (on Linux) a GPU device node (:func:`.device.gpu_may_exist`). The
        torch device's ``auto`` asks this on ``import torch`` and probes
        (:meth:`auto_available`) at first use."""
        return importlib.util.find_spec("wgpu") is not None and devices.gpu_may_exist()

    @classmethod
    def auto_available(cls) -> bool:
        """Whether ``"auto"`` may take this backend: its adapter is a GPU. Never a CPU
        emulation (lavapipe, llvmpipe, SwiftShader), which the cpu backend outruns many
        times over; where no GPU device node exists, no driver is even loaded."""
        if cls.name not in cls._auto:
            cls._auto[cls.name] = (devices.gpu_may_exist() and cls.is_available()
                                   and devices.is_hardware(dict(devices.adapter(cls.name).info)))
        return cls._auto[cls.name]

    @classmethod
    def not_auto_reason(cls) -> str:
        """Why ``"auto"`` passes it over where it runs (``hologram info``)."""
        return (f"the adapter, {devices.adapter(cls.name).summary}, is an emulation on the "
                "CPU, which the cpu backend outruns")

    def flushes_subnormals(self) -> bool:
        """Whether this backend's device flushes f32 subnormals to zero (and so bf16's),
        in arithmetic and comparisons: a deviation from the ISA that WGSL allows a driver,
        found by a probe shader when the device opened (docs/webgpu.md)."""
        return devices.get(self.name).flushes_subnormals

    @classmethod
    def is_available(cls) -> bool:
        if cls.name not in cls._available:
            try:
                devices.adapter(cls.name)
                ok = True
            except DeviceError:
                ok = False
            cls._available[cls.name] = ok
        return cls._available[cls.name]

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why this backend cannot run here, and what to install (for error messages)."""
        try:
            found = devices.adapter(cls.name)
        except DeviceError as err:
            return str(err)
        return (f"{cls.name}: the adapter here, {found.summary}, is not a {cls.name} GPU; "
                "use backend='webgpu'")

    def target(self, name: str | None = None) -> str:
        if name not in (None, "wgsl"):
            raise DeviceError(f"{self.name}: unknown target {name!r}; the one target is "
                              "'wgsl' (shaders are compiled by the driver when loaded)")
        text = f"{FORMAT} workgroup {WORKGROUP}"
        # Tests lower the split threshold (render.SPLIT_WORK): the target string, part of
        # every cache key, names it, so artifacts split differently never mix.
        if render_module.SPLIT_WORK != _SPLIT_WORK:
            text += f" split-work-{render_module.SPLIT_WORK}"
        if not _CAPS.fission:  # (tests turn it off to reach the split of one kernel)
            text += " no-fission"
        return f"{text} bindings {self.binding_limit()}"

    def binding_limit(self) -> int:
        """The storage buffers a kernel may bind: the adapter's limit (the device opens
        with the adapter's limits; no device is opened to ask), or WebGPU's guaranteed 8
        where no adapter is found (artifacts built there then load on any adapter).
        Kernels past it are cut by their stores (schedule.fit_bindings)."""
        try:
            found = devices.adapter(self.name).limits
        except DeviceError:
            return 8
        return int(found.get("max-storage-buffers-per-shader-stage", 8))

    def capabilities(self, target: str | None = None) -> Capabilities:
        self.target(target)
        # The split numbers are read when asked: tests lower SPLIT_WORK (which the target
        # string then names). At most SPLIT_GROUPS parts: no row needs more to fill them.
        r = render_module
        return replace(_CAPS, row_split=Split(r.SPLIT_WORK, r.SPLIT_GROUPS, r.SPLIT_GROUPS,
                                              r.MAX_CHUNK))

    def supports(self, op: str, dtype: DType) -> bool:
        if dtype is dt.float64:
            return False  # WGSL has no 64-bit types
        if dtype is dt.int64:
            return op in _I64_OPS
        # An f32 fma rounded again to f16/bf16 would round twice.
        return not (op == "fma" and dtype in (dt.float16, dt.bfloat16))

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        return memory.WebGpuAllocator(self.name, memory_limit)

    def compile(self, program: Program, target: str | None = None) -> bytes:
        caps = self.capabilities(target)
        program = pipeline.for_target(program, caps)
        if caps.fission:  # several reductions over few long rows: a kernel each, split
            program = schedule.fission(program,
                                       lambda piece: render_module.split(piece, caps)[0])
        # (two bindings to spare: a split reduction's last shader reads its partials;
        # and one for the numbers, which take none of their own)
        packed = render_module.numbers(program)
        limit = self.binding_limit() - 2 - bool(packed)
        program = schedule.fit_bindings(program, max(limit, 4), free=packed.keys())
        kernels = []
        buffers = [{"name": b.name, "kind": b.kind, "nbytes": b.nbytes,
                    "itemsize": b.dtype.itemsize} for b in program.buffers]
        for kernel in program.kernels:
            for shader in render(program, kernel, caps, scratch=len(buffers), packed=packed):
                # A split reduction's partial states: a temporary after the program's
                # buffers, written by the first shader and read by the second.
                scratch = shader.pop("scratch", None)
                if scratch is not None:
                    assert scratch["index"] == len(buffers)
                    buffers.append({"name": shader["name"], "kind": "temp",
                                    "nbytes": scratch["nbytes"], "itemsize": 4})
                shader["dispatch"] = dispatch(shader["points"], shader["mode"])
                pipeline.dump(program.name, f"{shader['name']}.wgsl", shader["wgsl"])
                kernels.append(shader)
        header = {
            "format": FORMAT,
            "program": program.name,
            "buffers": buffers,
            "params": [i for i, b in enumerate(program.buffers) if b.kind != "temp"],
            "packed": sorted(packed.items()),
            "kernels": kernels,
        }
        return json.dumps(header).encode()

    def describe(self, artifact: bytes) -> dict[str, Any]:
        header = json.loads(artifact)
        return {"format": header["format"], "bytes": len(artifact),
                "kernels": [{k: v for k, v in kernel.items()} for kernel in header["kernels"]],
                "buffers": header["buffers"], "interpreted": []}

    def load(self, artifact: bytes) -> Executable:
        return _Executable(json.loads(artifact), devices.get(self.name))


class MetalBackend(WebGpuBackend):
    """``webgpu`` on an adapter whose backend is Metal (Apple GPUs)."""

    name = "metal"

    @classmethod
    def is_available(cls) -> bool:
        # A name for a GPU: on an emulated adapter (lavapipe) only "webgpu" is offered,
        # so the suites do not run the same adapter twice.
        return WebGpuBackend.is_available.__func__(cls) and devices.is_hardware(
            dict(devices.adapter(cls.name).info))


class VulkanBackend(MetalBackend):
    """``webgpu`` on an adapter whose backend is Vulkan (a GPU, not lavapipe)."""

    name = "vulkan"


class _Executable(Executable):
    def __init__(self, header: dict, dev: devices.Device):
        self.dev = dev
        self.header = header
        self.params = header["params"]
        self.buffers = header["buffers"]
        self.kernels = [k for k in header["kernels"] if k["points"] > 0]
        self.pipelines = [self._pipeline(k) for k in self.kernels]
        # The kernels' twins for launches that bind one buffer twice, once writable (an
        # in-place op: WebGPU forbids a writable and a read-only binding of one buffer in
        # a dispatch), all of whose storage bindings are writable; made on first need.
        self.twins: list[Any] = [None] * len(self.kernels)
        self.bind_groups: list[dict[tuple, Any]] = [{} for _ in self.kernels]
        self.temps: dict[int, memory.Allocation] = {}
        # The buffers' starts in their bindings, in elements (render.py's hg_base): a
        # uniform written before a launch whose starts differ from the last one's. (A
        # write is ordered with the submissions around it on the queue.)
        wgpu = devices.wgpu_module()
        self.bases = dev.device.create_buffer(
            size=16 * (len(self.buffers) // 4 + 1),
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self.written = (0,) * len(self.params)
        # The numbers' values (render.numbers), copied here at each launch: the buffer
        # hg_n, and (position in params, word, words) of each.
        position = {b: p for p, b in enumerate(self.params)}
        self.numbers = [(position[b], word, self.buffers[b]["itemsize"] // 4)
                        for b, word in header["packed"]]
        self.pack = dev.device.create_buffer(
            size=4 * max((w + n for _, w, n in self.numbers), default=1),
            usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        self.placeholder: memory.Allocation | None = None
        self.lock = threading.Lock()
        self.itemsizes = [self.buffers[i]["itemsize"] for i in self.params]
        temps = [i for i, b in enumerate(self.buffers) if b["kind"] == "temp"]
        if temps:
            allocator = memory.WebGpuAllocator(dev.kind)
            for i in temps:
                self.temps[i] = allocator.alloc((max(self.buffers[i]["nbytes"], 4),), "u1")

    def _pipeline(self, kernel: dict, twin: bool = False) -> Any:
        device = self.dev.device
        if not self.dev.is_hardware and kernel["iterations"] > EMULATED_LOOP_LIMIT:
            raise CompileError(
                f"webgpu: kernel {kernel['name']} of {self.header['program']} runs up to "
                f"{kernel['iterations']} loop iterations per invocation; this adapter "
                f"({self.dev.summary}) is a CPU emulation that silently ends an "
                f"invocation's loops after {EMULATED_LOOP_LIMIT} in all, so its results "
                "would be wrong. Run the program on the cpu backend or on a GPU adapter, or "
                "make it smaller", source=kernel["wgsl"])
        limit = self.dev.limits.get("max-storage-buffers-per-shader-stage", 8)
        storage = len(kernel["bindings"]) + kernel["packed"]
        if storage > limit:
            raise CompileError(
                f"webgpu: kernel {kernel['name']} binds {storage} storage "
                f"buffers, more than this adapter's max-storage-buffers-per-shader-stage "
                f"({limit}, {self.dev.summary}); split the program", source=kernel["wgsl"])
        wgpu = devices.wgpu_module()
        wgsl, writable = kernel["wgsl"], kernel["writable"]
        if twin:
            wgsl = wgsl.replace("var<storage, read>", "var<storage, read_write>")
            writable = [True] * len(writable)
        try:
            module = device.create_shader_module(code=wgsl)
            # An explicit layout: "auto" would drop a binding the shader declares but
            # never reaches, and the bind group would no longer match it.
            entries = [{"binding": slot, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.storage if w else
                                   wgpu.BufferBindingType.read_only_storage}}
                       for slot, w in enumerate(writable)]
            if kernel["packed"]:  # hg_n (a twin's shader declares it writable too)
                entries.append({"binding": len(entries), "visibility": wgpu.ShaderStage.COMPUTE,
                                "buffer": {"type": wgpu.BufferBindingType.storage if twin
                                           else wgpu.BufferBindingType.read_only_storage}})
            if kernel["based"]:
                entries.append({"binding": len(entries),
                                "visibility": wgpu.ShaderStage.COMPUTE,
                                "buffer": {"type": wgpu.BufferBindingType.uniform}})
            layout = device.create_bind_group_layout(entries=entries)
            pipeline_layout = device.create_pipeline_layout(bind_group_layouts=[layout])
            return layout, device.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": module, "entry_point": "main"})
        except Exception as err:
            raise CompileError(f"webgpu: the driver rejected the shader of kernel "
                               f"{kernel['name']} ({self.dev.summary})", source=kernel["wgsl"],
                               log=str(err)) from err

    def _empty(self) -> memory.Allocation:
        if self.placeholder is None:
            self.placeholder = memory.WebGpuAllocator(self.dev.kind).alloc((4,), "u1")
        return self.placeholder

    def launch(self, handles: tuple[int, ...]) -> None:
        if len(handles) != len(self.params):
            raise ShapeError(f"webgpu program {self.header['program']}: takes "
                             f"{len(self.params)} buffers, got {len(handles)}")
        allocations = dict(self.temps)
        starts = []
        for slot, handle, itemsize in zip(self.params, handles, self.itemsizes):
            # (0: an empty tensor's pointer, never read; a placeholder buffer is bound)
            allocations[slot], offset = memory.locate(handle or self._empty().id << memory.SHIFT)
            if offset % itemsize:
                raise ShapeError(f"webgpu program {self.header['program']}: buffer "
                                 f"{self.buffers[slot]['name']} starts {offset} bytes into "
                                 f"its allocation, not a multiple of its {itemsize}-byte "
                                 "elements")
            starts.append(offset // itemsize)
        starts = tuple(starts)
        # The starts in the uniform are this launch's until its submission: a launch on
        # another thread waits (its own starts would overwrite them).
        with self.lock:
            if starts != self.written:
                words = np.zeros(self.bases.size // 4, np.uint32)
                words[list(self.params)] = starts
                self.dev.queue.write_buffer(self.bases, 0, words)
                self.written = starts
            encoder = self.dev.device.create_command_encoder()
            for p, word, words in self.numbers:  # ordered before the dispatches
                encoder.copy_buffer_to_buffer(allocations[self.params[p]].buffer,
                                              starts[p] * self.itemsizes[p], self.pack,
                                              4 * word, 4 * words)
            compute = encoder.begin_compute_pass()
            for k, (kernel, groups) in enumerate(zip(self.kernels, self.bind_groups)):
                buffers = tuple(allocations[i] for i in kernel["bindings"])
                key = tuple(a.id for a in buffers)
                twin = len(set(key)) < len(key) and any(
                    w and key.count(b) > 1 for b, w in zip(key, kernel["writable"]))
                if twin:
                    if self.twins[k] is None:
                        self.twins[k] = self._pipeline(kernel, twin=True)
                    pipeline_, key = self.twins[k], (*key, "twin")
                else:
                    pipeline_ = self.pipelines[k]
                group = groups.get(key)
                if group is None:
                    if len(groups) >= _BIND_GROUPS:
                        groups.clear()
                    entries = [{"binding": slot, "resource": {"buffer": a.buffer, "offset": 0,
                                                              "size": a.buffer.size}}
                               for slot, a in enumerate(buffers)]
                    if kernel["packed"]:
                        entries.append({"binding": len(entries), "resource": {
                            "buffer": self.pack, "offset": 0, "size": self.pack.size}})
                    if kernel["based"]:
                        entries.append({"binding": len(entries), "resource": {
                            "buffer": self.bases, "offset": 0, "size": self.bases.size}})
                    group = self.dev.device.create_bind_group(layout=pipeline_[0],
                                                              entries=entries)
                    # Keyed by buffer ids, never reused: an entry whose buffers were
                    # destroyed is never hit again.
                    groups[key] = group
                compute.set_pipeline(pipeline_[1])
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*kernel["dispatch"])
            compute.end()
            self.dev.queue.submit([encoder.finish()])
