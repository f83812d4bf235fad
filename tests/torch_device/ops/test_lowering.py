"""The lowering table (hologram_torch.lowering) against PyTorch's CPU kernels.

Every entry is built into a Hologram graph (``hologram.frontend.graph``), compiled by the
SDK and run on random inputs; its results must match the ATen op on CPU tensors in dtype
and value: the contract torch.compile's backend relies on. The table must also cover every
op the eager device registers natively, except the documented inherently eager ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hologram  # noqa: E402
from hologram.frontend.graph import Graph, Tensor  # noqa: E402
from hologram_torch import lowering  # noqa: E402
from hologram_torch.aten.registry import NATIVE  # noqa: E402
from hologram_torch.lowering.common import ISA, TORCH  # noqa: E402

aten = torch.ops.aten
BACKEND = "interp"


def _lowered(op, args, kwargs):
    """``op``'s lowering on ``args`` (tensors become graph inputs), compiled and run."""
    g = Graph("lowering_test")
    arrays = []

    def graph_value(a):
        if isinstance(a, (list, tuple)):  # a foreach op's list
            return [graph_value(x) for x in a]
        if not isinstance(a, torch.Tensor):
            return a
        arrays.append(np.ascontiguousarray(a.numpy()))
        return g.input(f"x{len(arrays)}", ISA[a.dtype], tuple(a.shape))

    values = [graph_value(a) for a in args]
    result = lowering.lower(op, g, *values, **kwargs)
    results = (result,) if isinstance(result, Tensor) else tuple(result)
    present = [r for r in results if r is not None]  # None: an absent (masked-off) result
    for j, r in enumerate(present):
        g.output(f"y{j}", r)
    got = hologram.compile(g.program(), backend=BACKEND)(*arrays)
    got = iter((got,) if len(present) == 1 else got)
    return [None if r is None else (np.asarray(next(got)).reshape(r.shape), TORCH[r.dtype])
            for r in results]


def check(op, *args, rtol=1e-5, atol=1e-6, **kwargs):
    """``op``'s lowering matches ``op`` on CPU tensors (dtype and values)."""
    want = op(*args, **kwargs)
    want = (want,) if isinstance(want, torch.Tensor) else tuple(want)  # tuples and lists
    got = _lowered(op, args, kwargs)
    assert len(got) == len(want), op
    for found, w in zip(got, want):
        assert (found is None) == (w is None), op
        if w is None:
            continue
        value, dtype = found
        assert dtype == w.dtype, f"{op}: dtype {dtype}, torch {w.dtype}"
        w = w.numpy()
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(value, w, err_msg=str(op))
        else:
            np.testing.assert_allclose(value.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True, err_msg=str(op))


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def ints(*shape, dtype=torch.int64, low=-5, high=6, seed=1):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed),
                         dtype=dtype)


def mask(*shape, seed=2):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.5


def positive(*shape, dtype=torch.float32, seed=3):
    return (torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) + 0.1).to(dtype)


X, Y = randn(4, 5), randn(5, seed=4)
H = randn(4, 5, dtype=torch.float16)
I, J = ints(4, 5), ints(5, seed=5)
B = mask(4, 5)

#: (op, args, kwargs, tolerances): at least one case per table entry.
CASES: list[tuple] = []


def case(op, *args, tol=None, **kwargs):
    CASES.append((op, args, kwargs, tol or {}))


# --- elementwise ------------------------------------------------------------------------------

for _op in ("add", "sub"):
    for _ov in ("Tensor", "Scalar"):
        _f = getattr(getattr(aten, _op), _ov)
        if _ov == "Tensor":
            case(_f, X, Y)
            case(_f, X, Y, alpha=2.5)
            case(_f, I, J, alpha=3)
            case(_f, H, X)
            case(_f, I, torch.tensor(2.5, dtype=torch.float64))
        else:
            case(_f, H, 2.5)
            case(_f, I, 2.5)
            case(_f, I, 3, alpha=2)
case(aten.add.Tensor, B, mask(4, 5, seed=9))
for _f in (aten.mul.Tensor, aten.div.Tensor, aten.maximum.default, aten.minimum.default):
    case(_f, X, Y)
    case(_f, H, randn(4, 1, dtype=torch.float16, seed=6))
    case(_f, I, torch.where(J == 0, 1, J))
case(aten.mul.Scalar, I, 0.5)
case(aten.div.Scalar, I, 4)
case(aten.mul.Tensor, B, mask(5, seed=7))
# integer division (float results are PyTorch's kernels'); no zero divisors: the eager
# kernels raise PyTorch's ZeroDivisionError before a launch
_NZ = torch.where(J == 0, 1, J)
for _mode in ("trunc", "floor"):
    case(aten.div.Tensor_mode, I, _NZ, rounding_mode=_mode)
    case(aten.div.Scalar_mode, I, -3, rounding_mode=_mode)
