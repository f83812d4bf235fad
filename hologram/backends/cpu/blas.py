"""Matrix multiply through the OpenBLAS that NumPy wheels ship, or PyTorch's MKL.

NumPy 2.x wheels bundle OpenBLAS (``numpy.libs/libscipy_openblas64_-<hash>.so`` on Linux,
``numpy/.dylibs`` on macOS) with prefixed, ILP64 symbols such as ``scipy_cblas_sgemm64_``.
Loading that same file with ctypes returns the handle NumPy already holds, so Hologram and
NumPy share one library and one BLAS thread pool. Where NumPy links another OpenBLAS, the
one mapped into this process (``/proc/self/maps``), the ``scipy_openblas64`` /
``scipy_openblas32`` packages and a system ``libopenblas`` are tried in that order.

The symbol prefix and suffix are found by probing the library (NumPy's build
configuration only orders the guesses); the integer width is 64 bits when the suffix says
so or when ``openblas_get_config()`` reports ``USE64BITINT``.

Products go to the MKL inside PyTorch's ``libtorch_cpu`` when this process has already
loaded it (``torch`` imported; this module never imports it). On a 2-core Intel Xeon
(Sapphire Rapids, one thread) its sgemm took 20-30% less time than OpenBLAS's (0.3.31
SkylakeX) at every shape of small models' layers: 64 x 512 x 512 174 µs against 228,
transposed A 512 x 512 x 64 182 against 222, transposed B 64 x 512 x 256 101 against 146.
On a 2-core AMD EPYC it ran at OpenBLAS's speed except for transposed B, where OpenBLAS's
row-major ``NT`` kernel is ~25% slower than its ``NN`` one and MKL's is not (64 x 512 x 512:
352 µs against 437), and no choice of operand order or CBLAS flags reaches OpenBLAS's fast
path without copying an operand. MKL also runs its threads on PyTorch's OpenMP threads,
which the cpu backend's own parallel kernels share in such a process (:mod:`.workers`).
Without torch, every product goes to OpenBLAS.

What is promised: :func:`gemm` computes ``C = alpha * op(A) @ op(B) + beta * C`` on
row-major matrices at raw addresses, with BLAS semantics (``beta == 0`` overwrites C
without reading it), and :func:`prepare_batched` a whole batch of such products in one
native call. It validates sizes and leading dimensions before calling into the
library, never calls it for empty products (``m``, ``n`` or ``k`` of 0), and raises
:class:`DeviceError` when no BLAS was found. OpenBLAS may be called from several threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import util as importlib_util

import numpy as np

from hologram.errors import DeviceError, DTypeError, HologramError, ShapeError

__all__ = ["HALF", "Entry", "available", "batch_offsets", "blas_threads", "describe", "entry",
           "gemm", "half_entry", "prepare", "prepare_batched", "set_blas_threads",
           "set_openblas_threads"]

#: CBLAS enum values (cblas.h); also the trampolines' constants (:mod:`.parallel_gemm`).
ROW_MAJOR = 101
NO_TRANS = 111
TRANS = 112

# (prefix, suffix) pairs, most likely first; NumPy's configuration may move one forward.
_NAMINGS = [("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")]


@dataclass(frozen=True)
class _Library:
    path: str
    prefix: str
    suffix: str
    int64: bool
    sgemm: Callable[..., None]  # ctypes function pointers with argtypes set
    dgemm: Callable[..., None]
    set_threads: Callable[[int], None] | None
    get_threads: Callable[[], int] | None
    version: str
    core: str


@dataclass(frozen=True)
class _Mkl:
    """PyTorch's MKL: the Fortran ``sgemm_``/``dgemm_`` entries (LP64: 32-bit integers,
    every argument by reference) and ``MKL_Set_Num_Threads_Local`` (by value; returns the
    calling thread's previous setting, 0 meaning MKL's global count). ``openmp``: the
    ``omp_get_max_threads``/``omp_set_num_threads`` of the OpenMP runtime MKL threads
    with, where found: MKL's mixed-precision products follow the calling thread's OpenMP
    count and not MKL's setting (on an AMD EPYC, Zen 4, a product asked to run on one
    thread ran on PyTorch's two), so a product sets both."""

    path: str
    sgemm: int
    dgemm: int
    set_local_threads: Callable[[int], int]
    # ``cblas_sgemm_batch``/``cblas_dgemm_batch`` (row-major CBLAS, sizes and scalars in
    # arrays, one per group; 0 where the build lacks them)
    sgemm_batch: int = 0
    dgemm_batch: int = 0
    # ``cblas_gemm_bf16bf16f32``/``cblas_gemm_f16f16f32`` (row-major CBLAS, by value):
    # half-precision operands, float32 C and scalars
    half_gemm: tuple[tuple[str, int], ...] = ()
    openmp: tuple[Callable[[], int], Callable[[int], None]] | None = None


