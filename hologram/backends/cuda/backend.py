"""The ``cuda`` backend: Triton kernels generated from the loop plan (:mod:`.render`).

**Build** (no GPU needed): the target passes for its :meth:`~CudaBackend.capabilities`,
then one ``@triton.jit`` function per kernel, all in one Python module (the artifact's
``source``). For a named target (``sm_80``, ``sm_90``) every kernel is compiled ahead of
time with Triton's compiler (:func:`hologram.build`); the artifact then also holds each
kernel's PTX, cubin and the resources read from the compiled kernel (Triton's metadata;
registers and spills from ``ptxas -v`` on that PTX). Triton runs in a child process
(:mod:`.triton_process`).

**Run**, on a GPU: where ``cuda-bindings`` finds an NVIDIA GPU of compute capability 8.x
or 9.0, the backend is available; programs compile for its target (``sm_80`` cubins run on
every 8.x GPU) and run through the CUDA driver (:mod:`.runtime`, :mod:`.driver`): device
memory from a 96-class pool of driver blocks, every kernel launched in order on one
stream. Compiled kernels are kept on disk by :mod:`.kernels`, keyed by architecture,
Triton, toolkit and driver versions. It ran once on an H100 (the conformance suite passes
there, docs/cuda.md "On an H100"); CI tests it against a fake driver.

**Run**, emulated: with ``HOLOGRAM_CUDA_EMULATE=1`` the backend is available and runs the
same generated kernels in Triton's interpreter (``TRITON_INTERPRET=1``); this is *not* a
GPU run. Its memory (:mod:`.emulated`) is host memory behind device-style handles: not
host-visible, handles that are not host addresses (a host dereference faults), copied in
and out as a GPU's is, so host code that would touch device memory fails here too.

A kernel the renderer cannot express (a reduction whose result varies along a loop
dimension) runs on the reference interpreter, declared in the artifact (``interpreted``),
emulated and on a GPU alike.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import sys
import warnings
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from hologram import config
from hologram.backends.base import Allocator, Backend, Executable, host_arrays
from hologram.codegen import loops, schedule
from hologram.codegen import mathlib as shared_math
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities, Split
from hologram.errors import DeviceError, ShapeError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Program
from hologram.isa.text import parse_program, print_program

from . import kernels as kernels_cache
from . import render as render_module
from . import triton_process
from .emulated import EmulatedMemory, untag
from .prelude import PRELUDE
from .render import render
from .runtime import ALIGNMENT, DeviceMemory, DeviceProgram

FORMAT = "triton-3"
#: What the generated code uses: f16/bf16 arithmetic through f32 (rounded after each
#: operation by the decompose pass; their fma through f64 steps); float min/max built from
#: compares; gather (render.py: the operand clamped in its own width, the element summed
#: in wrapping int32, or in int64 where a kernel's indices reach 2**31); scatter
#: (render.py: one program instance makes a grid point's writes, in index order, in
#: rounds of writes to distinct elements); split reductions,
#: split-K and fission with render.py's numbers (:meth:`CudaBackend.capabilities`).
_CAPS = Capabilities(f64=True, i64=True, narrow_storage=True, ieee_minmax=False, gather=True,
                     scatter=True, fission=True)
#: Named targets: compute capability of each.
TARGETS = {"sm_80": 80, "sm_90": 90}
#: The target whose cubins a GPU runs, by compute capability (a cubin runs on its own
#: major version from its minor version on).
_TARGET_OF = {(8, minor): "sm_80" for minor in range(10)} | {(9, 0): "sm_90"}
_DTYPES = frozenset(dt.ALL)
_FLOAT_ONLY = frozenset({"sqrt", "rsqrt", "floor", "ceil", "round", "trunc",
                         *shared_math.FUNCTIONS})
_INT_ONLY = frozenset({"and", "or", "xor", "not"})
_NUMERIC = frozenset({"div", "mod", "sign", "fma", "contract"})  # not bool
_ANY = frozenset({"load", "gather", "store", "scatter", "const", "index", "cast", "select",
                  "add", "sub", "mul", "min", "max", "abs", "neg", "eq", "ne", "lt", "le", "gt",
                  "ge", "reduce"})
_SPLIT_WORK = render_module.SPLIT_WORK  # the default split threshold
_SPLIT_K_WORK = render_module.SPLIT_K_WORK  # the default split-K threshold
_WIDE_INDICES = render_module.WIDE_INDICES  # the default reach of int64 indices
#: Triton compile options: never contract a*b+c to an FMA (one rounding, not two).
OPTIONS = {"enable_fp_fusion": False}


#: This process's GPU, probed once (:func:`gpu`).
_GPU: dict[str, Any] = {}


#: Linux's NVIDIA device nodes (``/dev/dxg``: WSL 2's GPU).
_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def gpu() -> tuple[Any, str] | None:
    """This machine's GPU as ``(driver, target)``, or None: no ``cuda-bindings``, no NVIDIA
    driver or device, or a compute capability no target is built for (:func:`why_no_gpu`
    says which). Probed once per process."""
    if "found" not in _GPU:
        from .driver import Driver

        try:
            if sys.platform == "linux" and not any(map(os.path.exists, _DEVICE_NODES)):
                # Cheap, and asked by every "auto": loading the driver costs ~40 ms.
                raise DeviceError("cuda: no NVIDIA device here (none of "
                                  f"{', '.join(_DEVICE_NODES)} exists)")
            driver = Driver()
            capability = driver.capability()
            if capability not in _TARGET_OF:
                raise DeviceError(f"cuda: compute capability {capability[0]}.{capability[1]} "
                                  "has no target; supported: 8.x (sm_80), 9.0 (sm_90)")
            _GPU["found"] = (driver, _TARGET_OF[capability])
        except DeviceError as err:
            _GPU["found"], _GPU["why"] = None, str(err)
    return _GPU["found"]


def why_no_gpu() -> str | None:
    """Why :func:`gpu` found none (None when it found one)."""
    return None if gpu() is not None else _GPU["why"]


def is_gpu_available() -> bool:
    """Whether this backend runs on a real GPU here: ``cuda-bindings`` loads the driver,
    ``cuDeviceGetCount`` is above 0 and the device's compute capability has a target.
    Never the emulation, whatever ``HOLOGRAM_CUDA_EMULATE`` says."""
    return gpu() is not None


class CudaBackend(Backend):
    name: ClassVar[str] = "cuda"

    def __init__(self) -> None:
        super().__init__()
        self._temps: DeviceMemory | None = None  # programs' temporaries on the GPU

    @classmethod
    def is_available(cls) -> bool:
        if not triton_process.triton_installed():
            return False
        return config.get().cuda_emulate or gpu() is not None

    @classmethod
    def auto_available(cls) -> bool:
        """Whether ``"auto"`` should pick this backend: on a real GPU only, never
        emulated (the interpreter is slow, and its runs say nothing about a GPU)."""
        return (not config.get().cuda_emulate and triton_process.triton_installed()
                and is_gpu_available())

    @classmethod
    def not_auto_reason(cls) -> str:
        """Why ``"auto"`` passes it over where it runs (``hologram info``)."""
        return "emulated (HOLOGRAM_CUDA_EMULATE=1: Triton's interpreter on the CPU)"

    @classmethod
    def may_be_available(cls) -> bool:
        """Whether a GPU may be here, without loading the driver: not emulated, Triton and
        cuda-bindings installed, and (on Linux) an NVIDIA device node. The torch device's
        ``auto`` asks this on ``import torch`` and probes (:meth:`auto_available`) at
        first use."""
        if config.get().cuda_emulate or not triton_process.triton_installed():
            return False
        if importlib.util.find_spec("cuda") is None:
            return False
        return sys.platform != "linux" or any(map(os.path.exists, _DEVICE_NODES))

    @classmethod
    def unavailable_reason(cls) -> str:
        if not triton_process.triton_installed():
            return ("triton is not installed: pip install 'hologram-tensor[cuda]' "
                    f"(triton=={triton_process.TRITON_VERSION})")
        return (f"{why_no_gpu()}; HOLOGRAM_CUDA_EMULATE=1 runs its kernels in Triton's "
                "interpreter instead")

    @staticmethod
    def _device_target() -> str | None:
        """The GPU's target, or None when running emulated (or without a GPU)."""
        if config.get().cuda_emulate:
            return None
        found = gpu()
        return found[1] if found is not None else None

    def target(self, name: str | None = None) -> str:
        name = name or self._device_target()
        if name is not None and name not in TARGETS:
            raise DeviceError(f"cuda: unknown target {name!r}; known targets: "
                              f"{', '.join(TARGETS)}")
        # Everything the generated code depends on beyond the program is named here, so it
        # is part of every cache key (launch.build): TF32 matmuls, a lowered split
        # threshold, a lowered reach of int64 indices (tests).
        text = f"{FORMAT} triton-{triton_process.TRITON_VERSION} {name or 'interpret'}"
        if config.get().cuda_allow_tf32:
            text += " tf32"
        if render_module.SPLIT_WORK != _SPLIT_WORK:
            text += f" split-work-{render_module.SPLIT_WORK}"
        if render_module.SPLIT_K_WORK != _SPLIT_K_WORK:
            text += f" split-k-work-{render_module.SPLIT_K_WORK}"
        if render_module.WIDE_INDICES != _WIDE_INDICES:
            text += f" wide-indices-{render_module.WIDE_INDICES}"
        return text

    def capabilities(self, target: str | None = None) -> Capabilities:
        """The same for every target (the generated code is; only its compilation
        differs), and for the emulation."""
        if target is not None and target not in TARGETS:
            self.target(target)  # raises, naming the known targets
        # The split numbers are read when asked: tests lower SPLIT_WORK and SPLIT_K_WORK
        # (which the target string then names).
        r = render_module
        return replace(_CAPS, row_split=Split(r.SPLIT_WORK, r.SPLIT_PROGRAMS, r.MAX_PARTS),
                       k_split=Split(r.SPLIT_K_WORK, r.SPLIT_K_PROGRAMS, r.MAX_K_PARTS))

    def supports(self, op: str, dtype: DType) -> bool:
        if dtype not in _DTYPES:
            return False
        if op in _FLOAT_ONLY:
            return dtype.is_float
        if op in _INT_ONLY:
            return dtype.is_int or dtype.is_bool
        if op in _NUMERIC:
            return not dtype.is_bool
        return op in _ANY

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        if self._device_target() is None:
            return EmulatedMemory(memory_limit)  # host memory behind device handles
        return DeviceMemory(gpu()[0], memory_limit)

    def compile(self, program: Program, target: str | None = None) -> bytes:
        target = target or self._device_target()
        self.target(target)
        caps = self.capabilities(target)
        program = pipeline.for_target(program, caps)
        if caps.fission:  # several reductions over few long rows: a kernel each, split
            program = schedule.fission(program,
                                       lambda piece: render_module.split(piece, caps)[0])
        tf32 = config.get().cuda_allow_tf32  # named by the target string (the cache key)
        kernels, delegated = [], []
        # Split reductions' partials live in scratch buffers numbered after the program's
        # (temporaries of the artifact, like the program's own).
        scratch: dict[str, dict] = {}
        for index, kernel in enumerate(program.kernels):
            plan = loops.plan(kernel, caps)
            if plan.unsupported and 0 not in kernel.domain:
                delegated.append({"kernel": index, "reason": plan.unsupported})
                continue
            pipeline.dump(program.name, f"{kernel.name}.loops", plan.dump())
            k = render(program, kernel, caps, len(program.buffers) + len(scratch), tf32)
            k["kernel"] = index
            scratch.update({str(s["index"]): s for s in k.pop("scratch")})
            kernels.append(k)
        source = PRELUDE + "".join(f"\n\n{k.pop('source')}" for k in kernels)
        pipeline.dump(program.name, "triton.py", source)
        temps = {str(i): b.nbytes for i, b in enumerate(program.buffers) if b.kind == "temp"}
        temps.update({i: s["count"] * np.dtype(s["dtype"]).itemsize
                      for i, s in scratch.items()})
        header = {"format": FORMAT, "program": program.name, "target": target,
                  "triton": triton_process.TRITON_VERSION, "source": source, "kernels": kernels,
                  "params": [i for i, b in enumerate(program.buffers) if b.kind != "temp"],
                  "temps": temps, "scratch": scratch, "allow_tf32": tf32,
                  "interpreted": delegated, "text": print_program(program)}
        if target is not None:
            header["compiled"] = _compile(source, kernels, TARGETS[target]) if kernels else []
        return json.dumps(header).encode()

    def describe(self, artifact: bytes) -> dict[str, Any]:
        header = json.loads(artifact)
        out = {"format": header["format"], "bytes": len(artifact), "target": header["target"],
               "triton": header["triton"], "source": header["source"],
               "kernels": header["kernels"], "allow_tf32": header.get("allow_tf32", False),
               "interpreted": [d["kernel"] for d in header["interpreted"]]}
        if "compiled" in header:
            out["compiled"] = [{k: v for k, v in c.items() if k not in ("ptx", "cubin")}
                               for c in header["compiled"]]
        return out

    def load(self, artifact: bytes) -> Executable:
        header = json.loads(artifact)
        device = self._device_target()
        if header["target"] == device:
            if device is None:
                return _Emulated(header)
            if self._temps is None:
                self._temps = DeviceMemory(gpu()[0])
            return DeviceProgram(artifact, gpu()[0], self._temps, _unaligned)
        where = f"this machine's GPU ({device})" if device else (
            "the emulation (HOLOGRAM_CUDA_EMULATE=1)" if config.get().cuda_emulate else
            f"no GPU here ({why_no_gpu()})")
        raise DeviceError(f"cuda: program {header['program']} was built for "
                          f"{header['target'] or 'the emulation'}, and runs on {where}; "
                          "build it again without a target (hologram.compile) to run it here")