case(aten.div.Tensor_mode, X, Y, rounding_mode=None)
for _name in ("floor_divide", "remainder", "fmod"):
    _ops = getattr(aten, _name)
    case(_ops.default if _name == "floor_divide" else _ops.Tensor, I, _NZ)
    case(_ops.Scalar, ints(4, 5, dtype=torch.int32), -3)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    case(getattr(aten, _name).Tensor, I, J)
    case(getattr(aten, _name).Tensor, X, I)
    case(getattr(aten, _name).Scalar, X, 0.0)
    case(getattr(aten, _name).Scalar, I, 1)
for _name in ("and", "or", "xor"):
    for _ov in ("Tensor", "Scalar"):
        _f = getattr(getattr(aten, f"bitwise_{_name}"), _ov)
        case(_f, I, J if _ov == "Tensor" else 3)
    case(getattr(aten, f"bitwise_{_name}").Tensor, B, mask(4, 5, seed=8))
    case(getattr(aten, f"logical_{_name}").default, X, I)
    case(getattr(aten, f"logical_{_name}").default, B, mask(5, seed=8))
case(aten.logical_not.default, X)
case(aten.logical_not.default, B)
case(aten.bitwise_not.default, I)
case(aten.bitwise_not.default, B)
_SPECIAL = torch.tensor([1.0, -1.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 2.5])
for _f in (aten.isnan.default, aten.isposinf.default, aten.isneginf.default):
    case(_f, _SPECIAL)
    case(_f, I)
for _e in (2.0, 3, 0.5, -0.5, -1.0, -2.0, 1.0, 1.7):
    case(aten.pow.Tensor_Scalar, positive(4, 5), _e, tol={"rtol": 1e-5})
case(aten.pow.Tensor_Scalar, I, 2.5, tol={"rtol": 1e-5})
case(aten.pow.Tensor_Tensor, positive(4, 5), randn(5), tol={"rtol": 1e-5})
for _name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos",
              "tanh", "sigmoid", "erf", "reciprocal"):
    _f = getattr(aten, _name).default
    _x = positive(4, 5) if _name in ("log", "log2", "log1p", "sqrt", "rsqrt") else X
    case(_f, _x, tol={"rtol": 2e-6, "atol": 1e-6})
    case(_f, _x.half(), tol={"rtol": 1e-3, "atol": 1e-3})
    case(_f, ints(4, 5, low=1), tol={"rtol": 2e-6, "atol": 1e-6})
for _name in ("floor", "ceil", "round", "trunc", "neg", "abs", "sign"):
    case(getattr(aten, _name).default, X * 3)
    case(getattr(aten, _name).default, I)
case(aten.sign.default, _SPECIAL)
case(aten.where.self, B, X, Y)
case(aten.where.self, B, I, X.half())
case(aten.masked_fill.Scalar, X, B, -1.5)
case(aten.masked_fill.Scalar, I, B, 7)
case(aten.masked_fill.Tensor, H, B, torch.tensor(0.25))
case(aten.clamp.default, X, -0.5, 0.5)
case(aten.clamp.default, I, None, 2)
case(aten.clamp.default, H, -0.5)
case(aten.clamp.Tensor, X, Y, Y + 1)
case(aten.clamp_min.default, I, 0.5)
case(aten.clamp_min.Tensor, X, Y)
case(aten.clamp_max.default, X, 0)
case(aten.clamp_max.Tensor, I, J)
case(aten.relu.default, X)
case(aten.relu.default, I)
case(aten.silu.default, H, tol={"rtol": 1e-3, "atol": 1e-3})
case(aten.gelu.default, X, tol={"rtol": 1e-5, "atol": 2e-6})
case(aten.gelu.default, X, approximate="tanh", tol={"rtol": 1e-5, "atol": 2e-6})
case(aten.leaky_relu.default, X)
case(aten.leaky_relu.default, X, 0.2)
case(aten.hardtanh.default, X)
case(aten.hardtanh.default, I, -2, 3)
case(aten.threshold_backward.default, Y.expand(4, 5), X, 0.0)
case(aten.silu_backward.default, Y.expand(4, 5), X, tol={"rtol": 1e-5, "atol": 2e-6})
case(aten.sigmoid_backward.default, X, torch.sigmoid(Y))
case(aten.tanh_backward.default, H, torch.tanh(X))
case(aten.gelu_backward.default, Y.expand(4, 5), X, tol={"rtol": 1e-5, "atol": 2e-6})
case(aten.gelu_backward.default, Y.expand(4, 5), X, approximate="tanh",
     tol={"rtol": 1e-5, "atol": 2e-6})
case(aten.leaky_relu_backward.default, Y.expand(4, 5), X, 0.1, False)
case(aten.hardtanh_backward.default, Y.expand(4, 5), X, -0.5, 0.5)


# --- reductions ---------------------------------------------------------------------------------

