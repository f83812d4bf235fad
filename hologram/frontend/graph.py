"""Tensor programs, written op by op, lowered to Atlas one kernel per operation.

    g = Graph("mlp_layer")
    x = g.input("x", "f32", (64, 128))
    w = g.input("w", "f32", (128, 32))
    b = g.input("b", "f32", (32,))
    g.output("y", g.maximum(x @ w + b, 0.0))
    program = g.program()           # three kernels before fusion; one after

Tensors are views: a buffer plus an affine map (offset, strides), so transposes, slices,
broadcasts and contiguous reshapes cost nothing; they only change the maps that later
loads use. Every operation writes a fresh temporary; the compiler's fusion pass decides
which temporaries survive. Operands follow NumPy broadcasting; dtypes must match (Python
numbers take the tensor's dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hologram.errors import IRError, ShapeError
from hologram.frontend.mixin import OperatorMixin, reshaped
from hologram.isa.builder import KernelBuilder, ProgramBuilder, Value
from hologram.isa.dtypes import DType
from hologram.isa.ir import IndexMap, Program
from hologram.isa.verify import broadcast

Scalar = bool | int | float


@dataclass(frozen=True, eq=False)
class Tensor(OperatorMixin):
    graph: Graph
    buffer: int
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # --- views ------------------------------------------------------------------------
    def permute(self, *dims: int) -> Tensor:
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"permute{dims}: not a permutation of {self.ndim} dimensions")
        return self._view(tuple(self.shape[d] for d in dims),
                          tuple(self.strides[d] for d in dims), self.offset)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    def __getitem__(self, index: object) -> Tensor:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > self.ndim:
            raise ShapeError(f"index {index} has more entries than shape {list(self.shape)}")
        shape, strides, offset = [], [], self.offset
        for d, (n, s) in enumerate(zip(self.shape, self.strides)):
            i = index[d] if d < len(index) else slice(None)
            if isinstance(i, int):
                if not -n <= i < n:
                    raise ShapeError(f"index {i} out of range for dimension {d} of size {n}")
                offset += (i % n) * s
            elif isinstance(i, slice):
                r = range(n)[i]
                offset += r.start * s if len(r) else 0
                shape.append(len(r))
                strides.append(s * r.step)
            else:
                raise ShapeError(f"unsupported index {i!r} (ints and slices only)")
        return self._view(tuple(shape), tuple(strides), offset)

    def broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        shape = tuple(shape)
        aligned = self._aligned(len(shape))
        if _broadcast([aligned.shape, shape]) != shape:
            raise ShapeError(f"cannot broadcast {list(self.shape)} to {list(shape)}")
        strides = tuple(s if n == m else 0 for n, m, s in zip(aligned.shape, shape,
                                                               aligned.strides))
        return self._view(shape, strides, self.offset)

    def reshape(self, *shape: int) -> Tensor:
        """A view of another shape (one extent may be -1); a copy first when this view
        is not contiguous."""
        shape = reshaped(shape, math.prod(self.shape), self.shape)
        source = self if self._contiguous() else self.graph.copy(self)
        return source._view(shape, IndexMap.contiguous(shape).strides, source.offset)

    def _contiguous(self) -> bool:
        expected = IndexMap.contiguous(self.shape).strides
        return all(n == 1 or s == e for n, s, e in zip(self.shape, self.strides, expected))

    def _view(self, shape, strides, offset) -> Tensor:
        return Tensor(self.graph, self.buffer, self.dtype, tuple(shape), tuple(strides), offset)

    def _aligned(self, rank: int) -> Tensor:
        """The same tensor with leading unit dimensions up to ``rank``."""
        extra = rank - self.ndim
        return self._view((1,) * extra + self.shape, (0,) * extra + self.strides, self.offset)

    # --- operators (see hologram.frontend.mixin) ---------------------------------------
    def _apply(self, op: str, *operands: object) -> object:
        if op in ("neg", "abs"):
            return self.graph.unary(op, *operands)
        if op == "matmul":
            return self.graph.matmul(*operands)
        if op == "pow":  # no power in the graph's vocabulary
            return NotImplemented
        return self.graph.binary(op, *operands)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return broadcast(shapes)
    except IRError:
        listed = " and ".join(str(list(s)) for s in shapes)
        raise ShapeError(f"operand shapes {listed} do not broadcast (aligned from the right, "
                         "each dimension must match or be 1); reshape or slice the operands "
                         "to compatible shapes") from None


def broadcast_shapes(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy's broadcast of shapes of any ranks (aligned from the right); ShapeError when
    they do not broadcast."""
    rank = max(len(s) for s in shapes)
    return _broadcast([(1,) * (rank - len(s)) + tuple(s) for s in shapes])


