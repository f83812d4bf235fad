"""Every cast between the ten dtypes (saturation, wrapping, NaN, single rounding): one
program per source dtype with one output per destination."""

from __future__ import annotations

import numpy as np
import pytest

from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

from .numerics import assert_close, both, expect_known_bug, seed_of, storage, supported, values

NAMES = [t.name for t in dt.ALL]
# Just off a midpoint of the narrow format, but onto it in f32: rounding twice is wrong.
BF16_UP = 1 + 2.0 ** -8 + 2.0 ** -30
F16_UP = 1 + 2.0 ** -11 + 2.0 ** -40


def cast_inputs(t: dt.DType, rng: np.random.Generator) -> np.ndarray:
    """Values of ``t`` that probe saturation, wrapping, NaN, and single rounding."""
    if t.is_float:
        special = [127.5, 128.0, -128.5, -129.0, 255.5, 256.0, -0.7, 0.7, 32767.5, 32768.0,
                   -32769.0, 2147483520.0, 2147483648.0, -2147483904.0, 9.2e18, 9.3e18,
                   -9.3e18, BF16_UP, -BF16_UP, F16_UP, 1 + 2.0 ** -24 + 2.0 ** -60, 3.0e38,
                   1e39, -1e39, 1e300]
        return np.concatenate([values(t, 500, rng), storage(special, t)])
    big = [2**24 + 1, 2**24 + 2**16 + 1, -(2**24 + 2**16 + 1), 16842753, 2**31 - 1, 2**53 + 1,
           2**62 + 2**38 + 1, -(2**62) - 2**38 - 1, 2**63 - 1, -(2**63), 65519, 65520, 300, -300,
           # just off a bf16 midpoint, onto it in f64 (53 bits): rounding twice is wrong
           2**56 + 2**48 + 1, -(2**56 + 2**48 + 1), 2**56 + 3 * 2**48 - 1,
           -(2**56 + 3 * 2**48 - 1), 2**62 + 2**54 + 1, 2**62 + 3 * 2**54 - 1]
    fits = [v for v in big if t.min <= v <= t.max]
    return np.concatenate([values(t, 500, rng), np.array(fits, dtype=np.int64).astype(t.storage)])


@pytest.mark.parametrize("src", NAMES)
def test_casts_from(backend, src, request):
    s = dt.dtype(src)
    targets = [d for d in dt.ALL if supported(backend, "cast", s, d)
               and supported(backend, "load", s) and supported(backend, "store", d)]
    if not targets:
        pytest.skip(f"{backend} declares no cast from {src}")
    for d in targets:
        expect_known_bug(request, backend, f"cast {src} -> {d.name}")
    x = cast_inputs(s, np.random.default_rng(seed_of("cast", src)))
    b = ProgramBuilder(f"casts_from_{src}")
    k = b.kernel((x.size,))
    loaded = k.load(b.input("x", s, (x.size,)))
    for d in targets:
        k.store(b.output(d.name, d, (x.size,)), k.cast(loaded, d))
    got, want = both(b.build(), backend, [x])
    for d, g, w in zip(targets, got, want):
        assert_close(g, w, d, inputs=[x], what=f"cast {src} -> {d.name}", backend=backend)