X3 = randn(3, 4, 5, seed=10)
for _x in (X3, X3.half(), ints(3, 4, 5), mask(3, 4, 5)):
    _tol = {"rtol": 1e-3, "atol": 1e-3} if _x.dtype is torch.float16 else {"rtol": 1e-5,
                                                                            "atol": 1e-5}
    case(aten.sum.default, _x, tol=_tol)
    case(aten.sum.dim_IntList, _x, [0, 2], tol=_tol)
    case(aten.sum.dim_IntList, _x, [-1], True, tol=_tol)
    case(aten.amax.default, _x, [1])
    case(aten.amin.default, _x, [0, 2], True)
    case(aten.max.default, _x)
    case(aten.min.default, _x)
    case(aten.max.dim, _x, 1)
    case(aten.min.dim, _x, -1, True)
    case(aten.all.default, _x)
    case(aten.any.dim, _x, 1)
    case(aten.all.dims, _x, [0, 2], True)
    case(aten.any.default, _x)
    case(aten.any.dims, _x, [])
    case(aten.all.dim, _x, 0)
    if _x.dtype is not torch.bool:
        case(aten.argmax.default, _x)
        case(aten.argmin.default, _x, 1, True)
case(aten.sum.dim_IntList, ints(3, 4), [1], dtype=torch.float32)
case(aten.mean.default, X3)
case(aten.mean.default, ints(3, 4), dtype=torch.float64)
case(aten.mean.dim, X3.half(), [0, 1], tol={"rtol": 1e-3, "atol": 1e-3})
case(aten.mean.dim, X3, [2], True)
for _f in (aten.var.correction, aten.std.correction, aten.var_mean.correction,
           aten.std_mean.correction):
    case(_f, X3, tol={"rtol": 1e-5, "atol": 1e-6})
    case(_f, X3, [1], correction=0, keepdim=True, tol={"rtol": 1e-5, "atol": 1e-6})
    case(_f, X3.half(), [0, 2], tol={"rtol": 1e-3, "atol": 1e-3})
for _ord in (2, 1, 0, math.inf, -math.inf, 3.5):
    case(aten.linalg_vector_norm.default, X3, _ord, tol={"rtol": 1e-5, "atol": 1e-5})
case(aten.linalg_vector_norm.default, X3, 2, [1], True, dtype=torch.float64)


# --- nn -----------------------------------------------------------------------------------------

_TOL = {"rtol": 1e-5, "atol": 1e-6}
_HTOL = {"rtol": 2e-3, "atol": 2e-3}
T = randn(4, 5, seed=11)
for _f, _b in ((aten._softmax.default, aten._softmax_backward_data.default),
               (aten._log_softmax.default, aten._log_softmax_backward_data.default)):
    case(_f, X, 1, False, tol=_TOL)
    case(_f, X3, 0, False, tol=_TOL)
    case(_f, H, -1, False, tol=_HTOL)
    _y = _f(X, 1, False)
    case(_b, T, _y, 1, torch.float32, tol=_TOL)
    case(_b, T.half(), _y.half(), -1, torch.float16, tol=_HTOL)
case(aten.softmax.int, X, 1, tol=_TOL)
case(aten._safe_softmax.default, X, 1, tol=_TOL)
case(aten._safe_softmax.default, torch.tensor([[-math.inf] * 3, [0.0, -math.inf, 1.0]]), 1,
     tol=_TOL)
case(aten.softmax.int, H, 0, torch.float32, tol=_TOL)
case(aten.log_softmax.int, X3, -1, tol=_TOL)
_P = torch.sigmoid(X)
_G0 = torch.tensor(0.75)
for _red in (0, 1, 2):
    case(aten.mse_loss.default, X, T, _red, tol=_TOL)
    case(aten.smooth_l1_loss.default, X, T, _red, 0.5, tol=_TOL)
    case(aten.huber_loss.default, X, T, _red, 0.7, tol=_TOL)
    case(aten.binary_cross_entropy.default, _P, torch.sigmoid(T), positive(4, 5), _red,
         tol=_TOL)
    case(aten.binary_cross_entropy_with_logits.default, X, torch.sigmoid(T), None,
         positive(5), _red, tol=_TOL)
case(aten.mse_loss.default, H, T.half(), tol=_HTOL)
case(aten.smooth_l1_loss.default, X, T)
case(aten.mse_loss_backward.default, _G0, X, T, 1, tol=_TOL)
case(aten.mse_loss_backward.default, T, X, T * 2, 0, tol=_TOL)
case(aten.smooth_l1_loss_backward.default, _G0, X, T, 1, 0.5, tol=_TOL)
case(aten.huber_loss_backward.default, T, X, T * 0.5, 0, 0.7, tol=_TOL)
case(aten.binary_cross_entropy.default, _P, torch.sigmoid(T))
case(aten.binary_cross_entropy_backward.default, _G0, _P, torch.sigmoid(T), None, 1,
     tol=_TOL)
