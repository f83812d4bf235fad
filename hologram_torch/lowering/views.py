"""View and copy ops as graph values: ``view``/``_unsafe_view``/``_reshape_alias``,
``permute``, ``t``, ``transpose``, ``expand``, ``unsqueeze``, ``squeeze``, ``slice``,
``select``, ``alias``, ``clone`` and ``_to_copy`` (a dtype conversion).

A graph tensor is a view (a buffer with an affine map), so these cost nothing in a compiled
program except ``clone``/``_to_copy`` and a reshape of a non-contiguous view (a copy, with
the same values). The eager device runs them as metadata operations on its tensors (they
build no program); here they are what torch.compile's graphs need between computations.
``as_strided`` (a map onto the storage, not onto the view) and ``unfold`` are not lowered.
"""

from __future__ import annotations

from hologram_torch.lowering.common import (
    Unsupported,
    aten,
    cast,
    isa,
    register,
)


def _dim(x, dim: int, extra: int = 0) -> int:
    rank = max(x.ndim + extra, 1)
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range")  # torch raises
    return dim % rank


@register(aten.view.default, aten._unsafe_view.default)
def view(g, self, size):
    return self.reshape(*size)


@register(aten._reshape_alias.default)
def reshape_alias(g, self, size, stride):
    return self.reshape(*size)


@register(aten.alias.default)
def alias(g, self):
    return self


@register(aten.permute.default)
def permute(g, self, dims):
    return self.permute(*(_dim(self, d) for d in dims))


@register(aten.transpose.int)
def transpose(g, self, dim0, dim1):
    if self.ndim == 0:
        return self
    order = list(range(self.ndim))
    a, b = _dim(self, dim0), _dim(self, dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(*order)


@register(aten.t.default)
def t(g, self):
    if self.ndim > 2:
        raise Unsupported("t of more than 2 dimensions")  # torch raises
    return self.permute(1, 0) if self.ndim == 2 else self


@register(aten.expand.default)
def expand(g, self, size, *, implicit=False):
    lead = len(size) - self.ndim
    if lead < 0:
        raise Unsupported("expand to fewer dimensions")  # torch raises
    shape = tuple(self.shape[d - lead] if n == -1 else n for d, n in enumerate(size))
    return self.broadcast_to(shape)


@register(aten.unsqueeze.default)
def unsqueeze(g, self, dim):
    d = _dim(self, dim, extra=1)
    return self._view(self.shape[:d] + (1,) + self.shape[d:],
                      self.strides[:d] + (0,) + self.strides[d:], self.offset)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(g, self, dim=None):
    if self.ndim == 0:
        return self
    if dim is None:
        dims = set(range(self.ndim))
    else:
        dims = {_dim(self, d) for d in ((dim,) if isinstance(dim, int) else dim)}
    keep = [d for d in range(self.ndim) if not (d in dims and self.shape[d] == 1)]
    return self._view(tuple(self.shape[d] for d in keep), tuple(self.strides[d] for d in keep),
                      self.offset)


def slice_bounds(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    """``slice``'s start and end along a dimension of ``n``: torch clamps them into
    ``[0, n]`` after wrapping negative ones once."""
    start = 0 if start is None else min(max(start + n if start < 0 else start, 0), n)
    end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
    return start, end


@register(aten.slice.Tensor)
def slice_(g, self, dim=0, start=None, end=None, step=1):
    if step <= 0:
        raise Unsupported("slice step must be positive")  # torch raises
    d = _dim(self, dim)
    start, end = slice_bounds(self.shape[d], start, end)
    return self[(slice(None),) * d + (slice(start, max(start, end), step),)]


@register(aten.select.int)
def select(g, self, dim, index):
    d = _dim(self, dim)
    n = self.shape[d]
    if not -n <= index < n:
        raise Unsupported(f"index {index} out of range")  # torch raises
    return self[(slice(None),) * d + (index % n,)]


@register(aten.clone.default)
def clone(g, self, *, memory_format=None):
    return g.copy(self)


@register(aten._to_copy.default)
def to_copy(g, self, *, dtype=None, layout=None, device=None, pin_memory=None,
            non_blocking=False, memory_format=None):
    """A copy in ``dtype`` (the device is the program's: ignored)."""
    return g.copy(self) if dtype is None or isa(dtype) is self.dtype else \
        cast(self, isa(dtype))
