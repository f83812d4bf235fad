"""Correctness checks: :func:`verify_correctness` compares an output against PyTorch's;
:func:`contraction_bound` is the error two correct matrix products may differ by.

A mismatch raises :class:`VerificationError`, an :class:`AssertionError` (what test
frameworks and notebooks expect from a failed check) that is also a
:class:`~hologram.errors.HologramError`; with ``raise_on_error=False`` the
:class:`Verification` is returned instead, so a benchmark run can record the failure and
go on.

Matrix products are not compared with a fixed tolerance: two correct float32 GEMMs (MKL's
and OpenBLAS's, say) block their sums over k differently, and their results differ by up to
the forward error bound of the products, which grows with k and with the magnitudes summed
(``|A| @ |B|``), not with the result (which may be near 0 through cancellation). They are
verified against :func:`contraction_bound` instead: wide enough that no summation order
fails, still orders of magnitude below what a wrong index, a missing block or a transposed
result gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.errors import HologramError

#: A correct float result of an inner product of length k lies within
#: gamma_k = k*u / (1 - k*u) (u = eps/2) times sum |a_i b_i| of the exact value, so two of
#: them differ by at most about k*eps times it; c0 = 2 leaves a factor of two of room.
CONTRACTION_C0 = 2.0


class VerificationError(HologramError, AssertionError):
    """An output differs from its reference beyond the tolerances."""

    def __init__(self, verification: Verification):
        self.verification = verification
        super().__init__(verification.message)


@dataclass(frozen=True)
class Verification:
    """The outcome of one comparison. ``max_abs_err`` and ``max_rel_err`` are over all
    elements (relative to ``|expected|``, elements where it is 0 excluded); ``mismatched``
    counts the elements outside ``atol + rtol * |expected|`` (plus the elementwise ``bound``
    when one was given; ``bound`` here is its largest element, 0 without one)."""

    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    size: int
    rtol: float
    atol: float
    message: str
    bound: float = 0.0

    def __bool__(self) -> bool:
        return self.ok


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy array from a NumPy array, a Hologram buffer, a torch tensor or a number."""
    if hasattr(value, "detach"):  # torch.Tensor, on any device
        return value.detach().cpu().numpy()
    if hasattr(value, "to_numpy"):  # hologram.Buffer
        return np.asarray(value.to_numpy())
    return np.asarray(value)


def contraction_bound(a: Any, b: Any, c0: float = CONTRACTION_C0) -> np.ndarray:
    """How far two correct float results of ``a @ b`` may lie apart, elementwise:
    ``c0 * k * eps * (|a| @ |b|)`` in ``a``'s and ``b``'s dtype, plus ``c0 * k`` times its
    smallest subnormal for products that underflow. ``a`` is ``(..., m, k)`` or ``(k,)``,
    ``b`` is ``(k, n)`` or ``(k,)``. Zeros for integer operands (their products are exact)."""
    a, b = to_numpy(a), to_numpy(b)
    k = a.shape[-1]
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    dtype = np.result_type(a.dtype, b.dtype)
    if not np.issubdtype(dtype, np.inexact):
        return np.zeros_like(magnitude)
    info = np.finfo(dtype)
    return c0 * k * (float(info.eps) * magnitude + float(info.smallest_subnormal))


def verify_correctness(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-8,
                       name: str = "", raise_on_error: bool = True, *,
                       bound: Any = None) -> Verification:
    """Check ``actual`` against ``expected`` elementwise like ``np.allclose`` (NaNs must
    match NaNs). ``bound`` (an array broadcasting to the output, e.g.
    :func:`contraction_bound`) is added to ``atol`` element by element. Raises
    :class:`VerificationError` naming the case, the max abs/rel error and the mismatch
    count, unless ``raise_on_error`` is false; returns the :class:`Verification`
    otherwise."""
    a = to_numpy(actual)
    e = to_numpy(expected)
    label = name or "output"
    extra = None if bound is None else np.asarray(bound, dtype=np.float64)
    bound_max = float(extra.max()) if extra is not None and extra.size else 0.0
    if a.shape != e.shape and a.size == e.size == 1:
        a, e = a.reshape(()), e.reshape(())  # a 0-d result against a 1-element one
    if a.shape != e.shape:
        message = f"{label}: shape {a.shape} differs from the reference's {e.shape}"
        result = Verification(label, False, np.inf, np.inf, max(a.size, e.size),
                              max(a.size, e.size), rtol, atol, message, bound_max)
    else:
        a64 = a.astype(np.float64)
        e64 = e.astype(np.float64)
        if extra is None:
            allowed: Any = atol
        else:  # a bound of the output's size but another shape (flat, say) lines up by index
            allowed = atol + (extra.reshape(e64.shape) if extra.size == e64.size else extra)
        close = np.isclose(a64, e64, rtol=rtol, atol=allowed, equal_nan=True)
        finite = np.isfinite(a64) & np.isfinite(e64)
        diff = np.abs(a64 - e64)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        nonzero = finite & (e64 != 0)
        max_rel = float((diff[nonzero] / np.abs(e64[nonzero])).max()) if nonzero.any() else 0.0
        bad = int(close.size - np.count_nonzero(close))
        ok = bad == 0
        verdict = "matches" if ok else f"MISMATCH in {bad} of {close.size} elements"
        limits = f"rtol={rtol:g}, atol={atol:g}"
        if extra is not None:
            limits += f" + elementwise bound up to {bound_max:.3e}"
        message = (f"{label}: {verdict} (max abs err {max_abs:.3e}, max rel err {max_rel:.3e}, "
                   f"{limits})")
        result = Verification(label, ok, max_abs, max_rel, bad, int(close.size), rtol, atol,
                              message, bound_max)
    if not result.ok and raise_on_error:
        raise VerificationError(result)
    return result