case(aten.binary_cross_entropy_backward.default, T, _P, torch.sigmoid(T), positive(4, 5), 0,
     tol=_TOL)
case(aten.binary_cross_entropy_with_logits.default, X, torch.sigmoid(T), tol=_TOL)
_LOGP = torch.log_softmax(X, 1)
_TARGET = torch.tensor([1, 4, -100, 0])
_W = positive(5, seed=12)
for _red in (0, 1, 2):
    case(aten.nll_loss_forward.default, _LOGP, _TARGET, None, _red, -100, tol=_TOL)
    case(aten.nll_loss_forward.default, _LOGP, _TARGET, _W, _red, -100, tol=_TOL)
    _out, _tw = aten.nll_loss_forward.default(_LOGP, _TARGET, _W, _red, -100)
    case(aten.nll_loss_backward.default, torch.ones_like(_out) * 0.5, _LOGP, _TARGET, _W, _red,
         -100, _tw, tol=_TOL)
case(aten.nll_loss_forward.default, _LOGP[0], torch.tensor(3), None, 1, -100, tol=_TOL)
_LOGP2 = torch.log_softmax(randn(2, 3, 4, 4, seed=13), 1)
_TARGET2 = ints(2, 4, 4, low=0, high=3)
case(aten.nll_loss2d_forward.default, _LOGP2, _TARGET2, None, 1, -100, tol=_TOL)
_out, _tw = aten.nll_loss2d_forward.default(_LOGP2, _TARGET2, None, 2, -100)
case(aten.nll_loss2d_backward.default, _G0, _LOGP2, _TARGET2, None, 2, 1, _tw, tol=_TOL)
_LW, _LB = positive(5, seed=14), randn(5, seed=15)
case(aten.native_layer_norm.default, X, [5], _LW, _LB, 1e-5, tol={"rtol": 1e-5, "atol": 1e-5})
case(aten.native_layer_norm.default, X3, [4, 5], None, None, 1e-5,
     tol={"rtol": 1e-5, "atol": 1e-5})
case(aten.native_layer_norm.default, H, [5], _LW, _LB, 1e-5, tol=_HTOL)
_, _MEAN, _RSTD = aten.native_layer_norm.default(X, [5], _LW, _LB, 1e-5)
for _mask in ([True, True, True], [True, False, False], [False, True, True]):
    case(aten.native_layer_norm_backward.default, T, X, [5], _MEAN, _RSTD, _LW, _LB, _mask,
         tol={"rtol": 1e-4, "atol": 1e-5})
_EW = randn(10, 3, seed=16)
_IDX = ints(4, 2, low=0, high=10)
case(aten.embedding.default, _EW, _IDX)
case(aten.embedding.default, _EW.half(), ints(5, low=0, high=10, dtype=torch.int32))
case(aten.embedding_dense_backward.default, randn(4, 2, 3, seed=17), _IDX, 10, -1, False,
     tol=_TOL)
case(aten.embedding_dense_backward.default, randn(4, 2, 3, seed=17), _IDX, 10, 3, True,
     tol=_TOL)
case(aten.native_dropout_backward.default, X, B, 2.0)
case(aten.native_dropout_backward.default, H, B, 1.25)


# --- linalg -------------------------------------------------------------------------------------

_M = {"rtol": 1e-5, "atol": 1e-5}
_MH = {"rtol": 2e-3, "atol": 2e-3}
for _d, _t in ((torch.float32, _M), (torch.float64, _M), (torch.float16, _MH),
               (torch.int64, {})):
    def _r(*shape, seed, _d=_d):
        return ints(*shape, dtype=_d, seed=seed) if _d is torch.int64 else \
            randn(*shape, dtype=_d, seed=seed)
    case(aten.mm.default, _r(4, 3, seed=20), _r(3, 5, seed=21), tol=_t)
    case(aten.bmm.default, _r(2, 4, 3, seed=20), _r(2, 3, 5, seed=21), tol=_t)
    case(aten.mv.default, _r(4, 3, seed=20), _r(3, seed=21), tol=_t)
    case(aten.dot.default, _r(6, seed=20), _r(6, seed=21), tol=_t)
    case(aten.vdot.default, _r(6, seed=20), _r(6, seed=21), tol=_t)
    case(aten.addmm.default, _r(5, seed=22), _r(4, 3, seed=20), _r(3, 5, seed=21), tol=_t)
    case(aten.addmm.default, _r(4, 5, seed=22), _r(4, 3, seed=20), _r(3, 5, seed=21),
         beta=2, alpha=3, tol=_t)
    case(aten.baddbmm.default, _r(2, 4, 5, seed=22), _r(2, 4, 3, seed=20),
         _r(2, 3, 5, seed=21), beta=0, tol=_t)
    case(aten.addmv.default, _r(4, seed=22), _r(4, 3, seed=20), _r(3, seed=21), alpha=2,
         tol=_t)
    case(aten.addbmm.default, _r(4, 5, seed=22), _r(3, 4, 2, seed=20), _r(3, 2, 5, seed=21),
         tol=_t)
    case(aten.addbmm.default, _r(4, 5, seed=22), _r(3, 4, 2, seed=20), _r(3, 2, 5, seed=21),
         beta=0, alpha=2, tol=_t)