def _reduced_axes(kind: str, x: Tensor, axes: int | tuple[int, ...] | None) -> tuple[int, ...]:
    """``axes`` of a reduction as sorted non-negative dimensions; None and ``()`` are all
    of them (PyTorch's rule for ``sum``, ``mean``, ``amax`` and ``amin``). A 0-d tensor
    accepts axis 0 and -1, as in PyTorch."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes or ())
    rank = max(x.ndim, 1)
    if not all(-rank <= a < rank for a in axes):
        raise ShapeError(f"reduce {kind}: axes {list(axes)} out of range for shape "
                         f"{list(x.shape)}; each must be in [{-rank}, {rank - 1}]")
    if not axes or not x.ndim:
        return tuple(range(x.ndim))
    return tuple(sorted({a % x.ndim for a in axes}))


class Graph:
    def __init__(self, name: str = "main"):
        self.builder = ProgramBuilder(name)
        self._temps = 0

    # --- buffers ----------------------------------------------------------------------
    def input(self, name: str, dtype: DType | str, shape: tuple[int, ...]) -> Tensor:
        index = self.builder.input(name, dtype, shape)
        return self._whole(index)

    def output(self, name: str, tensor: Tensor | Scalar,
               strides: tuple[int, ...] | None = None) -> None:
        """Make ``tensor``'s value the program output ``name``: a contiguous buffer of its
        shape, or, with ``strides``, a flat buffer written through that layout (an
        existing strided array, e.g. a view that an in-place operation updates)."""
        if strides is None:
            out = self._whole(self.builder.output(name, tensor.dtype, tensor.shape))
            k = self.builder.kernel(tensor.shape, name=f"out_{name}")
            k.store(out.buffer, self._load(k, tensor))
            return
        span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, strides))
        index = self.builder.output(name, tensor.dtype, (span,) if tensor.shape else ())
        k = self.builder.kernel(tensor.shape, name=f"out_{name}")
        k.store(index, self._load(k, tensor), 0, tuple(strides), tensor.shape)

    def strided_input(self, name: str, dtype: DType | str, shape: tuple[int, ...],
                      strides: tuple[int, ...]) -> Tensor:
        """An input read through a strided layout (a flat buffer of the layout's span)."""
        span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if 0 not in shape else 0
        index = self.builder.input(name, dtype, (span,) if shape else ())
        return Tensor(self, index, self.builder.buffers[index].dtype, tuple(shape),
                      tuple(strides))

    def program(self) -> Program:
        return self.builder.build()

    def _whole(self, index: int) -> Tensor:
        buf = self.builder.buffers[index]
        return Tensor(self, index, buf.dtype, buf.shape, IndexMap.contiguous(buf.shape).strides)

    def _temp(self, dtype: DType, shape: tuple[int, ...]) -> Tensor:
        self._temps += 1
        return self._whole(self.builder.temp(f"t{self._temps}", dtype, shape))

    # --- kernels ----------------------------------------------------------------------
    def _load(self, k: KernelBuilder, t: Tensor) -> Value:
        """Load ``t`` into kernel ``k``, aligned to the domain's trailing dimensions."""
        t = t._aligned(len(k.domain))
        shape = tuple(n if n == m else 1 for n, m in zip(t.shape, k.domain))
        strides = tuple(s if n > 1 else 0 for n, s in zip(shape, t.strides))
        return k.load(t.buffer, shape, t.offset, strides)

    def _elementwise(self, operands: list[Tensor | Scalar], build) -> Tensor:
        tensors = [x for x in operands if isinstance(x, Tensor)]
        rank = max(x.ndim for x in tensors)
        shape = _broadcast([x._aligned(rank).shape for x in tensors])
        k = self.builder.kernel(shape)
        values = [self._load(k, x) if isinstance(x, Tensor) else x for x in operands]
        value = build(k, *values)
        out = self._temp(value.dtype, shape)
        k.store(out.buffer, value, shape=shape)
        return out

    def unary(self, op: str, x: Tensor) -> Tensor:
        return self._elementwise([x], lambda k, v: k.unary(op, v))

    def binary(self, op: str, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
        return self._elementwise([a, b], lambda k, u, v: k.binary(op, u, v))

    def where(self, cond: Tensor, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
        return self._elementwise([cond, a, b], lambda k, c, u, v: k.select(c, u, v))

    def fma(self, a: Tensor, b: Tensor | Scalar, c: Tensor | Scalar) -> Tensor:
        return self._elementwise([a, b, c], lambda k, *v: k.fma(*v))

    def cast(self, x: Tensor, dtype: DType | str) -> Tensor:
        return self._elementwise([x], lambda k, v: k.cast(v, dtype))

    def copy(self, x: Tensor) -> Tensor:
        return self._elementwise([x], lambda k, v: v)

    def arange(self, n: int, dtype: DType | str = "i64") -> Tensor:
        """``[0, 1, ..., n-1]`` (the ISA's ``index``)."""
        k = self.builder.kernel((n,))
        value = k.index(0, dtype)
        out = self._temp(value.dtype, (n,))
        k.store(out.buffer, value)
        return out

    def gather(self, x: Tensor, coords: tuple[Tensor | int, ...],
               shape: tuple[int, ...]) -> Tensor:
        """Elements of ``x`` at data-dependent coordinates: a tensor of ``shape`` whose
        element ``i`` is ``x[c_0, ..., c_{n-1}]``, one coordinate per dimension of ``x``.
        ``coords[d]`` is either an integer tensor broadcastable to ``shape`` (its value at
        ``i`` is the coordinate) or an int ``a`` (the coordinate is ``i[a]``: ``x``'s
        dimension ``d`` walked by the result's axis ``a``, whose extent is at most ``n``;
        a dimension of extent 1 broadcasts along it).

        Tensor coordinates in ``-n .. n-1`` (``n = x.shape[d]``) count from the end when
        negative, as in Python. Beyond that range the result is defined but arbitrary:
        the coordinates times their strides are summed in wrapping int64 and the ISA's
        ``gather`` clamps the sum to its bounds (an element of ``x``'s buffer); the
        caller checks bounds where it must raise. One kernel; its ``gather`` reads only
        the elements it returns, a row contiguously where one index picks it."""
        shape = tuple(shape)
        self._check_coordinates("gather", x, coords, shape)
        k = self.builder.kernel(shape)
        at, strides, _ = self._coordinate_offset(k, x, coords, shape)
        value = k.gather(x.buffer, at, shape, x.offset, strides)
        out = self._temp(value.dtype, shape)
        k.store(out.buffer, value, shape=shape)
        return out

    def scatter(self, x: Tensor, coords: tuple[Tensor | int, ...], values: Tensor | Scalar,
                shape: tuple[int, ...], mode: str = "replace") -> Tensor:
        """``x`` with elements at data-dependent coordinates written: a new tensor of
        ``x``'s shape, ``x``'s values except that for every point ``i`` of ``shape``, in
        row-major (index) order, element ``x[c_0, ..., c_{n-1}]`` (the coordinates as
        :meth:`gather` takes them) becomes ``values[i]`` (``mode`` "replace": the last
        write wins) or ``mode(element, values[i])`` for "add", "mul", "max" or "min" (the
        ISA's ops, in ``x``'s dtype, one write at a time in index order: deterministic).
        ``values`` (``x``'s dtype, or a Python number) broadcasts to ``shape``.

        Two kernels: a copy of ``x``, then the ISA's ``scatter`` over ``shape``, O(numel(x)
        + numel(shape)). Its bounds keep each tensor coordinate's contribution inside the
        span of the dimensions it indexes, so a scatter along one dimension (torch's
        ``scatter(dim=...)``) leaves the other dimensions to the parallel grid. A
        coordinate out of range writes some element of ``x`` (the ISA's clamp): the caller
        checks bounds where it must raise."""
        shape = tuple(shape)
        self._check_coordinates("scatter", x, coords, shape)
        if isinstance(values, Tensor):
            if values.dtype is not x.dtype:
                raise ShapeError(f"scatter: {values.dtype.name} values into a "
                                 f"{x.dtype.name} tensor (cast them first)")
            if values.ndim > len(shape) or _broadcast(
                    [values._aligned(len(shape)).shape, shape]) != shape:
                raise ShapeError(f"scatter: values {list(values.shape)} do not broadcast "
                                 f"to {list(shape)}")
        out = self.copy(x)  # a fresh contiguous temporary: the scatter's target
        if math.prod(shape) == 0:
            return out
        k = self.builder.kernel(shape)
        at, strides, high = self._coordinate_offset(k, out, coords, shape)
        value = self._load(k, values) if isinstance(values, Tensor) else \
            k.const(values, x.dtype)
        k.scatter(out.buffer, value, at, mode, shape, out.offset, strides, (0, high))
        return out

    def _check_coordinates(self, op: str, x: Tensor, coords: tuple[Tensor | int, ...],
                           shape: tuple[int, ...]) -> None:
        """:meth:`gather`'s and :meth:`scatter`'s checks of ``coords`` into ``x`` over
        ``shape``, all made before a kernel is begun."""
        if len(coords) != x.ndim:
            raise ShapeError(f"{op}: {len(coords)} coordinates for a {x.ndim}-d tensor")
        if math.prod(x.shape) == 0 and math.prod(shape):
            raise ShapeError(f"{op}: {list(shape)} elements at the empty tensor "
                             f"{list(x.shape)}: every coordinate is out of range")
        for d, c in enumerate(coords):
            n = x.shape[d]
            if isinstance(c, int):
                if not 0 <= c < len(shape) or (shape[c] > n and n != 1):
                    raise ShapeError(f"{op}: axis {c} of {list(shape)} cannot walk "
                                     f"dimension {d} of {list(x.shape)}")
            elif not c.dtype.is_int:
                raise ShapeError(f"{op}: coordinates must be integers, not {c.dtype.name}")
            elif c.ndim > len(shape) or _broadcast([c._aligned(len(shape)).shape,
                                                    shape]) != shape:
                raise ShapeError(f"{op}: coordinates {list(c.shape)} do not broadcast to "
                                 f"{list(shape)}")

    def _coordinate_offset(self, k: KernelBuilder, x: Tensor,
                           coords: tuple[Tensor | int, ...], shape: tuple[int, ...]
                           ) -> tuple[Value, tuple[int, ...], int]:
        """In kernel ``k`` over ``shape``: the data-dependent part of ``coords``' element
        offset into ``x`` (each tensor coordinate, negative ones counted from the end,
        times its dimension's stride, summed in int64), the strides by which the result's
        axes walk ``x``'s dimensions (int coordinates), and the largest offset the tensor
        coordinates reach in range."""
        strides = [0] * len(shape)
        at, high = None, 0
        for d, c in enumerate(coords):
            n, stride = x.shape[d], x.strides[d]
            if isinstance(c, int):
                if n != 1:
                    strides[c] += stride
                continue
            i = self._load(k, c)
            i = i if i.dtype.name == "i64" else k.cast(i, "i64")
            if c.dtype.kind == "i":  # negative: counted from the end
                i = k.select(k.binary("lt", i, 0), k.binary("add", i, n), i)
            if stride != 1:
                i = k.binary("mul", i, stride)
            at = i if at is None else k.binary("add", at, i)
            high += (n - 1) * stride
        return (k.const(0, "i64") if at is None else at), tuple(strides), high

    def first_where(self, mask: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """(whether any element of the bool ``mask`` is set, ``values`` where the first
        set one is in row-major order), as 0-d tensors: what a check of data-dependent
        indices reports. One pass over ``mask`` (an argmax), then one element of each
        read at its coordinates."""
        if mask.shape != values.shape or not math.prod(mask.shape):
            raise ShapeError(f"first_where: mask {list(mask.shape)} and values "
                             f"{list(values.shape)} must have one non-empty shape")
        first = self.reduce("argmax", self.cast(mask, "u8"))
        stride = math.prod(mask.shape)
        if stride < 2**31:  # (backends without 64-bit division take 32-bit coordinates)
            first = self.cast(first, "i32")
        coords = []
        for d, n in enumerate(mask.shape):
            stride //= n
            c = first if stride == 1 else self.binary("div", first, stride)
            coords.append(self.binary("mod", c, n) if d else c)  # first // stride < n
        return self.gather(mask, tuple(coords), ()), self.gather(values, tuple(coords), ())

    def maximum(self, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
        return self.binary("max", a, b)

    def minimum(self, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
        return self.binary("min", a, b)

    def reduce(self, kind: str, x: Tensor, axes: int | tuple[int, ...] | None = None,
               keepdim: bool = False) -> Tensor:
        """Reduce over ``axes``: an int or a tuple; None or ``()`` reduce every dimension,
        as ``torch.sum(x, dim=())`` does. A 0-d tensor is one element (its ``argmax`` is
        0). The reduced dimensions become the kernel's trailing loop dimensions, so the
        kept ones can form its parallel grid."""
        axes = _reduced_axes(kind, x, axes)
        if kind in ("argmax", "argmin") and not x.ndim:  # the ISA needs an axis to count
            return self.reduce(kind, x.reshape(1), 0)
        kept = [d for d in range(x.ndim) if d not in axes]
        order = kept + list(axes)
        k = self.builder.kernel(tuple(x.shape[d] for d in order))
        value = self._load(k, x.permute(*order))
        value = k.reduce(kind, value, tuple(range(len(kept), x.ndim))) if axes else value
        out_shape = tuple(x.shape[d] for d in kept)
        out = self._temp(value.dtype, out_shape)
        k.store(out.buffer, value)
        if not keepdim:
            return out
        return out.reshape(*(1 if d in axes else x.shape[d] for d in range(x.ndim)))

    def sum(self, x, axes=None, keepdim=False):
        return self.reduce("sum", x, axes, keepdim)

    def max(self, x, axes=None, keepdim=False):
        return self.reduce("max", x, axes, keepdim)

    def mean(self, x: Tensor, axes=None, keepdim=False) -> Tensor:
        """The sum over ``axes`` divided by their element count (0/0 gives NaN, as in
        NumPy). f16 and bf16 are summed and divided in f32 and rounded once, as PyTorch
        does: their own sum overflows past 65,504 (f16), and so may the count."""
        axes = _reduced_axes("mean", x, axes)
        count = math.prod(x.shape[a] for a in axes)
        if x.dtype.name in ("f16", "bf16"):
            total = self.reduce("sum", self.cast(x, "f32"), axes, keepdim)
            return self.cast(total / count, x.dtype)
        return self.reduce("sum", x, axes, keepdim) / count

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """NumPy ``matmul``: batched over leading dimensions, 1-D operands as vectors."""
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError("matmul: operands must have at least one dimension")
        va, vb = a.ndim == 1, b.ndim == 1
        a = a.reshape(1, a.shape[0]) if va else a
        b = b.reshape(b.shape[0], 1) if vb else b
        (m, ka), (kb, n) = a.shape[-2:], b.shape[-2:]
        if ka != kb:
            raise ShapeError(f"matmul: inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
        batch = _broadcast([a._aligned(max(a.ndim, b.ndim)).shape[:-2],
                           b._aligned(max(a.ndim, b.ndim)).shape[:-2]])
        k = self.builder.kernel(batch + (m, n, ka))
        # a[..., M, K] read as [..., M, 1, K]; b[..., K, N] read as [..., 1, N, K].
        av = a._aligned(len(batch) + 2)
        bv = b._aligned(len(batch) + 2)
        la = self._load(k, av._view(av.shape[:-1] + (1, ka),
                                    av.strides[:-1] + (0, av.strides[-1]), av.offset))
        lb = self._load(k, bv._view(bv.shape[:-2] + (1, n, kb),
                                    bv.strides[:-2] + (0, bv.strides[-1], bv.strides[-2]),
                                    bv.offset))
        value = k.contract(la, lb, len(batch) + 2)
        out = self._temp(value.dtype, batch + (m, n))
        k.store(out.buffer, value)
        if va or vb:
            keep = batch + ((m,) if not va else ()) + ((n,) if not vb else ())
            return out.reshape(*keep)
        return out