#: Operand dtypes whose products are float32 matrices (:func:`prepare`).
HALF = ("bf16", "f16")
_lock = threading.Lock()
_state: _Library | str | None = None  # None: not looked yet; str: why none was found
_mkl_state: _Mkl | bool | None = None  # None: not looked yet; False: none
# The thread count MKL's products run on: the one set_blas_threads last set (0, until
# then: MKL's own, PyTorch's).
_mkl_threads = [0]
_INT32_MAX = 2**31 - 1


def _numpy_blas_config() -> dict:
    """NumPy's build-time BLAS entry (name, ``openblas configuration``), or {}."""
    try:
        info = np.show_config(mode="dicts")  # NumPy >= 1.26
        return dict(info.get("Build Dependencies", {}).get("blas", {}))
    except Exception:  # older NumPy, or a build without the metadata
        return {}


def _candidates() -> list[str]:
    """Library files to try, best first, without duplicates."""
    found: list[str] = []
    numpy_dir = os.path.dirname(np.__file__)
    for pattern in (
        os.path.join(os.path.dirname(numpy_dir), "numpy.libs", "*openblas*"),  # Linux/Win
        os.path.join(numpy_dir, ".dylibs", "*openblas*"),  # macOS wheels
    ):
        found += sorted(glob.glob(pattern))
    if sys.platform.startswith("linux"):
        # Whatever OpenBLAS NumPy actually loaded (conda, distro packages).
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    path = line.split()[-1] if "openblas" in line else ""
                    if path.startswith("/"):
                        found.append(path)
        except OSError:
            pass
    for package in ("scipy_openblas64", "scipy_openblas32"):
        if importlib_util.find_spec(package) is not None:
            try:
                module = __import__(package)
                found += sorted(glob.glob(os.path.join(module.get_lib_dir(), "*openblas*")))
            except Exception:
                pass
    system = ctypes.util.find_library("openblas")
    if system:
        found.append(system)
    shared = (".so", ".dylib", ".dll")
    return list(dict.fromkeys(p for p in found if any(s in os.path.basename(p) for s in shared)))


def _bind(path: str, namings: list[tuple[str, str]]) -> _Library | None:
    """Load ``path`` and bind the gemm entry points, or None if it has none we know."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for prefix, suffix in namings:
        try:
            sgemm = getattr(lib, f"{prefix}cblas_sgemm{suffix}")
            dgemm = getattr(lib, f"{prefix}cblas_dgemm{suffix}")
        except AttributeError:
            continue

        def optional(name: str, prefix: str = prefix, suffix: str = suffix):
            return getattr(lib, f"{prefix}openblas_{name}{suffix}", None)

        config = ""
        get_config = optional("get_config")
        if get_config is not None:
            get_config.restype = ctypes.c_char_p
            config = (get_config() or b"").decode(errors="replace")
        core = ""
        get_core = optional("get_corename")
        if get_core is not None:
            get_core.restype = ctypes.c_char_p
            core = (get_core() or b"").decode(errors="replace")
        int64 = "64" in suffix or "USE64BITINT" in config
        integer = ctypes.c_int64 if int64 else ctypes.c_int32
        for fn, real in ((sgemm, ctypes.c_float), (dgemm, ctypes.c_double)):
            fn.restype = None
            fn.argtypes = [
                ctypes.c_int, ctypes.c_int, ctypes.c_int,  # order, trans_a, trans_b
                integer, integer, integer,  # m, n, k
                real, ctypes.c_void_p, integer,  # alpha, a, lda
                ctypes.c_void_p, integer,  # b, ldb
                real, ctypes.c_void_p, integer,  # beta, c, ldc
            ]
        set_threads = optional("set_num_threads")
        if set_threads is not None:
            set_threads.restype = None
            set_threads.argtypes = [ctypes.c_int]  # plain int even in ILP64 builds
        get_threads = optional("get_num_threads")
        if get_threads is not None:
            get_threads.restype = ctypes.c_int
            get_threads.argtypes = []
        words = config.split()
        version = " ".join(words[:2]) if words[:1] == ["OpenBLAS"] else "BLAS"
        return _Library(path, prefix, suffix, int64, sgemm, dgemm, set_threads, get_threads,
                        version, core)
    return None


def _load() -> _Library | str:
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                namings = list(_NAMINGS)
                config = _numpy_blas_config()
                if "scipy" not in str(config.get("name", "")):
                    namings.sort(key=lambda pair: pair[0] != "")  # plain names first
                tried = _candidates()
                library = None
                for path in tried:
                    library = _bind(path, namings)
                    if library is not None:
                        break
                _state = library or (
                    "no BLAS with cblas_sgemm/cblas_dgemm was found; looked in "
                    "<numpy>/../numpy.libs and <numpy>/.dylibs for *openblas*, the "
                    "OpenBLAS mapped into this process, the scipy_openblas64/32 packages "
                    "and ctypes.util.find_library('openblas')"
                    + (f" (tried: {', '.join(tried)})" if tried else "")
                    + "; install numpy>=2 from PyPI wheels or scipy-openblas64"
                )
    return _state


def _torch_library() -> str | None:
    """The path of the ``libtorch_cpu`` an imported ``torch`` loaded, or None."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))
    return found[0] if found else None