def cubin(artifact: bytes, kernel: str) -> bytes:
    """The cubin of ``kernel`` in an artifact built for a named target."""
    for c in json.loads(artifact).get("compiled", ()):
        if c["name"] == kernel:
            return base64.b64decode(c["cubin"])
    raise DeviceError(f"cuda: no compiled kernel {kernel!r} in this artifact")


def ptx(artifact: bytes, kernel: str) -> str:
    """The PTX of ``kernel`` in an artifact built for a named target."""
    for c in json.loads(artifact).get("compiled", ()):
        if c["name"] == kernel:
            return c["ptx"]
    raise DeviceError(f"cuda: no compiled kernel {kernel!r} in this artifact")


# Read from ptxas -v: "Used 10 registers, used 0 barriers, 380 bytes cmem[0]" and
# "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads".
_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")
# cuobjdump -res-usage on the cubin: "REG:32 STACK:0 SHARED:64 LOCAL:0 ...".
_CUBIN_REGISTERS = re.compile(r"REG:(\d+)")


def resources(ptxas_report: str, metadata: dict, cuobjdump_report: str = "") -> dict:
    """Registers, spills and stack (``ptxas -v`` on the kernel's PTX), registers of the
    cubin itself (``cuobjdump -res-usage``), shared memory, warps and global scratch
    (Triton's metadata) of one compiled kernel."""
    registers = _REGISTERS.search(ptxas_report)
    spills = _SPILLS.search(ptxas_report)
    stack = _STACK.search(ptxas_report)
    cubin = _CUBIN_REGISTERS.search(cuobjdump_report)
    if registers is None or spills is None:
        raise DeviceError(f"cuda: cannot read registers and spills from ptxas -v's report:\n"
                          f"{ptxas_report}")
    return {"registers": int(registers.group(1)),
            "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2)),
            "stack": int(stack.group(1)) if stack else 0,
            "cubin_registers": int(cubin.group(1)) if cubin else None,
            "shared": int(metadata["shared"]), "num_warps": int(metadata["num_warps"]),
            "global_scratch_size": int(metadata.get("global_scratch_size", 0)),
            "profile_scratch_size": int(metadata.get("profile_scratch_size", 0))}