case(aten.addmm.default, torch.full((3,), math.nan), X, randn(5, 3), beta=0, tol=_M)
case(aten.addmm.default, randn(3), X, randn(5, 3), beta=0.5, alpha=1.5, tol=_M)


# --- addcmul/addcdiv/lerp and the optimizers' foreach ops --------------------------------------

_F = {"rtol": 1e-5, "atol": 1e-6}
_P2 = positive(4, 5, seed=30)
case(aten.addcmul.default, X, Y, T, value=0.5, tol=_F)
case(aten.addcmul.default, H, Y.half(), T.half(), tol=_HTOL)
case(aten.addcdiv.default, X, Y, _P2, value=2, tol=_F)
case(aten.lerp.Scalar, X, T, 0.3, tol=_F)
case(aten.lerp.Scalar, X, T, 0.8, tol=_F)
case(aten.lerp.Tensor, X, T, _P2 * 0.8, tol=_F)
_L1, _L2, _L3 = [X, Y], [T, Y * 2], [_P2, positive(5, seed=31)]
for _name in ("add", "sub", "mul", "div", "maximum"):
    _ops = getattr(aten, f"_foreach_{_name}")
    case(_ops.List, _L1, _L3, tol=_F)
    case(_ops.Scalar, _L1, 1.5, tol=_F)
    case(_ops.ScalarList, _L1, [0.5, -2.0], tol=_F)
    if _name in ("add", "mul", "div"):
        case(_ops.Tensor, _L1, torch.tensor(2.5), tol=_F)
case(aten._foreach_add.List, _L1, _L2, alpha=2, tol=_F)
case(aten._foreach_sub.List, _L1, _L2, alpha=0.5, tol=_F)
case(aten._foreach_add.Tensor, [H], torch.tensor(2.5), alpha=2, tol=_HTOL)
case(aten._foreach_mul.Scalar, [H, X], 3.0, tol=_HTOL)
case(aten._foreach_sqrt.default, _L3, tol=_F)
case(aten._foreach_neg.default, _L1, tol=_F)
case(aten._foreach_lerp.Scalar, _L1, _L2, 0.3, tol=_F)
case(aten._foreach_lerp.List, _L1, _L2, [_P2 * 0.9, Y.sigmoid()], tol=_F)
case(aten._foreach_lerp.ScalarList, _L1, _L2, [0.2, 0.7], tol=_F)
for _name in ("addcmul", "addcdiv"):
    _ops = getattr(aten, f"_foreach_{_name}")
    case(_ops.Scalar, _L1, _L2, _L3, 0.5, tol=_F)
    case(_ops.ScalarList, _L1, _L2, _L3, [0.5, -1.0], tol=_F)
    case(_ops.Tensor, _L1, _L2, _L3, torch.tensor([2.0, 0.25]), tol=_F)


# --- cat and the index ops ----------------------------------------------------------------------

case(aten.cat.default, [X, T, randn(2, 5, seed=40)])
case(aten.cat.default, [X, H, torch.empty(0)], 1)
case(aten.cat.default, [I, B.long(), J.expand(4, 5)], -1)
case(aten.cat.default, [B, mask(1, 5, seed=41)])
case(aten.slice_scatter.default, X, randn(4, 2, seed=42), 1, 1, 5, 2)
case(aten.slice_scatter.default, I, ints(2, 5, seed=43), 0, 1, 3)
case(aten.select_scatter.default, X, randn(5, seed=44), 0, -1)
case(aten.slice_backward.default, randn(4, 2, seed=45), [4, 5], 1, 1, 5, 2)
case(aten.select_backward.default, randn(4, seed=46), [4, 5], 1, 3)
_GI = torch.tensor([[0, 4, 4, 1, 2], [3, 3, 0, 0, 1], [2, 2, 2, 2, 2]])
case(aten.gather.default, X, 0, torch.tensor([[0, 3, 1, 1, 2], [3, 3, 0, 0, 1]]))
case(aten.gather.default, X, 1, _GI)
case(aten.gather.default, B, 1, _GI)
case(aten.gather.default, torch.tensor(2.5), 0, torch.tensor(0))
case(aten.index_select.default, X, 0, torch.tensor([3, 0, 0, 2]))
case(aten.index_select.default, I, 1, torch.tensor([4, 1], dtype=torch.int32))
case(aten.index_select.default, B, -1, torch.tensor(2))
case(aten.index.Tensor, X, [torch.tensor([[3, -1], [0, 2]])])
case(aten.index.Tensor, X, [None, torch.tensor([4, -5, 0], dtype=torch.int32)])
case(aten.index.Tensor, B, [torch.tensor([1, 0]), torch.tensor([[2], [-1]])])
case(aten.index.Tensor, randn(3, 4, 5, seed=43), [torch.tensor([2, 0]), None,
                                                   torch.tensor([-1, 3])])
