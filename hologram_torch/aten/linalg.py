"""Matrix products: ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv``,
``dot`` and ``vdot``, with their ``.out`` and in-place overloads.

The math of every product is its entry in :mod:`hologram_torch.lowering.linalg` (the table
torch.compile lowers through too). Every product is one ``Graph.matmul``: a ``contract`` op
that the CPU backend hands to
BLAS (``hologram.backends.cpu.gemm``) when the dtype is float32/float64 and both operands
have a unit stride in one of their two matrix dimensions (transposed views qualify).
Float operands that do not (e.g. a slice with a step) are made contiguous by a separate
copy first, so float32/float64 GEMMs always take the BLAS path. Integer products run as
generated loops (torch's CPU supports them too), and so do float16/bfloat16, which are
computed in float32 and rounded once, as torch's CPU kernels do (the casts fuse into the
contraction's loads, which BLAS cannot take).

The ``add*`` forms fuse ``beta * input + alpha * product`` into the GEMM's epilogue;
``beta == 0`` ignores ``input`` (NaN/inf in it do not propagate) and ``alpha == 1`` /
``beta == 1`` are specialised so ``nn.Linear`` pays no scaling. ``addbmm`` folds its
batch into the contraction (one GEMM), except in half types, where torch's CPU rounds
after every batch entry and so does this kernel.

``matmul``, ``linear``, ``einsum``, ``tensordot``, ``inner``, ``linalg.multi_dot`` are
composite in torch: they reach the device as the ops above plus views, ``expand`` and
contiguous copies. Their backward is the same products on transposed views (and
``sum`` for biases).

Shapes are checked by running the op's own meta kernel first (:func:`infer`), so
mismatches raise torch's exception type and message (prefixed with the op's name);
mixed operand dtypes, which some meta kernels accept, raise ``RuntimeError`` as torch's
CPU kernels do. Complex
dtypes (not in the ISA) run through the CPU fallback.

:func:`infer` and :func:`launch` are shared with :mod:`hologram_torch.aten.shape`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map

from hologram_torch import memory
from hologram_torch.aten import runner
from hologram_torch.aten.registry import aten, impl, overload
from hologram_torch.aten.runner import ISA
from hologram_torch.aten.tensor import copy_into
from hologram_torch.constants import NAME
from hologram_torch.fallback import run_on_cpu
from hologram_torch.lowering import Number, lower
from hologram_torch.lowering import linalg as lowering_linalg

OPINFO = ("mm", "bmm", "addmm", "addmm.decomposed", "addmv", "addbmm", "baddbmm", "dot",
          "vdot", "mv", "matmul", "__rmatmul__", "nn.functional.linear", "einsum",
          "inner", "tensordot", "linalg.multi_dot")

_inferred: dict[tuple, torch.Tensor] = {}  # infer's cache


# --- shared by the kernel families of this package --------------------------------------

def _to_meta(x: object) -> object:
    if isinstance(x, torch.Tensor) and x.device.type == NAME:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _signature(x: object) -> object:
    if isinstance(x, torch.Tensor):
        # the device as the flags (a tenth of ``x.device.type``'s cost: this runs for every
        # operand of every call of the kernels that infer their results)
        return (x.is_cpu, x.is_meta, x.is_cuda, x.dtype, x.shape, x.stride())
    if isinstance(x, (list, tuple)):
        return tuple(map(_signature, x))
    return (type(x), x)


def _check_devices(op, args, kwargs) -> None:
    """PyTorch's error for operands on another device (the meta kernel would name the
    meta device)."""
    for t in tree_flatten((args, kwargs))[0]:
        if isinstance(t, torch.Tensor) and t.device.type != NAME:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                               f"least two devices, {NAME}:0 and {t.device}! (when checking "
                               f"arguments for {op.__name__})")


def infer(op: torch._ops.OpOverload, *args, **kwargs) -> torch.Tensor:
    """Run ``op``'s meta kernel on metadata copies of the arguments: it raises torch's own
    error for bad shapes/dtypes, and its result gives the output's shape, dtype and
    strides (memory format included). Messages are prefixed with the op's name.

    Successful results are cached by signature (some meta kernels are Python
    decompositions costing more than a small GEMM); calls with ``out=`` are not, since
    their meta kernel also resizes ``out`` and warns about it."""
    key = None if "out" in kwargs else (
        op, _signature(args), _signature(tuple(sorted(kwargs.items()))) if kwargs else ())
    meta = _inferred.get(key)
    if meta is not None:
        return meta
    _check_devices(op, args, kwargs)
    try:
        meta = op(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except (RuntimeError, IndexError, ValueError, TypeError) as exc:
        raise type(exc)(f"{op.__name__}: {exc}") from None
    if key is not None:
        if len(_inferred) >= runner.CACHE_ENTRIES:
            _inferred.clear()
        _inferred[key] = meta
    return meta


def _shares_memory(a: torch.Tensor, b: object) -> bool:
    return (isinstance(b, torch.Tensor) and b.device.type == NAME and b.numel() > 0
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def launch(op: torch._ops.OpOverload, args: Sequence, kwargs: dict, name: str,
           build: Callable, inputs: Sequence, static: tuple = (),
           out: torch.Tensor | None = None, meta: torch.Tensor | None = None) -> torch.Tensor:
    """The common path of a kernel with one result: validate with the meta kernel,
    allocate the result like torch would (or resize ``out``), and run ``build`` on
    ``inputs`` into it. Unsupported dtypes go to the CPU fallback with the original
    ``args``/``kwargs``. So does an ``out`` that overlaps itself or shares memory with an
    input: PyTorch's kernels raise for most (``cat``, the index ops) and compute the rest
    in their own order (a product into its operand), which the CPU kernel reproduces.
    ``meta``: the result of :func:`infer` on these arguments, when the caller already has
    it."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not runner.supported(*tensors) or (out is not None and (
            out.dtype not in ISA or memory.internal_overlap(out)
            or any(_shares_memory(out, t) for t in tensors))) or any(
            isinstance(x, complex) for x in inputs):
        return run_on_cpu(op, *args, **kwargs)
    meta = infer(op, *args, **kwargs) if meta is None else meta
    if out is None:  # (contiguous: the pool's fast path, no set_ through the dispatcher)
        out = memory.empty(meta.shape, meta.dtype,
                           None if meta.is_contiguous() else list(meta.stride()))
    elif out.shape != meta.shape:
        out.resize_(meta.shape)
    if out.numel():
        runner.run(name, build, inputs, static, out=(out,))
    return out


