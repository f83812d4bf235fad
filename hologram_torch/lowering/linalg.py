"""Matrix products: ``mm``, ``bmm``, ``mv``, ``dot``, ``vdot`` and the ``add*`` forms
(``addmm``, ``baddbmm``, ``addmv``, ``addbmm``): ``beta * self + alpha * product``.

Each product is one ``Graph.matmul`` (a ``contract`` op, which the CPU backend hands to
BLAS for float32/float64) in the operands' opmath dtype: float16/bfloat16 compute in
float32 and round once, as torch's CPU kernels do. ``beta == 0`` (a Python number) ignores
``self`` (NaN/inf in it do not propagate, as torch documents); ``alpha == 1`` and ``beta
== 1`` need no scaling; other values, and :class:`~hologram_torch.lowering.Number` values,
scale. ``addbmm`` folds its batch into the contraction, except in half types, where
torch's CPU rounds after every batch entry and so does this lowering.

:class:`Unsupported`: bool operands (torch has no boolean products), mixed dtypes and
ranks torch rejects, a float ``alpha``/``beta`` with integer operands.
"""

from __future__ import annotations

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import (
    Tensor,
    Unsupported,
    aten,
    cast,
    is_float,
    opmath,
    register,
    zeros,
)


def _dtype(*tensors) -> dt.DType:
    dtypes = {t.dtype for t in tensors if isinstance(t, Tensor)}
    if len(dtypes) != 1:
        raise Unsupported("operands of different dtypes")  # torch's CPU kernels raise
    (dtype,) = dtypes
    if dtype.is_bool:
        raise Unsupported("a boolean product")  # torch raises
    return dtype


def _ranks(name: str, *pairs) -> None:
    for t, rank in pairs:
        if t.ndim != rank:
            raise Unsupported(f"{name}: a {t.ndim}-d operand where torch takes {rank}-d")


def product(g, a, b):
    """``a @ b`` in the opmath dtype of their (common) dtype."""
    m = opmath(_dtype(a, b))
    return g.matmul(cast(a, m), cast(b, m))


def _product_op(name: str, ranks: tuple[int, int]):
    def entry(g, self, other):
        _ranks(name, (self, ranks[0]), (other, ranks[1]))
        return cast(product(g, self, other), _dtype(self, other))

    return entry


mm = register(aten.mm.default)(_product_op("mm", (2, 2)))
bmm = register(aten.bmm.default)(_product_op("bmm", (3, 3)))
mv = register(aten.mv.default)(_product_op("mv", (2, 1)))
dot = register(aten.dot.default)(_product_op("dot", (1, 1)))
vdot = register(aten.vdot.default)(_product_op("vdot", (1, 1)))  # real: dot


def _is(x, value) -> bool:
    """Is ``x`` the Python number ``value`` (not a runtime :class:`Number`)?"""
    return not isinstance(x, Tensor) and x == value


def epilogue(g, bias, product, beta, alpha):
    """``beta * bias + alpha * product`` in the product's opmath dtype."""
    m = opmath(product.dtype)
    product = cast(product, m)
    if not _is(alpha, 1):
        product = product * cast(alpha, m)
    if _is(beta, 0):
        return product
    bias = cast(bias, m)
    if not _is(beta, 1):
        bias = bias * cast(beta, m)
    return bias + product


def _scalars(dtype: dt.DType, beta, alpha) -> None:
    if not dtype.is_float and any(is_float(s) for s in (beta, alpha)):
        raise Unsupported("a float alpha or beta with integer operands")  # torch raises


def _affine_op(name: str, ranks: tuple[int, int]):
    def entry(g, self, a, b, *, beta=1, alpha=1):
        _ranks(name, (a, ranks[0]), (b, ranks[1]))
        dtype = _dtype(self, a, b)
        _scalars(dtype, beta, alpha)
        return cast(epilogue(g, self, product(g, a, b), beta, alpha), dtype)

    return entry


addmm = register(aten.addmm.default)(_affine_op("addmm", (2, 2)))
baddbmm = register(aten.baddbmm.default)(_affine_op("baddbmm", (3, 3)))
addmv = register(aten.addmv.default)(_affine_op("addmv", (2, 1)))


@register(aten.addbmm.default)
def addbmm(g, self, batch1, batch2, *, beta=1, alpha=1):
    """``beta * self + alpha * sum_i batch1[i] @ batch2[i]``."""
    _ranks("addbmm", (batch1, 3), (batch2, 3))
    dtype = _dtype(self, batch1, batch2)
    _scalars(dtype, beta, alpha)
    if dtype in (dt.float16, dt.bfloat16):
        return cast(_addbmm_rounded(g, self, batch1, batch2, beta, alpha, dtype), dtype)
    # the sum over the batch inside one GEMM: [B, n, m] @ [B, m, p] is [n, B*m] @ [B*m, p]
    (batch, n, m), p = batch1.shape, batch2.shape[2]
    a = batch1.permute(1, 0, 2).reshape(n, batch * m)
    b = batch2.reshape(batch * m, p)
    return cast(epilogue(g, self, product(g, a, b), beta, alpha), dtype)


def _addbmm_rounded(g, bias, a, b, beta, alpha, dtype):
    """``addbmm`` in float16/bfloat16 as torch's CPU computes it: one ``addmm_`` per batch
    entry, so the sum is rounded to ``dtype`` after every step (a single float32 sum
    differs by several ulps). The products are one batched GEMM; the steps are
    elementwise kernels, as many as there are batch entries."""
    m = opmath(dtype)
    products = product(g, a, b)
    if not _is(alpha, 1):
        products = products * cast(alpha, m)
    acc = None
    if not _is(beta, 0):
        acc = cast(bias, m)
        acc = acc if _is(beta, 1) else acc * cast(beta, m)
        acc = acc.broadcast_to(products.shape[1:])
    for i in range(products.shape[0]):
        acc = products[i] if acc is None else acc + products[i]
        acc = cast(cast(acc, dtype), m)
    if acc is None:  # no batch entries and beta == 0: zeros
        acc = zeros(g, m, products.shape[1:])
    return acc
