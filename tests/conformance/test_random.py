"""Random tensor programs (tests/test_properties.py's strategy: broadcasting, views,
reductions, matmuls, casts on 2-D tensors) on the backend against the interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_properties import programs
from util import inputs_for

from hologram.isa import dtypes as dt

from .numerics import as_float, both, supported

# Half the profile's examples (50 by default; `--hypothesis-profile=thorough`: 1000).
RANDOM_SETTINGS = settings(
    max_examples=max(1, settings.default.max_examples // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)


def assert_agree(got: np.ndarray, want: np.ndarray, t: dt.DType, what: str) -> None:
    """Exact for ints and bools; floats: same NaN positions, then a relative 1e-4 (8 ulps of
    f16/bf16) plus an absolute 1e-5: chains of transcendentals, sums and matmuls amplify
    the errors each op may make."""
    if not t.is_float:
        assert np.array_equal(got, want), what
        return
    g, w = as_float(got, t), as_float(want, t)
    rtol = {16: 8 * 2.0 ** -10, 32: 1e-4, 64: 1e-4}[t.bits]
    if t is dt.bfloat16:
        rtol = 8 * 2.0 ** -7
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"NaN positions differ: {what}"
    ok = np.isclose(g, w, rtol=rtol, atol=1e-5) | (g == w)
    assert ok[~np.isnan(w)].all(), what


@RANDOM_SETTINGS
@given(program=programs(), seed=st.integers(0, 2**16))
def test_random_programs_agree_with_the_interpreter(backend, program, seed):
    assume(all(supported(backend, i.op, i.dtype) for k in program.kernels for i in k.body))
    # float contractions and sums round in an implementation-defined order (docs/isa.md):
    # with cancellation of large edge values no relative tolerance holds, and the dedicated
    # tests bound them instead; inputs without edge values keep them here.
    edges = not any(i.op in ("contract", "reduce") and i.dtype.is_float
                    for k in program.kernels for i in k.body)
    inputs = inputs_for(program, seed, edges=edges)
    got, want = both(program, backend, inputs)
    outputs = [p for p in program.params if p.kind != "in"]
    for param, a, b in zip(outputs, got, want):
        what = (f"output {param.name} ({param.dtype.name}): {backend} {a}, interp {b}\n"
                f"inputs {inputs}\n{program}")
        assert_agree(a, b, param.dtype, what)