_SRC = randn(3, 5, seed=42)
for _f in (aten.scatter.src, aten.scatter_add.default):
    case(_f, X, 1, _GI, _SRC)
    case(_f, I, 0, _GI[:2] % 4, ints(2, 5, seed=43))
case(aten.scatter.src, B, 1, _GI, mask(3, 5, seed=44))
case(aten.scatter.value, X, 1, _GI, -2.5)
case(aten.scatter.value, I, 0, _GI[:2] % 4, 7)
case(aten.scatter.reduce, X, 1, _GI, _SRC, reduce="multiply", tol=_TOL)
case(aten.scatter.reduce, I, 1, _GI, ints(3, 5, seed=45), reduce="add")
case(aten.scatter.value_reduce, X, 1, _GI, 1.5, reduce="add")
case(aten.scatter.src, X, 1, torch.empty(0, dtype=torch.int64), _SRC)
case(aten.index_add.default, X, 0, torch.tensor([3, 0, 3]), _SRC, tol=_TOL)
case(aten.index_add.default, I, 1, torch.tensor([4, 4], dtype=torch.int32), ints(4, 2),
     alpha=3)
case(aten.index_add.default, H, 1, torch.tensor([1]), randn(4, 1, dtype=torch.float16),
     alpha=0.5, tol=_HTOL)
case(aten.index_copy.default, X, 0, torch.tensor([2, 0]), randn(2, 5, seed=46))
case(aten.index_fill.int_Scalar, I, 1, torch.tensor([4, -1, 0]), -3)
case(aten.index_fill.int_Tensor, X, 0, torch.tensor([1]), torch.tensor(2.5))
case(aten.index_put.default, X, [torch.tensor([2, -1, 0])], randn(3, 5, seed=47))
case(aten.index_put.default, I, [None, torch.tensor([4, 4, 1])], ints(4, 3, seed=48),
     True)
case(aten._index_put_impl.default, X, [torch.tensor([[1], [0]]), torch.tensor([3, -2])],
     torch.tensor(-1.0), True)
for _r in ("sum", "prod", "mean", "amax", "amin"):
    case(aten.scatter_reduce.two, X, 1, _GI, _SRC, _r, tol=_TOL)
    case(aten.scatter_reduce.two, I, 1, _GI, ints(3, 5, seed=49), _r, include_self=False)

case(aten.arange.default, 7)
case(aten.arange.start, 2, 9, dtype=torch.float16)
case(aten.arange.start_step, 0.5, 3.0, 0.25)
case(aten.arange.start_step, 10, -2, -3)
case(aten.arange.start_step, 0, 1, 0.1, dtype=torch.float64)
case(aten.linspace.default, -3.7, 11.3, 100, tol=dict(rtol=0, atol=0))
case(aten.linspace.default, 0, 255, 64, dtype=torch.int16)
case(aten.logspace.default, -2, 3, 20, 2.0, tol=dict(rtol=0, atol=0))
case(aten.eye.default, 4)
case(aten.eye.m, 3, 5, dtype=torch.int64)
case(aten.flip.default, randn(3, 4, 5, seed=60), [0, 2])
case(aten.roll.default, randn(3, 4, 5, seed=61), [2, -1], [0, 2])
case(aten.roll.default, randn(3, 4, seed=62), [5])


# --- views and copies ---------------------------------------------------------------------------

case(aten.view.default, X, [5, 4])
case(aten.view.default, X3, [-1, 5])
case(aten._unsafe_view.default, X3, [12, 5])
case(aten._reshape_alias.default, X, [20], [1])
case(aten.alias.default, I)
case(aten.permute.default, X3, [2, 0, 1])
case(aten.permute.default, X3, [-1, 1, 0])
case(aten.transpose.int, X3, 0, -1)
case(aten.t.default, X)
case(aten.t.default, Y)
case(aten.expand.default, Y, [3, 4, 5])
case(aten.expand.default, randn(4, 1, seed=50), [-1, 6])
case(aten.unsqueeze.default, X, 1)
case(aten.unsqueeze.default, X, -1)
case(aten.squeeze.default, randn(1, 4, 1, 5, seed=51))
case(aten.squeeze.dim, randn(1, 4, 1, 5, seed=51), 2)
case(aten.squeeze.dims, randn(1, 4, 1, 5, seed=51), [0, 1])
case(aten.slice.Tensor, X, 1, 1, 4)
case(aten.slice.Tensor, X, 0, -3, None, 2)
case(aten.slice.Tensor, X, 1, 2, 100)
case(aten.slice.Tensor, X3, 2, None, -1, 3)
case(aten.select.int, X3, 1, -1)
case(aten.select.int, X, 0, 2)
case(aten.clone.default, X)
case(aten._to_copy.default, X, dtype=torch.float16)
case(aten._to_copy.default, H, dtype=torch.int32)
case(aten._to_copy.default, I)