def kernels(name: str, fn: Callable, hot: bool = False) -> None:
    """Register ``fn(op, *args, out=None, **kwargs)`` for overload ``name``, its ``out=``
    overload (``mm.out``, ``scatter.src_out``) and its in-place overload (``addmm_``,
    ``scatter_.src``) where they exist. The in-place form computes the functional result
    and copies it into ``self``, which must already have the result's shape. ``hot``: the
    functional overload behind the native front kernel (``fn`` files its calls)."""
    base, _, variant = name.partition(".")
    functional = overload(name)
    impl(name, hot=hot)(lambda *a, **k: fn(functional, *a, **k))
    out_name = f"{name}_out" if variant else f"{name}.out"
    op = overload(out_name)
    impl(out_name)(lambda *a, _op=op, **k: fn(_op, *a, **k))
    inplace_name = f"{base}_.{variant}" if variant else f"{base}_"
    try:
        overload(inplace_name)
    except (AttributeError, RuntimeError):  # no in-place form (mm_ does not exist)
        return

    def inplace(self, *a, **k):
        if any(_shares_memory(self, t) for t in tree_flatten((a, k))[0]):
            return run_on_cpu(inplace_op, self, *a, **k)  # PyTorch's overlap rules
        result = fn(functional, self, *a, **k)
        if result.shape != self.shape:
            raise RuntimeError(f"{inplace_name}: the result's shape {list(result.shape)} "
                               f"does not match self's shape {list(self.shape)}")
        return copy_into(self, result)

    inplace_op = overload(inplace_name)
    impl(inplace_name)(inplace)


# --- builders: the lowering table's entries (hologram_torch.lowering.linalg) -------------

def _product_build(g, a, b, dtype):
    """``a @ b`` in opmath (the product of every product entry; ``dtype``, the operands',
    is part of the kernel's key)."""
    return lowering_linalg.product(g, a, b)