def _mkl() -> _Mkl | None:
    """PyTorch's MKL when ``torch`` is imported and its library exports the entries, else
    None. Looked up once ``torch`` is imported (not before: it may be imported later)."""
    global _mkl_state
    if _mkl_state is None:
        path = _torch_library()
        if path is None:
            return None
        with _lock:
            if _mkl_state is None:
                _mkl_state = _bind_mkl(path) or False
    return _mkl_state or None


def _bind_mkl(path: str) -> _Mkl | None:
    try:
        lib = ctypes.CDLL(path)  # already loaded by torch: the same handle
        sgemm, dgemm = lib.sgemm_, lib.dgemm_
        set_local = lib.MKL_Set_Num_Threads_Local
    except (OSError, AttributeError):  # a build of PyTorch without MKL
        return None
    set_local.restype = ctypes.c_int
    set_local.argtypes = [ctypes.c_int]
    address = ctypes.c_void_p

    def optional(name: str) -> int:
        fn = getattr(lib, name, None)
        return 0 if fn is None else ctypes.cast(fn, address).value

    half = tuple((dtype, optional(f"cblas_gemm_{dtype}{dtype}f32")) for dtype in HALF)
    # libtorch_cpu's OpenMP runtime, found through its handle (dlsym searches the
    # libraries it depends on)
    omp_get, omp_set = (getattr(lib, name, None)
                        for name in ("omp_get_max_threads", "omp_set_num_threads"))
    openmp = None
    if omp_get is not None and omp_set is not None:
        omp_get.restype, omp_get.argtypes = ctypes.c_int, []
        omp_set.restype, omp_set.argtypes = None, [ctypes.c_int]
        openmp = (omp_get, omp_set)
    return _Mkl(path, ctypes.cast(sgemm, address).value, ctypes.cast(dgemm, address).value,
                set_local, optional("cblas_sgemm_batch"), optional("cblas_dgemm_batch"),
                tuple((dtype, fn) for dtype, fn in half if fn), openmp)


def available() -> bool:
    """True when a BLAS library was found and bound."""
    return isinstance(_load(), _Library)


def describe() -> str:
    """One line naming the library for reports, e.g. ``"OpenBLAS 0.3.29 SkylakeX
    (scipy_openblas64_, libscipy_openblas64_-abc.so)"``; says why when there is none."""
    lib = _load()
    if not isinstance(lib, _Library):
        return f"no BLAS: {lib}"
    core = f" {lib.core}" if lib.core else ""
    naming = f"{lib.prefix}openblas{lib.suffix}"
    mkl = _mkl()
    also = f"; products on MKL ({os.path.basename(mkl.path)})" if mkl else ""
    return f"{lib.version}{core} ({naming}, {os.path.basename(lib.path)}){also}"


