"""Correctness checks: :func:`verify_correctness` compares an output against PyTorch's.

A mismatch raises :class:`VerificationError`, an :class:`AssertionError` (what test
frameworks and notebooks expect from a failed check) that is also a
:class:`~hologram.errors.HologramError`; with ``raise_on_error=False`` the
:class:`Verification` is returned instead, so a benchmark run can record the failure and
go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.errors import HologramError


class VerificationError(HologramError, AssertionError):
    """An output differs from its reference beyond the tolerances."""

    def __init__(self, verification: Verification):
        self.verification = verification
        super().__init__(verification.message)


@dataclass(frozen=True)
class Verification:
    """The outcome of one comparison. ``max_abs_err`` and ``max_rel_err`` are over all
    elements (relative to ``|expected|``, elements where it is 0 excluded); ``mismatched``
    counts the elements outside ``atol + rtol * |expected|``."""

    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    size: int
    rtol: float
    atol: float
    message: str

    def __bool__(self) -> bool:
        return self.ok


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy array from a NumPy array, a Hologram buffer, a torch tensor or a number."""
    if hasattr(value, "detach"):  # torch.Tensor, on any device
        return value.detach().cpu().numpy()
    if hasattr(value, "to_numpy"):  # hologram.Buffer
        return np.asarray(value.to_numpy())
    return np.asarray(value)


def verify_correctness(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-8,
                       name: str = "", raise_on_error: bool = True) -> Verification:
    """Check ``actual`` against ``expected`` elementwise like ``np.allclose`` (NaNs must
    match NaNs). Raises :class:`VerificationError` naming the case, the max abs/rel error
    and the mismatch count, unless ``raise_on_error`` is false; returns the
    :class:`Verification` otherwise."""
    a = to_numpy(actual)
    e = to_numpy(expected)
    label = name or "output"
    if a.shape != e.shape and a.size == e.size == 1:
        a, e = a.reshape(()), e.reshape(())  # a 0-d result against a 1-element one
    if a.shape != e.shape:
        message = f"{label}: shape {a.shape} differs from the reference's {e.shape}"
        result = Verification(label, False, np.inf, np.inf, max(a.size, e.size),
                              max(a.size, e.size), rtol, atol, message)
    else:
        a64 = a.astype(np.float64)
        e64 = e.astype(np.float64)
        close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        finite = np.isfinite(a64) & np.isfinite(e64)
        diff = np.abs(a64 - e64)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        nonzero = finite & (e64 != 0)
        max_rel = float((diff[nonzero] / np.abs(e64[nonzero])).max()) if nonzero.any() else 0.0
        bad = int(close.size - np.count_nonzero(close))
        ok = bad == 0
        verdict = "matches" if ok else f"MISMATCH in {bad} of {close.size} elements"
        message = (f"{label}: {verdict} (max abs err {max_abs:.3e}, max rel err {max_rel:.3e}, "
                   f"rtol={rtol:g}, atol={atol:g})")
        result = Verification(label, ok, max_abs, max_rel, bad, int(close.size), rtol, atol,
                              message)
    if not result.ok and raise_on_error:
        raise VerificationError(result)
    return result