def _scalar(x, mode: str):
    """beta/alpha for a lowering: the Python number its mode names (0 or 1: specialised),
    else the runtime value."""
    return 0 if mode == "zero" else 1 if mode == "one" else Number.of(x)


def _affine_build(g, bias, a, b, beta, alpha, dtype, beta_mode, alpha_one, fold_batch):
    """``beta * bias + alpha * (a @ b)`` in one program (the generated-loop dtypes);
    ``fold_batch``: ``addbmm`` in a half type (other dtypes fold the batch into the GEMM
    before the program)."""
    beta, alpha = _scalar(beta, beta_mode), _scalar(alpha, "one" if alpha_one else "scale")
    if fold_batch:
        return lower(aten.addbmm.default, g, bias, a, b, beta=beta, alpha=alpha)
    return lowering_linalg.epilogue(g, bias, lowering_linalg.product(g, a, b), beta, alpha)


def _linear_build(g, bias, a, b, dtype):
    """``bias + a @ b`` (``linear``'s ``addmm``) in one program."""
    return lowering_linalg.epilogue(g, bias, lowering_linalg.product(g, a, b), 1, 1)


def _epilogue_build(g, bias, product, beta, alpha, beta_mode, alpha_one):
    """``beta * bias + alpha * product`` (the add* products' epilogue after BLAS)."""
    return lowering_linalg.epilogue(g, bias, product, _scalar(beta, beta_mode),
                                    _scalar(alpha, "one" if alpha_one else "scale"))


# --- kernels ----------------------------------------------------------------------------

def _same_dtype(op, *tensors) -> None:
    """torch's CPU products require one dtype (some meta kernels do not check it)."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        shown = " and ".join(f"{t.dtype} {list(t.shape)}" for t in tensors)
        raise RuntimeError(f"{op.__name__}: expected operands of the same dtype, got {shown}")


_BLAS = (torch.float32, torch.float64)


def _blas_operand(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it when BLAS could not read its matrices in place
    (no unit stride along rows or columns: a slice with a step, a strided vector). The
    copy is a program of its own: inside the product's program, fusion would inline it
    back into the contraction's loads and the GEMM would run as generated loops."""
    if t.dtype not in _BLAS or t.dim() == 0:
        return t
    if t.dim() == 1:
        return t if t.shape[0] <= 1 or t.stride(0) == 1 else t.contiguous()
    (rows, cols), (s_row, s_col) = t.shape[-2:], t.stride()[-2:]
    return t if rows <= 1 or cols <= 1 or 1 in (s_row, s_col) else t.contiguous()


def _product_kernel(op, a, b, out=None):
    # A signature seen before with operands BLAS reads in place (the calls the native
    # front kernel serves, where it is loaded): one lookup and the launch.
    fresh = out is None and not (a.is_cpu or b.is_cpu)
    if fresh:
        key = (op, a.dtype, a.shape, a.stride(), b.dtype, b.shape, b.stride())
        entry = runner.shortcuts.get(key)
        if entry is not None:
            return runner.launch_fresh(entry, (a, b))
    if a.dtype is torch.bool:  # torch has no boolean products: its kernel raises
        return run_on_cpu(op, a, b, **({} if out is None else {"out": out}))
    _same_dtype(op, a, b)
    kwargs = {} if out is None else {"out": out}
    meta = infer(op, a, b, **kwargs) if a.dtype in ISA else None  # errors before any copy
    operands, static = (_blas_operand(a), _blas_operand(b)), (ISA.get(a.dtype),)
    if (fresh and operands[0] is a and operands[1] is b and a.dtype in _BLAS
            and meta.is_contiguous()):
        # The BLAS dtypes compute in their own (half types round the float32 product into
        # the result launch() allocates), and a product's result is contiguous: run()
        # makes it, and the launch is filed under the operands' signature.
        result = runner.run("linalg.product", _product_build, operands, static)
        runner.remember(key, "linalg.product", static, operands, result)
        return result
    return launch(op, (a, b), kwargs, "linalg.product", _product_build, operands, static,
                  out, meta)