def set_blas_threads(n: int) -> None:
    """Set the library's own thread count (``n >= 1``); a no-op without a BLAS. NumPy shares
    the library, so this also changes NumPy's matmul threads."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HologramError(f"set_blas_threads({n!r}): expected an integer >= 1")
    _mkl_threads[0] = n
    lib = _load()
    if isinstance(lib, _Library) and lib.set_threads is not None:
        lib.set_threads(n)


def thread_setter() -> Callable[[int], None]:
    """:func:`set_blas_threads` without its checks, for hot paths that pass a valid count
    (for MKL's products only, without a BLAS or without the library's setter)."""
    lib = _load()
    if isinstance(lib, _Library) and lib.set_threads is not None:
        openblas = lib.set_threads

        def set_threads(n: int) -> None:
            _mkl_threads[0] = n
            openblas(n)

        return set_threads
    return _mkl_threads_only


def set_openblas_threads(n: int) -> None:
    """OpenBLAS's thread count only (``n >= 1``, unchecked; MKL's products keep theirs); a
    no-op without the library's setter."""
    lib = _load()
    if isinstance(lib, _Library) and lib.set_threads is not None:
        lib.set_threads(n)


def _mkl_threads_only(n: int) -> None:
    """No OpenBLAS thread count to set: only the one MKL's products run on."""
    _mkl_threads[0] = n


def blas_threads() -> int:
    """The library's current thread count (1 without a BLAS or without the query)."""
    lib = _load()
    if isinstance(lib, _Library) and lib.get_threads is not None:
        return int(lib.get_threads())
    return 1


def _scale(dtype: str, m: int, n: int, beta: float, c: int, ldc: int) -> None:
    """C = beta * C for an m x n row-major block: what gemm means when k == 0."""
    if beta == 1.0:
        return
    ctype = ctypes.c_float if dtype == "f32" else ctypes.c_double
    size = ctypes.sizeof(ctype)
    flat = np.ctypeslib.as_array((ctype * ((m - 1) * ldc + n)).from_address(c))
    block = np.lib.stride_tricks.as_strided(flat, (m, n), (ldc * size, size))
    if beta == 0.0:
        block[...] = 0  # BLAS semantics: C is not read, so NaNs in it disappear
    else:
        block *= beta  # a Python float stays weak: the product is in C's precision


def gemm(dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int,
         alpha: float, a: int, lda: int, b: int, ldb: int,
         beta: float, c: int, ldc: int) -> None:
    """``C = alpha * op(A) @ op(B) + beta * C`` for row-major matrices at raw addresses.

    ``op(A)`` is m x k (A is stored k x m when ``trans_a``), ``op(B)`` is k x n, C is m x n;
    ``lda``, ``ldb``, ``ldc`` are row strides in elements and must cover a stored row.
    ``dtype`` is the operands' dtype: ``"f32"`` or ``"f64"`` (C's too), or ``"bf16"`` or
    ``"f16"`` with C (and alpha, beta) in float32. Nothing happens when m or n is 0; when
    k is 0, C is scaled by beta without calling the library.
    """
    prepare(dtype, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc)(a, b, c)


