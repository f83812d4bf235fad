"""The Triton process: run as a script (``python _child.py compile|interpret``) by
:mod:`hologram.backends.cuda.triton_process`, never imported by Hologram.

Why a separate process: Triton's ``libtriton`` carries its own LLVM, and loading it into a
process where llvmlite's shared LLVM (the cpu backend's) is already initialized crashes
in LLVM's option registry (a segfault in ``cl::Option::addArgument``, Triton 3.9.0 with
Debian's libLLVM-15). So this script imports Triton first and Hologram never.

Protocol: length-prefixed pickles on stdin/stdout. Requests are dicts with ``"op"``:

- ``compile``: ``source`` (a Triton module), ``kernels`` (``[{"name", "signature",
  "num_warps", "num_stages"}]``), ``arch`` (80, 90), ``options``, ``alignment`` (bytes
  every pointer argument is a multiple of); answers per kernel the PTX, the cubin,
  Triton's metadata and ``ptxas -v``'s report on the PTX.
- ``run`` (interpret mode): ``source``, ``name``, ``grid``, ``arrays`` (NumPy arrays, one
  per pointer argument); answers the arrays after the run.
"""

import hashlib
import importlib.util
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import traceback
import warnings

triton = None  # imported by main(), first (see the module docstring), never on import
_modules: dict = {}
_dir = ""


def _module(source: str):
    """The module of ``source``, written to a file (``@triton.jit`` reads its source)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:20]
    if key not in _modules:
        path = os.path.join(_dir, f"k_{key}.py")
        with open(path, "w") as f:
            f.write(source)
        spec = importlib.util.spec_from_file_location(f"hologram_triton_{key}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[key] = module
    return _modules[key]


def _ptxas_report(ptx: str, arch: int) -> str:
    """``ptxas -v`` on the PTX Triton produced, with the ptxas Triton itself uses for the
    architecture (``get_ptxas``) and its naming (sm_90a for capability 90)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(arch).path
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", dir=_dir, delete=False) as f:
        f.write(ptx)
    out = f.name + ".cubin"
    # The options Triton 3.9.0's make_cubin passes (enable_fp_fusion=False), whose own
    # report it deletes; the cubin's registers (cuobjdump) are checked against these.
    done = subprocess.run([ptxas, "-lineinfo", "--fmad=false", "-v", "--regAllocOptLevel=2",
                           f"--gpu-name={sm_arch_from_capability(arch)}",
                           f.name, "-o", out], capture_output=True, text=True)
    return done.stdout + done.stderr


def _cuobjdump_report(cubin: bytes) -> str:
    """``cuobjdump -res-usage`` on the cubin itself (registers, shared, local memory)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", dir=_dir, delete=False) as f:
        f.write(cubin)
    done = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", f.name],
                          capture_output=True, text=True)
    return done.stdout + done.stderr


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def compile_kernels(request: dict) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = _module(request["source"])
    target = GPUTarget("cuda", request["arch"], 32)
    out = []
    for k in request["kernels"]:
        fn = getattr(module, k["name"])
        options = dict(request["options"], num_warps=k["num_warps"],
                       num_stages=k["num_stages"])
        attrs = {(i,): [["tt.divisibility", request["alignment"]]]
                 for i in range(len(k["signature"]))}
        compiled = triton.compile(ASTSource(fn=fn, signature=k["signature"], constexprs={},
                                            attrs=attrs),
                                  target=target, options=options)
        md = compiled.metadata
        metadata = {f: _plain(getattr(md, f)) for f in md._fields}
        out.append({"name": k["name"], "ptx": compiled.asm["ptx"],
                    "cubin": compiled.asm["cubin"], "metadata": metadata,
                    "ptxas": _ptxas_report(compiled.asm["ptx"], request["arch"]),
                    "cuobjdump": _cuobjdump_report(compiled.asm["cubin"])})
    return {"kernels": out, "triton": triton.__version__}


def run_kernel(request: dict) -> dict:
    import torch

    fn = getattr(_module(request["source"]), request["name"])
    arrays = request["arrays"]
    fn[tuple(request["grid"])](*(torch.from_numpy(a) for a in arrays))
    return {"arrays": arrays}


def main() -> None:
    global triton, _dir
    if sys.argv[1] == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before any @triton.jit runs
        # NumPy's warnings on inf - inf, NaN compares: the ISA defines those results.
        warnings.filterwarnings("ignore", category=RuntimeWarning)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
    import triton as imported

    triton = imported
    _dir = tempfile.mkdtemp(prefix="hologram-triton-")
    # The replies get the real stdout; anything printed (Triton's own output) goes to stderr.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        request = pickle.loads(stdin.read(struct.unpack("<Q", head)[0]))
        try:
            handler = compile_kernels if request["op"] == "compile" else run_kernel
            reply = {"ok": True, **handler(request)}
        except Exception as err:  # the parent raises it as a CompileError with the source
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}",
                     "traceback": traceback.format_exc()}
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(struct.pack("<Q", len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    main()