def _affine(fold_batch: bool) -> Callable:
    """The kernel of an ``add*`` product; the in-place form writes into ``bias``."""
    def kernel(op, bias, a, b, *, beta=1, alpha=1, out=None):
        # ``linear``'s call (beta = alpha = 1, a fresh result): with a signature seen
        # before, one lookup and the launch (the native front kernel serves it, where
        # it is loaded)
        linear = (out is None and beta == 1 and alpha == 1 and not fold_batch
                  and a.dim() == 2 and b.dim() == 2)
        if linear:
            key = (op, bias.dtype, bias.shape, bias.stride(), a.dtype, a.shape, a.stride(),
                   b.dtype, b.shape, b.stride())
            entry = runner.shortcuts.get(key)
            if entry is not None:
                return runner.launch_fresh(entry, (bias, a, b))
        args = (bias, a, b)
        kwargs = {"beta": beta, "alpha": alpha, **({} if out is None else {"out": out})}
        if a.dtype is torch.bool:
            return run_on_cpu(op, bias, a, b, **kwargs)
        _same_dtype(op, bias, a, b)
        beta_mode = "zero" if beta == 0 else "one" if beta == 1 else "scale"
        fold, meta = fold_batch, None
        if a.dtype in ISA:
            meta = infer(op, bias, a, b, **kwargs)  # torch's errors before any reshape
            if fold and a.dtype not in (torch.float16, torch.bfloat16):
                # sum over the batch inside one GEMM: [B, n, m] @ [B, m, p] is
                # [n, B*m] @ [B*m, p] (half types round per batch entry instead)
                (batch, n, m), p = a.shape, b.shape[2]
                a, b, fold = (a.transpose(0, 1).reshape(n, batch * m),
                              b.reshape(batch * m, p), False)
            a, b = _blas_operand(a), _blas_operand(b)
            if (linear and a is args[1] and b is args[2] and a.dtype in _BLAS
                    and not bias.is_cpu and meta.is_contiguous()):
                # one program, filed under the operands' signature (BLAS takes the
                # product, the bias is its epilogue)
                static = (ISA[a.dtype],)
                result = runner.run("linalg.linear", _linear_build, args, static)
                runner.remember(key, "linalg.linear", static, args, result)
                return result
        static = (ISA.get(a.dtype), beta_mode, alpha == 1, fold)
        if a.dtype not in (torch.float32, torch.float64) or isinstance(alpha, complex) or \
                isinstance(beta, complex):
            return launch(op, args, kwargs, "linalg.affine", _affine_build,
                          (bias, a, b, beta, alpha), static, out, meta)
        return _blas_affine(op, args, kwargs, bias, a, b, beta, alpha, static[1:3], out,
                            meta)

    return kernel


def _blas_affine(op, args, kwargs, bias, a, b, beta, alpha, modes, out, meta):
    """The float32/float64 ``add*`` products as two programs: the GEMM, which BLAS writes
    straight into the result, then the epilogue in place. (Fused into one program, the
    CPU backend keeps the epilogue in the contraction's [.., M, N, K] kernel once BLAS
    has taken the product, and runs it K times over.)"""
    # the product is a fresh tensor even for out= (``meta`` is then out's: only its shape)
    fresh = meta if out is None else torch.empty(meta.shape, dtype=a.dtype, device="meta")
    product = launch(op, args, {k: v for k, v in kwargs.items() if k != "out"},
                     "linalg.product", _product_build, (a, b), (ISA[a.dtype],), None, fresh)
    if modes != ("zero", True) and product.numel():
        runner.run("linalg.epilogue", _epilogue_build, (bias, product, beta, alpha),
                    modes, out=(product,))
    if out is None:
        return product
    if out.shape != meta.shape:  # meta: infer's, which checked out's dtype
        out.resize_(meta.shape)
    return copy_into(out, product)


for _name in ("mm", "bmm", "mv", "dot", "vdot"):
    kernels(_name, _product_kernel, hot=True)
for _name, _fold in (("addmm", False), ("baddbmm", False), ("addmv", False),
                    ("addbmm", True)):
    kernels(_name, _affine(_fold), hot=_name == "addmm")

__all__ = ["OPINFO", "infer", "kernels", "launch"]