def prepare(dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int,
            alpha: float, lda: int, ldb: int, beta: float, ldc: int,
            library: str | None = None) -> Callable[[int, int, int], None]:
    """:func:`gemm` with everything but the addresses fixed and checked once: returns
    ``call(a, b, c)``, which checks only that the addresses are not null. For launches
    that repeat one product (a compiled program's GEMM step): the library call then
    passes ready ctypes objects instead of converting 14 arguments each time.

    ``library``: ``"openblas"``, ``"mkl"`` (PyTorch's; :class:`DeviceError` when the
    process has none) or None: MKL where the process has it, else OpenBLAS (see the
    module's docstring). Products of f16/bf16 matrices go to MKL's mixed-precision entry
    (``cblas_gemm_bf16bf16f32``, ``cblas_gemm_f16f16f32``: float32 products and sums, as
    the ISA's ``contract`` defines them) where the process has it; elsewhere both
    operands are widened to float32 copies first (:func:`_prepare_half`)."""
    if dtype not in ("f32", "f64") + HALF:
        raise DTypeError(f"gemm: dtype {dtype!r} is not supported by BLAS; use 'f32', 'f64', "
                         f"'bf16' or 'f16'")
    if m < 0 or n < 0 or k < 0:
        raise ShapeError(f"gemm: sizes m={m}, n={n}, k={k} must be >= 0")
    lib = _load()
    if not isinstance(lib, _Library):
        raise DeviceError(f"gemm: {lib}")
    if m == 0 or n == 0:
        return _nothing
    if ldc < n:
        raise ShapeError(f"gemm: ldc={ldc} < {n}: C is {m} x {n}, row-major; pass its row stride "
                         f"in elements")
    if k == 0:
        def scale(a: int, b: int, c: int) -> None:
            if not c:
                raise HologramError("gemm: C is a null address")
            _scale("f32" if dtype in HALF else dtype, m, n, beta, c, ldc)
        return scale
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    if lda < a_cols:
        raise ShapeError(f"gemm: lda={lda} < {a_cols}: A is stored {a_rows} x {a_cols}, "
                         f"row-major; pass its row stride in elements")
    if ldb < b_cols:
        raise ShapeError(f"gemm: ldb={ldb} < {b_cols}: B is stored {b_rows} x {b_cols}, "
                         f"row-major; pass its row stride in elements")
    mkl = _choose_mkl(library, max(m, n, k, lda, ldb, ldc))
    if dtype in HALF:
        return _prepare_half(mkl, dtype, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta,
                             ldc, library)
    if mkl is not None:
        return _prepare_mkl(mkl, dtype, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc)
    fn = lib.sgemm if dtype == "f32" else lib.dgemm
    # The same function without a prototype, called with ctypes objects only (addresses as
    # c_void_p: a bare int would travel as a C int).
    raw = _RAW(ctypes.cast(fn, ctypes.c_void_p).value)
    integer = ctypes.c_int64 if lib.int64 else ctypes.c_int32
    real = ctypes.c_float if dtype == "f32" else ctypes.c_double
    head = (ctypes.c_int(ROW_MAJOR), ctypes.c_int(TRANS if trans_a else NO_TRANS),
            ctypes.c_int(TRANS if trans_b else NO_TRANS), integer(m), integer(n), integer(k),
            real(alpha))
    lda_, ldb_, beta_, ldc_ = integer(lda), integer(ldb), real(beta), integer(ldc)
    pointer = ctypes.c_void_p

    def call(a: int, b: int, c: int) -> None:
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        raw(*head, pointer(a), lda_, pointer(b), ldb_, beta_, pointer(c), ldc_)

    return call


def _prepare_half(mkl: _Mkl | None, dtype: str, trans_a: bool, trans_b: bool, m: int,
                  n: int, k: int, alpha: float, lda: int, ldb: int, beta: float, ldc: int,
                  library: str | None) -> Callable[[int, int, int], None]:
    """:func:`prepare`'s call for f16/bf16 operands, sizes already checked: MKL's entry for
    ``dtype`` (threads as :func:`_prepare_mkl`'s), or, without one, a float32 product of
    widened copies of A and B. MKL's kernels on CPUs with bfloat16 dot-product
    instructions (AVX512-BF16, AMX) read subnormal bfloat16 operands as zero, as
    PyTorch's own bfloat16 products there do; the widened copies keep them."""
    entry = dict(mkl.half_gemm).get(dtype) if mkl is not None else None
    if entry:
        raw = _RAW(entry)
        i32, f32 = ctypes.c_int32, ctypes.c_float
        head = (ctypes.c_int(ROW_MAJOR), ctypes.c_int(TRANS if trans_a else NO_TRANS),
                ctypes.c_int(TRANS if trans_b else NO_TRANS), i32(m), i32(n), i32(k),
                f32(alpha))
        lda_, ldb_, beta_, ldc_ = i32(lda), i32(ldb), f32(beta), i32(ldc)
        pointer = ctypes.c_void_p
        return _on_mkl_threads(mkl, lambda a, b, c: raw(
            *head, pointer(a), lda_, pointer(b), ldb_, beta_, pointer(c), ldc_))
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    widen_a, widen_b = _widener(dtype, *a_shape, lda), _widener(dtype, *b_shape, ldb)
    product = prepare("f32", trans_a, trans_b, m, n, k, alpha, a_shape[1], b_shape[1], beta,
                      ldc, library)

    def widened(a: int, b: int, c: int) -> None:
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        wa, wb = widen_a(a), widen_b(b)
        product(wa.ctypes.data, wb.ctypes.data, c)

    return widened