# --- pooling, batch norm, hard activations, tril/triu ----------------------------------------

_P2, _P3 = randn(2, 3, 7, 6, seed=30), randn(1, 2, 5, 4, 6, seed=31)
_P2[0, 0, 1, 1] = float("nan")
for _f, _x, _n in ((aten.max_pool2d_with_indices, _P2, 2),
                   (aten.max_pool3d_with_indices, _P3, 3)):
    for _args in (([2], [], [0], [1], False), ([3], [2], [1], [1], True),
                  ([3], [1], [1], [2], False)):
        case(_f.default, _x, *_args)
        _out, _idx = _f.default(_x, *_args)
        _bwd = getattr(aten, f"max_pool{_n}d_with_indices_backward").default
        case(_bwd, randn(*_out.shape, seed=32), _x, *_args, _idx)
case(aten.max_pool2d_with_indices.default, ints(2, 3, 5, 5), [2], [1], [1], [1], False)
for _f, _x in ((aten.avg_pool2d, _P2), (aten.avg_pool3d, _P3)):
    _bwd = getattr(aten, f"{_f.__name__}_backward").default
    for _args in (([2], [], [0], False, True, None), ([3], [2], [1], True, False, None),
                  ([3], [2], [1], True, True, 5)):
        case(_f.default, _x, *_args)
        _out = _f.default(_x, *_args)
        case(_bwd, randn(*_out.shape, seed=33), _x, *_args)
case(aten.avg_pool2d.default, ints(1, 2, 5, 5), [2], [2], [1], False, False, None)
for _f, _x, _sizes in ((aten._adaptive_avg_pool2d, _P2, ([3, 2], [7, 6], [4, 4])),
                       (aten._adaptive_avg_pool3d, _P3, ([2, 3, 4], [5, 1, 3]))):
    _bwd = getattr(aten, f"{_f.__name__}_backward").default
    for _size in _sizes:
        case(_f.default, _x, _size)
        case(_bwd, randn(*_x.shape[:-len(_size)], *_size, seed=34), _x)
_BX, _BW, _BB = randn(4, 3, 5, seed=35), randn(3, seed=36), randn(3, seed=37)
_BM, _BV = randn(3, seed=38), positive(3, seed=39)
_BTOL = {"rtol": 1e-5, "atol": 1e-5}
for _training in (True, False):
    case(aten._native_batch_norm_legit_functional.default, _BX, _BW, _BB, _BM, _BV, _training,
         0.1, 1e-5, tol=_BTOL)
case(aten._native_batch_norm_legit_functional.default, _BX.half(), _BW, _BB, _BM, _BV, True,
     0.1, 1e-5, tol=_HTOL)
case(aten._native_batch_norm_legit.no_stats, _BX, None, None, True, 0.1, 1e-5, tol=_BTOL)
case(aten._native_batch_norm_legit_no_training.default, _BX, _BW, _BB, _BM, _BV, 0.1, 1e-5,
     tol=_BTOL)
_, _SM, _SI = aten._native_batch_norm_legit.no_stats(_BX, _BW, _BB, True, 0.1, 1e-5)
for _train in (True, False):
    case(aten.native_batch_norm_backward.default, randn(4, 3, 5, seed=40), _BX, _BW, _BM, _BV,
         _SM, _SI, _train, 1e-5, [True, True, True], tol=_BTOL)
case(aten.native_batch_norm_backward.default, randn(4, 3, 5, seed=40), _BX, None, _BM, _BV,
     _SM, _SI, True, 1e-5, [True, False, True], tol=_BTOL)
_HX = torch.tensor([-4.0, -3.0, -1.0, 0.0, 2.5, 3.0, 5.0, float("nan")])
for _name in ("hardswish", "hardsigmoid"):
    case(getattr(aten, _name).default, _HX)
    case(getattr(aten, _name).default, H, tol=_HTOL)
    case(getattr(aten, f"{_name}_backward").default, randn(8, seed=41), _HX)
for _f in (aten.tril.default, aten.triu.default):
    case(_f, X3, 1)
    case(_f, I, -1)
    case(_f, B)


# --- convolutions ----------------------------------------------------------------------

_CX, _CW = randn(2, 4, 6, 6, seed=50), randn(6, 2, 3, 3, seed=51)
_CG = randn(2, 6, 3, 3, seed=52)
_CONV = (_CX, _CW, randn(6, seed=53), [2, 2], [1, 1], [1, 1], False, [0, 0], 2)
case(aten.convolution.default, *_CONV, tol=_TOL)
case(aten.convolution.default, randn(1, 3, 7, seed=54), randn(3, 1, 3, seed=55), None, [1],
     [2], [2], False, [0], 3, tol=_TOL)  # depthwise, dilated