def _unaligned(artifact: bytes) -> bytes:
    """``artifact`` with its kernels compiled for pointers of any alignment (a program's
    twin for views that start between 16-byte boundaries: a torch view's data pointer)."""
    header = json.loads(artifact)
    header["compiled"] = _compile(header["source"], header["kernels"],
                                  TARGETS[header["target"]], alignment=1)
    return json.dumps(header).encode()


def _compile(source: str, kernels: list[dict], arch: int, alignment: int = ALIGNMENT
             ) -> list[dict]:
    """Every kernel compiled for ``arch``, its pointers known to be multiples of
    ``alignment`` bytes: from the disk cache of compiled kernels (:mod:`.kernels`), the
    rest by Triton (one request for all of them) and stored."""
    found = gpu()
    driver = found[0].version() if found is not None else None
    # (the aligned kernels' keys predate the alignment: only the twins name it)
    options = OPTIONS if alignment == ALIGNMENT else {**OPTIONS, "alignment": alignment}
    keys = [kernels_cache.key(source, k, options, arch, driver) for k in kernels]
    out = [kernels_cache.load(key) for key in keys]
    missing = [i for i, entry in enumerate(out) if entry is None]
    if not missing:
        return out
    request = {"op": "compile", "source": source, "arch": arch, "options": OPTIONS,
               "alignment": alignment,
               "kernels": [{"name": kernels[i]["name"], "signature": kernels[i]["signature"],
                            "num_warps": kernels[i]["num_warps"],
                            "num_stages": kernels[i]["num_stages"]} for i in missing]}
    reply = triton_process.call("compile", request, source)
    for i, c in zip(missing, reply["kernels"]):
        md = c["metadata"]
        keep = ("name", "num_warps", "num_ctas", "shared", "global_scratch_size",
                "profile_scratch_size", "arch", "triton_version", "hash")
        out[i] = {"name": c["name"], "ptx": c["ptx"],
                  "cubin": base64.b64encode(c["cubin"]).decode(),
                  "metadata": {k: md[k] for k in keep if k in md},
                  "resources": resources(c["ptxas"], md, c["cuobjdump"])}
        kernels_cache.store(keys[i], out[i])
    return out