def half_entry(dtype: str, largest: int, library: str | None = None) -> Entry | None:
    """The :class:`Entry` (``"cblas"``, 32-bit integers, MKL's thread setters) of MKL's
    mixed-precision entry for f16/bf16 ``dtype``, for products whose largest size or
    leading dimension is ``largest``, or None where :func:`prepare` would widen the
    operands instead (no such MKL in the process, or ``library`` says OpenBLAS)."""
    mkl = _choose_mkl(library, largest)
    entry = dict(mkl.half_gemm).get(dtype) if mkl is not None else None
    if not entry:
        return None
    return Entry("cblas", entry, False, *_mkl_setters(mkl))


def _mkl_setters(mkl: _Mkl) -> tuple[int, tuple[int, int]]:
    """The addresses of MKL's thread setter and of the OpenMP count's (0, 0: none)."""
    address = ctypes.c_void_p
    openmp = tuple(ctypes.cast(fn, address).value for fn in mkl.openmp or ())
    return ctypes.cast(mkl.set_local_threads, address).value, openmp or (0, 0)


def _widener(dtype: str, rows: int, cols: int, ld: int) -> Callable[[int], np.ndarray]:
    """``widen(address)``: a contiguous float32 copy of the rows x cols f16/bf16 matrix
    stored at ``address`` with row stride ``ld``."""
    count = (rows - 1) * ld + cols

    def widen(address: int) -> np.ndarray:
        flat = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(address))
        block = np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 2, 2))
        if dtype == "f16":
            return block.view(np.float16).astype(np.float32)
        return (block.astype(np.uint32) << 16).view(np.float32)  # bf16: the high half

    return widen


def _choose_mkl(library: str | None, largest: int) -> _Mkl | None:
    """The MKL that a product goes to (see the module docstring), or None for OpenBLAS;
    ``largest``: its largest size or leading dimension (MKL's are 32-bit)."""
    if library not in (None, "openblas", "mkl"):
        raise HologramError(f"gemm: library {library!r}: expected 'openblas', 'mkl' or None")
    mkl = _mkl() if library != "openblas" else None
    if library == "mkl" and mkl is None:
        raise DeviceError("gemm: no MKL in this process (it comes with an imported torch "
                          "whose libtorch_cpu exports sgemm_)")
    return mkl if mkl is not None and largest <= _INT32_MAX else None


@dataclass(frozen=True)
class Entry:
    """The gemm entry :func:`prepare` calls, for native code that calls it itself
    (:mod:`.parallel_gemm`). ``abi``: ``"cblas"`` (row-major CBLAS, arguments by value,
    64-bit integers when ``int64``) or ``"fortran"`` (MKL's LP64 Fortran entry, every
    argument by reference). For MKL's entries (Fortran, and its mixed-precision CBLAS
    ones), ``set_local_threads`` is the address of its ``MKL_Set_Num_Threads_Local`` and
    ``openmp`` those of ``omp_get_max_threads`` and ``omp_set_num_threads`` (0, 0 where
    not found; see :class:`_Mkl`); 0 and (0, 0) for OpenBLAS."""

    abi: str
    address: int
    int64: bool
    set_local_threads: int
    openmp: tuple[int, int] = (0, 0)


def entry(dtype: str, largest: int, library: str | None = None) -> Entry:
    """The :class:`Entry` of the products :func:`prepare` makes for ``dtype`` whose largest
    size or leading dimension is ``largest`` (the caller has checked them with
    :func:`prepare`)."""
    lib = _load()
    if not isinstance(lib, _Library):
        raise DeviceError(f"gemm: {lib}")
    mkl = _choose_mkl(library, largest)
    if mkl is not None:
        return Entry("fortran", mkl.sgemm if dtype == "f32" else mkl.dgemm, False,
                     *_mkl_setters(mkl))
    fn = lib.sgemm if dtype == "f32" else lib.dgemm
    return Entry("cblas", ctypes.cast(fn, ctypes.c_void_p).value, lib.int64, 0)