case(aten.convolution_backward.default, _CG, _CX, _CW, [6], [2, 2], [1, 1], [1, 1], False,
     [0, 0], 2, [True, True, True], tol=_TOL)


@pytest.mark.parametrize("op, args, kwargs, tol", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_lowering_matches_aten(op, args, kwargs, tol):
    def contiguous(a):
        if isinstance(a, list):
            return [contiguous(x) for x in a]
        return a.contiguous() if isinstance(a, torch.Tensor) else a

    check(op, *map(contiguous, args), **tol, **kwargs)


def test_every_entry_has_a_case():
    assert sorted(map(str, set(lowering.LOWERINGS) - {c[0] for c in CASES})) == []


def test_unsupported_arguments_raise():
    g = Graph("u")
    x = g.input("x", "i64", (3,))
    with pytest.raises(lowering.Unsupported):
        lowering.lower(aten.pow.Tensor_Scalar, g, x, 2)  # integer pow: eager CPU only
    with pytest.raises(lowering.Unsupported):
        lowering.lower(aten.sub.Tensor, g, g.input("b", "bool", (3,)), True)
    with pytest.raises(lowering.Unsupported):
        lowering.lower(aten.nonzero.default, g, x)  # no entry at all
    assert lowering.get(aten.nonzero.default) is None


def test_runtime_numbers_promote_as_wrapped_numbers():
    """A :class:`lowering.Number` (a Python number given at run time, as the eager device
    passes them) promotes like a Python number, not like a 0-d tensor."""
    g = Graph("n")
    x = g.input("x", "i64", (3,))
    s = g.input("s", "f64", ())
    assert TORCH[lowering.lower(aten.add.Tensor, g, x, lowering.Number.of(s)).dtype] \
        is torch.float32
    assert TORCH[lowering.lower(aten.add.Tensor, g, x, s).dtype] is torch.float64


# --- coverage of the eager device's native ops -------------------------------------------------

#: Native ops that are inherently eager: memory, metadata, host transfers, in-place copies
#: and fills, views onto storage (``as_strided``, ``unfold``: a compiled graph has its own
#: buffers; the other views are in the table), complex views, and random draws (the CPU
#: generator's stream; dropout's mask).
EAGER_ONLY = {
    "empty.memory_format", "empty_strided.default", "resize_.default", "set_.default",
    "set_.source_Storage", "set_.source_Storage_storage_offset", "set_.source_Tensor",
    "_copy_from.default", "_copy_from_and_resize.default", "_local_scalar_dense.default",
    "record_stream.default",  # nothing to compute (hologram_torch/streams.py)
    "fill_.Scalar", "fill_.Tensor", "zero_.default", "_foreach_zero_.default",
    "_foreach_copy_.default", "as_strided.default", "unfold.default",
    "view_as_complex.default", "view_as_real.default",
    "bernoulli_.Tensor", "bernoulli_.float", "cauchy_.default", "exponential_.default",
    "geometric_.default", "log_normal_.default", "normal_.default", "random_.default",
    "random_.from", "random_.to", "uniform_.default", "native_dropout.default",
    # batch norm updating running statistics in place (the functional form is an entry)
    "native_batch_norm.default", "_native_batch_norm_legit.default",
}

def _functional(name: str) -> set[str]:
    """The functional overloads an in-place (``add_.Tensor``) or out= (``add.out``,
    ``eq.Scalar_out``, ``sum.IntList_out``) overload may compute."""
    op, _, variant = name.partition(".")
    if op.endswith("_") and not op.endswith("__"):
        op = op[:-1]
    if variant in ("out", "all_out"):
        variants = {"default", "Tensor", "dim", "dim_IntList"}
    elif variant == "out_mode":  # div.out_mode
        variants = {"Tensor_mode"}
    elif variant == "Tensor":  # floor_divide_.Tensor: floor_divide.default
        variants = {"Tensor", "default"}
    elif variant.endswith("_out"):
        variants = {variant.removesuffix("_out"), f"dim_{variant.removesuffix('_out')}"}
    else:
        variants = {variant}
    return {f"{op}.{v}" for v in variants}


def _lowered_names() -> set[str]:
    return {f"{op._opname}.{op._overloadname}" for op in lowering.LOWERINGS}


def test_native_ops_without_lowering_are_the_documented_eager_ones():
    lowered = _lowered_names()
    missing = {name for name in NATIVE
               if name not in lowered and not _functional(name) & lowered}
    assert sorted(missing - EAGER_ONLY) == []  # a new native op needs an entry
    assert sorted(EAGER_ONLY - missing) == []  # or the list is stale