# Storage dtypes as the interpreter's torch tensors take them.
def _for_torch(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return array.view(np.uint8)
    if array.dtype == np.uint16:  # bf16 bits
        return array.view(np.int16)
    return array


class _Emulated(Executable):
    """Runs the artifact's kernels in Triton's interpreter (a child process) on the
    emulated device memory (:mod:`.emulated`: its handles are untagged to the host
    addresses behind them); temporaries are the executable's own host arrays."""

    _warned: ClassVar[set[str]] = set()

    def __init__(self, header: dict):
        self.header = header
        self.program = parse_program(header["text"])
        self.steps = sorted([("triton", k["kernel"], k) for k in header["kernels"]] +
                            [("interp", d["kernel"], d) for d in header["interpreted"]],
                            key=lambda s: s[1])

    def launch(self, handles: tuple[int, ...]) -> None:
        program = self.program
        if len(handles) != len(program.params):
            raise ShapeError(f"cuda program {program.name}: takes {len(program.params)} "
                             f"buffers, got {len(handles)}")
        given = iter(host_arrays(program.params, [untag(h) for h in handles]))
        memory = []
        for buf in program.buffers:
            if buf.kind != "temp":
                memory.append(next(given))
            else:
                memory.append(np.full(buf.nbytes, 0xFF, np.uint8).view(buf.dtype.storage))
        for index in sorted(map(int, self.header.get("scratch", {}))):
            s = self.header["scratch"][str(index)]
            assert index == len(memory), "scratch buffers follow the program's, in order"
            size = s["count"] * np.dtype(s["dtype"]).itemsize  # else written before read
            memory.append(np.full(size, 0 if s["zeroed"] else 0xFF, np.uint8)
                          .view(s["dtype"]))
        for how, index, step in self.steps:
            if how == "interp":
                self._interpret(index, step["reason"], memory)
            elif step["grid"] > 0:
                arrays = [_for_torch(memory[i]) for i in step["buffers"]]
                reply = triton_process.call("interpret", {
                    "op": "run", "source": self.header["source"], "name": step["name"],
                    "grid": (step["grid"],), "arrays": arrays}, self.header["source"])
                writes = step["writes"]
                for i, result in zip(step["buffers"], reply["arrays"]):
                    if i in writes:
                        _for_torch(memory[i])[...] = result

    def _interpret(self, index: int, reason: str, memory: list[np.ndarray]) -> None:
        # Lazy: only programs with a delegated kernel need the interpreter.
        from hologram.backends.interp.interpreter import run_kernel

        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"the cuda backend runs a kernel on the reference interpreter: "
                          f"{reason}", stacklevel=3)
        run_kernel(self.program, self.program.kernels[index], memory)


__all__ = ["TARGETS", "CudaBackend", "cubin", "ptx", "resources"]