def _prepare_mkl(mkl: _Mkl, dtype: str, trans_a: bool, trans_b: bool, m: int, n: int,
                 k: int, alpha: float, lda: int, ldb: int, beta: float, ldc: int
                 ) -> Callable[[int, int, int], None]:
    """:func:`prepare`'s call through MKL's Fortran entry, sizes already checked. Row-major
    ``C = op(A) @ op(B)`` is column-major ``C.T = op(B).T @ op(A).T``: the same memory with
    the operands swapped. The call runs on the count :func:`set_blas_threads` last set,
    as a setting of the calling thread put back afterwards (PyTorch's own MKL calls on it
    keep PyTorch's count)."""
    raw = _RAW(mkl.sgemm if dtype == "f32" else mkl.dgemm)
    real = ctypes.c_float if dtype == "f32" else ctypes.c_double

    def ref(value):
        return ctypes.pointer(value)

    flag = {False: ctypes.c_char(b"N"), True: ctypes.c_char(b"T")}
    head = (ref(flag[trans_b]), ref(flag[trans_a]), ref(ctypes.c_int32(n)),
            ref(ctypes.c_int32(m)), ref(ctypes.c_int32(k)), ref(real(alpha)))
    ldb_, lda_ = ref(ctypes.c_int32(ldb)), ref(ctypes.c_int32(lda))
    tail = (ref(real(beta)),)
    ldc_ = ref(ctypes.c_int32(ldc))
    pointer = ctypes.c_void_p
    return _on_mkl_threads(mkl, lambda a, b, c: raw(
        *head, pointer(b), ldb_, pointer(a), lda_, *tail, pointer(c), ldc_))


def _on_mkl_threads(mkl: _Mkl, run: Callable[[int, int, int], None]
                    ) -> Callable[[int, int, int], None]:
    """``call(a, b, c)``: ``run(a, b, c)`` (an MKL product at those addresses, checked not
    null) on the count :func:`set_blas_threads` last set, as a setting of the calling
    thread (MKL's, and OpenMP's where found) put back afterwards."""
    set_local, count = mkl.set_local_threads, _mkl_threads
    omp_get, omp_set = mkl.openmp or (None, None)

    def call(a: int, b: int, c: int) -> None:
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        n = count[0]
        previous = set_local(n)
        omp = omp_get() if omp_get is not None and n > 0 else 0
        if omp:
            omp_set(n)
        try:
            run(a, b, c)
        finally:
            set_local(previous)
            if omp:
                omp_set(omp)

    return call


def prepare_batched(dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int,
                    lda: int, ldb: int, ldc: int, batch: tuple[int, ...],
                    a_strides: tuple[int, ...], b_strides: tuple[int, ...],
                    c_strides: tuple[int, ...], library: str | None = None
                    ) -> Callable[[int, int, int], None]:
    """``C[i] = op(A[i]) @ op(B[i])`` for every index ``i`` of the batch shape ``batch``,
    checked once; returns ``call(a, b, c)`` like :func:`prepare` (``library`` as there).
    Matrix ``i`` of an operand starts ``sum(i[d] * strides[d])`` elements after its
    address (a stride may be 0: one matrix used by the whole batch); each matrix is laid
    out as :func:`gemm` says.

    With MKL, the batch is one call of its ``cblas_?gemm_batch`` on arrays of the
    matrices' addresses. On the 2-core Intel Xeon, one thread, batches of 64 attention
    products: 26 µs against NumPy's 40 for 32 x 32 x 16 with B transposed, 23 against 28
    for B's rows 1024 elements apart, the same (20 µs) for the rest. Without MKL, one call
    of NumPy's matmul loop, which calls OpenBLAS for each matrix from C: a Python loop of
    :func:`prepare` calls costs ~1.5 µs of argument passing per matrix, more than a 32 x
    16 @ 16 x 32 product itself. (OpenBLAS's own ``cblas_?gemm_batch`` entries crash in
    the wheels' builds tried, 0.3.31.) f16/bf16 operands have no batched entry: their
    products are such a loop of :func:`prepare`'s calls."""
    batch = tuple(batch)
    if not len(batch) == len(a_strides) == len(b_strides) == len(c_strides):
        raise ShapeError(f"gemm batch {list(batch)}: strides {list(a_strides)}, "
                         f"{list(b_strides)}, {list(c_strides)} need one per batch dimension")
    if any(size < 0 for size in batch):
        raise ShapeError(f"gemm batch {list(batch)}: sizes must be >= 0")
    single = prepare(dtype, trans_a, trans_b, m, n, k, 1.0, lda, ldb, 0.0, ldc,
                     library)  # the checks
    if not batch:
        return single
    if single is _nothing or math.prod(batch) == 0:
        return _nothing
    if dtype in HALF:  # no batched entry: the single product, matrix by matrix
        steps = list(zip(*(batch_offsets(batch, s, size).tolist() for s, size in
                           ((a_strides, 2), (b_strides, 2), (c_strides, 4)))))

        def each(a: int, b: int, c: int) -> None:
            if not (a and b and c):
                raise HologramError("gemm: A, B or C is a null address")
            for da, db, dc in steps:
                single(a + da, b + db, c + dc)

        return each
    size = 4 if dtype == "f32" else 8
    mkl = _choose_mkl(library, max(m, n, k, lda, ldb, ldc, math.prod(batch)))
    entry = mkl and (mkl.sgemm_batch if dtype == "f32" else mkl.dgemm_batch)
    if entry and k:
        return _prepare_mkl_batched(mkl, entry, dtype, trans_a, trans_b, m, n, k, lda, ldb,
                                    ldc, [batch_offsets(batch, s, size)
                                          for s in (a_strides, b_strides, c_strides)])
    typestr = "<f4" if dtype == "f32" else "<f8"

    def layout(rows: int, cols: int, ld: int, transposed: bool, strides: tuple[int, ...]):
        """The interface dict of op(X)'s batched view: rows x cols, ld-strided storage."""
        inner = (size, ld * size) if transposed else (ld * size, size)
        return {"shape": (*batch, rows, cols), "typestr": typestr, "version": 3,
                "strides": tuple(s * size for s in strides) + inner, "data": (0, False)}

    views = [layout(m, k, lda, trans_a, a_strides), layout(k, n, ldb, trans_b, b_strides),
             layout(m, n, ldc, False, c_strides)]
    holders = [_View(), _View(), _View()]
    matmul, asarray = np.matmul, np.asarray
    lock = threading.Lock()  # the interface dicts are shared by concurrent calls

    def call(a: int, b: int, c: int) -> None:
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        with lock:
            arrays = []
            for holder, view, address in zip(holders, views, (a, b, c)):
                view["data"] = (address, False)
                holder.__array_interface__ = view
                arrays.append(asarray(holder))
        matmul(arrays[0], arrays[1], out=arrays[2])

    return call


def batch_offsets(batch: tuple[int, ...], strides: tuple[int, ...], size: int) -> np.ndarray:
    """The byte offset of each matrix of the batch, in row-major order of its indices."""
    grid = np.zeros((), np.uint64)
    for n, stride in zip(batch, strides):
        grid = grid[..., None] + np.arange(n, dtype=np.uint64) * np.uint64(stride * size)
    return grid.reshape(-1)


def _prepare_mkl_batched(mkl: _Mkl, entry: int, dtype: str, trans_a: bool, trans_b: bool,
                         m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
                         offsets: list[np.ndarray]) -> Callable[[int, int, int], None]:
    """:func:`prepare_batched`'s call through MKL's ``cblas_?gemm_batch``, one group of
    ``len(offsets[0])`` products, sizes already checked; threads as
    :func:`_prepare_mkl`'s."""
    raw = _RAW(entry)
    i32, real = ctypes.c_int32, (ctypes.c_float if dtype == "f32" else ctypes.c_double)

    def one(kind, value):  # the group's value, as an array of one
        return (kind * 1)(value)

    head = (i32(ROW_MAJOR), one(i32, TRANS if trans_a else NO_TRANS),
            one(i32, TRANS if trans_b else NO_TRANS), one(i32, m), one(i32, n), one(i32, k),
            one(real, 1.0))
    lda_, ldb_, beta, ldc_ = one(i32, lda), one(i32, ldb), one(real, 0.0), one(i32, ldc)
    groups = (i32(1), one(i32, len(offsets[0])))
    add = np.add
    local = threading.local()  # each calling thread fills address arrays of its own

    def run(a: int, b: int, c: int) -> None:
        try:
            arrays, pointers = local.state
        except AttributeError:
            arrays = [np.empty_like(o) for o in offsets]
            pointers = [ctypes.c_void_p(x.ctypes.data) for x in arrays]
            local.state = arrays, pointers
        for out, offset, base in zip(arrays, offsets, (a, b, c)):
            add(offset, base, out=out)
        raw(*head, pointers[0], lda_, pointers[1], ldb_, beta, pointers[2], ldc_, *groups)

    return _on_mkl_threads(mkl, run)


class _View:
    """An address as a NumPy array: ``np.asarray`` of an object with an interface dict."""

    __slots__ = ("__array_interface__",)


def _nothing(a: int, b: int, c: int) -> None:
    """An empty product (m or n is 0): nothing to write."""


_RAW = ctypes.CFUNCTYPE(None)
