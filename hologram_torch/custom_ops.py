"""``hologram_torch.custom_op``: a function written with Hologram's tensor front end as a
PyTorch operator.

    import torch
    from torch import Tensor
    import hologram_torch
    from hologram.frontend import functional as hf

    @hologram_torch.custom_op("mylib::bias_gelu")
    def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
        return hf.gelu(x + bias)                  # x, bias: graph tensors here

    y = bias_gelu(torch.randn(64, 128, requires_grad=True), torch.randn(128))
    y.sum().backward()                            # a derived backward, one fused program

The function is called on :class:`hologram.frontend.graph.Tensor` values (one per tensor
argument) and Python values (every other argument), and returns graph tensors; an
``hg.jit`` function (built from ``hg.ops`` calls) works too. Its annotations give the
operator's schema (``torch.library.infer_schema``: tensors, optional tensors, lists of
tensors, numbers, bools, strings, several outputs). What ``torch.library.custom_op``
gets:

* the implementation: the function's program, compiled once per signature (shapes,
  dtypes, strides, non-tensor values: these are compile-time constants), launched on
  CPU tensors in place (zero-copy, Hologram's cpu backend) or on ``hologram`` tensors
  (where recorded execution records it like an aten op);
* the fake implementation, from the graph's own shape and dtype inference (a symbolic
  size is specialized to its value: the program's shapes are concrete);
* the gradient, derived by reverse-mode differentiation of the graph
  (:mod:`hologram.frontend.grad`) as a second operator, ``<name>_backward``, whose
  program recomputes what it needs of the forward and fuses it with the backward; or
  the user's ``backward=``, a front-end function of the forward's arguments followed by
  one gradient per output, returning one gradient (or None) per tensor argument;
* lowerings for ``torch.compile(backend="hologram")``, which fuses both operators with
  their neighbours (Inductor, like any other compiler, sees them as opaque ops with fake
  implementations, and does not break the graph).

An operator that mutates arguments (``mutates_args``) returns their new values first, in
``mutates_args``'s order, then its outputs; each is written back with one copy. Such an
operator has no derived gradient (PyTorch's rule for mutating operators).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from hologram.errors import HologramError
from hologram.frontend.grad import Tape, gradients, rehome
from hologram.frontend.graph import Graph
from hologram.frontend.graph import Tensor as GraphTensor
from hologram.sdk.jit import JitFunction
from hologram_torch import fallback
from hologram_torch.aten import runner
from hologram_torch.compile import graph_lowerings
from hologram_torch.lowering.common import ISA, TORCH

__all__ = ["custom_op"]


def custom_op(name: str, fn: Callable | None = None, /, *,
              mutates_args: Iterable[str] | str = (), backward: Callable | None = None,
              schema: str | None = None):
    """Make ``fn``, a function of graph tensors (or an ``hg.jit`` function), the PyTorch
    operator ``name`` (``"namespace::name"``); usable as a decorator. Returns the
    ``torch.library.CustomOpDef`` (call it as the op; ``op._opoverload`` is the ATen
    overload). See the module docstring."""
    def define(fn: Callable):
        return _Definition(name, fn, mutates_args, backward, schema).op

    return define if fn is None else define(fn)


# --- arguments: the schema's values as tensors to launch on, and constants ------------

def _kind(arg: torch._C.Argument) -> str:
    """How an argument of the schema travels: ``tensor``, ``tensors`` (a list) or
    ``value`` (a compile-time constant; an optional tensor is one of the first two when
    given)."""
    text = str(arg.type)
    if text in ("Tensor", "Optional[Tensor]"):
        return "tensor"
    if text in ("List[Tensor]", "List[Optional[Tensor]]"):
        return "tensors"
    return "value"


def _constant(value) -> object:
    """A non-tensor argument as a hashable key part; floats by their bits (0.0 and -0.0
    give different programs)."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_constant(v) for v in value))
    return ("value", value)


def _value(key) -> object:
    kind, v = key
    if kind == "float":
        return float.fromhex(v)
    if kind == "seq":
        return [_value(x) for x in v]
    return v


def _schema_type(text: str) -> str:
    """A schema argument type as the schema language spells it (``Optional[Tensor]`` is
    ``Tensor?``, ``List[int]`` is ``int[]``)."""
    if text.startswith("Optional[") and text.endswith("]"):
        return _schema_type(text[len("Optional["):-1]) + "?"
    if text.startswith("List[") and text.endswith("]"):
        return _schema_type(text[len("List["):-1]) + "[]"
    return text


class _Definition:
    """One operator: its schema, implementation, fake implementation, autograd formula and
    lowerings."""

    def __init__(self, name: str, fn: Callable, mutates_args, backward: Callable | None,
                 schema: str | None):
        self.name = name
        self.fn = fn
        self.user_backward = backward
        self.short = name.split("::")[-1]
        source = fn.fn if isinstance(fn, JitFunction) else fn
        mutates = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)
        if schema is None:
            schema = torch.library.infer_schema(source, mutates_args=mutates)
        self.op = torch.library.custom_op(name, self._impl, mutates_args=mutates,
                                          schema=schema)
        overload = self.op._opoverload
        self.schema = overload._schema
        self.arguments = list(self.schema.arguments)
        self.kinds = [_kind(a) for a in self.arguments]
        self.mutated = [i for i, a in enumerate(self.arguments)
                        if a.alias_info is not None and a.alias_info.is_write]
        self.outputs = len(self.schema.returns)
        self.op.register_fake(self._fake)
        if not self.mutated:
            _register_lowering(overload, self._lower)
            self.backward_op = self._define_backward()
            self.op.register_autograd(self._backward, setup_context=self._setup_context)

    # --- calling the front-end function --------------------------------------------------
    def _normalize(self, args: tuple, kwargs: dict) -> list:
        """The arguments in the schema's order, defaults filled in."""
        values = list(args)
        for a in self.arguments[len(args):]:
            if a.name in kwargs:
                values.append(kwargs[a.name])
            elif a.default_value is not None or a.type.kind() == "OptionalType":
                values.append(a.default_value)
            else:
                raise TypeError(f"{self.name}() missing required argument {a.name!r}")
        return values

    def _call(self, g: Graph, values: list) -> tuple[GraphTensor, ...]:
        """The function on graph values: its results (mutated arguments' new values, then
        outputs), checked."""
        positional, named = [], {}
        for a, v in zip(self.arguments, values):
            if a.kwarg_only:
                named[a.name] = v
            else:
                positional.append(v)
        if isinstance(self.fn, JitFunction):
            result = self.fn.inline(g, *positional, **named)
        else:
            result = self.fn(*positional, **named)
        results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        expected = len(self.mutated) + self.outputs
        if len(results) != expected or not all(isinstance(r, GraphTensor) for r in results):
            got = ", ".join(type(r).__name__ for r in results)
            raise HologramError(
                f"{self.name}: the function returned ({got}); the schema {self.schema} needs "
                f"{expected} graph tensors (new values of the mutated arguments first, then "
                "the outputs)")
        return results

    def _pack(self, values: list) -> tuple[list[torch.Tensor], tuple]:
        """The tensors to launch on, and the layout of every argument (constants by
        value) from which :meth:`_unpack` rebuilds the values on a graph."""
        tensors, layout = [], []
        for kind, v in zip(self.kinds, values):
            if kind == "value" or v is None:
                layout.append(_constant(v))
            elif kind == "tensor":
                tensors.append(v)
                layout.append(("tensor", None))
            else:
                layout.append(("tensors", tuple(t is not None for t in v)))
                tensors.extend(t for t in v if t is not None)
        return tensors, tuple(layout)

    @staticmethod
    def _unpack(inputs: Iterable, layout: tuple) -> list:
        inputs = iter(inputs)
        values = []
        for kind, v in layout:
            if kind == "tensor":
                values.append(next(inputs))
            elif kind == "tensors":
                values.append([next(inputs) if given else None for given in v])
            else:
                values.append(_value((kind, v)))
        return values

    # --- the implementation --------------------------------------------------------------
    def _device(self, tensors: list[torch.Tensor]) -> bool:
        """Checks the tensors' devices and dtypes; whether they are CPU tensors (``host``:
        computed on in place) rather than hologram tensors."""
        types = {t.device.type for t in tensors}
        if not types <= {"cpu", "hologram"}:
            raise RuntimeError(f"{self.name}: runs on CPU and hologram tensors, got tensors "
                               f"on {sorted(types)}; move them with .to('hologram') or "
                               ".cpu()")
        for t in tensors:
            if t.dtype not in ISA:
                raise RuntimeError(f"{self.name}: dtype {t.dtype} (a tensor of shape "
                                   f"{list(t.shape)}) is not supported; Hologram computes "
                                   "on floats, integers and bools")
        return types != {"hologram"} and "hologram" not in types

    def _impl(self, *args, **kwargs):
        values = self._normalize(args, kwargs)
        tensors, layout = self._pack(values)
        host = self._device(tensors)
        try:
            results = runner.run(f"custom.{self.name}", self._build, tensors, (layout,),
                                  host=host)
        except runner.Lacking:  # a dtype the backend lacks (f64 on webgpu): on the host
            return fallback.run_on_cpu(self.op._opoverload, *args, **kwargs)
        results = (results,) if isinstance(results, torch.Tensor) else results
        for i, new in zip(self.mutated, results):
            values[i].copy_(new)
        outputs = results[len(self.mutated):]
        if not outputs:
            return None
        return outputs[0] if self.outputs == 1 else tuple(outputs)

    def _build(self, g: Graph, *inputs_and_layout):
        *inputs, layout = inputs_and_layout
        return self._call(g, self._unpack(inputs, layout))

    def _fake(self, *args, **kwargs):
        values = self._normalize(args, kwargs)
        tensors, layout = self._pack(values)
        g = Graph("fake")
        # The program's shapes are concrete: a symbolic size is specialized (a guard).
        inputs = [g.input(f"x{i}", ISA[t.dtype], tuple(int(n) for n in t.shape))
                  if t.dtype in ISA else None for i, t in enumerate(tensors)]
        if None in inputs:
            self._device(tensors)  # raises, naming the dtype
        results = self._call(g, self._unpack(inputs, layout))
        device = tensors[0].device if tensors else torch.device("cpu")
        made = [torch.empty(r.shape, dtype=TORCH[r.dtype], device=device)
                for r in results[len(self.mutated):]]
        if not made:
            return None
        return made[0] if self.outputs == 1 else tuple(made)

    def _lower(self, g: Graph, *args, **kwargs):
        results = self._call(g, self._normalize(args, kwargs))
        results = tuple(rehome(r, g) for r in results)
        return results[0] if self.outputs == 1 else results

    # --- the gradient --------------------------------------------------------------------
    def _define_backward(self):
        params = ", ".join(f"{_schema_type(str(a.type))} {a.name}" for a in self.arguments)
        schema = f"({params}{', ' if params else ''}Tensor[] grads, bool[] wanted) -> Tensor[]"
        op = torch.library.custom_op(f"{self.name}_backward", self._backward_impl,
                                     mutates_args=(), schema=schema)
        op.register_fake(self._backward_fake)
        _register_lowering(op._opoverload, self._backward_lower)
        return op

    def _setup_context(self, ctx, inputs, output, keyword_only_inputs=None):
        values = list(inputs)
        if keyword_only_inputs:  # (torch passes them apart when the schema has them)
            values += [keyword_only_inputs.get(a.name, a.default_value)
                       for a in self.arguments[len(values):]]
        tensors, layout = self._pack(values)
        ctx.layout = layout
        ctx.save_for_backward(*tensors)

    def _backward(self, ctx, *grads):
        tensors = ctx.saved_tensors
        # What needs a gradient, per tensor (lists flattened as _pack flattens them).
        wanted = []
        for needs, (kind, v) in zip(ctx.needs_input_grad, ctx.layout):
            if kind == "tensor":
                wanted.append(bool(needs))
            elif kind == "tensors":
                wanted.extend(bool(needs) for given in v if given)
        wanted = [w and t.dtype.is_floating_point for w, t in zip(wanted, tensors)]
        if not any(wanted):
            return tuple(None for _ in ctx.needs_input_grad)
        values = self._unpack(tensors, ctx.layout)
        got = iter(self.backward_op(*values, list(grads), wanted))
        flat = iter([next(got) if w else None for w in wanted])
        result = []
        for kind, v in ctx.layout:
            if kind == "tensor":
                result.append(next(flat))
            elif kind == "tensors":
                result.append([next(flat) if given else None for given in v])
            else:
                result.append(None)
        # One per argument as the caller passed them (defaults left out).
        return tuple(result[:len(ctx.needs_input_grad)])

    def _split_backward(self, args: tuple, kwargs: dict):
        """The backward op's arguments: the forward's values, the output gradients and the
        wanted flags."""
        args = list(args)
        names = [a.name for a in self.arguments]
        forward = args[:len(names)] + [kwargs[n] for n in names[len(args):]]
        grads = args[len(names)] if len(args) > len(names) else kwargs["grads"]
        wanted = args[len(names) + 1] if len(args) > len(names) + 1 else kwargs["wanted"]
        return forward, list(grads), [bool(w) for w in wanted]

    def _backward_impl(self, *args, **kwargs):
        forward, grads, wanted = self._split_backward(args, kwargs)
        tensors, layout = self._pack(forward)
        host = self._device(tensors + grads)
        # Inputs with overlapping elements (expanded) get gradients element by element:
        # the program reads them as dense tensors.
        tensors = [t.contiguous() if w and _overlaps(t) else t
                   for t, w in zip(tensors, wanted)]
        try:
            results = runner.run(f"custom.{self.name}_backward", self._build_backward,
                                  tensors + grads, (layout, len(tensors), tuple(wanted)),
                                  host=host)
        except runner.Lacking:  # as in _impl
            return fallback.run_on_cpu(self.backward_op._opoverload, *args, **kwargs)
        return [results] if isinstance(results, torch.Tensor) else list(results)

    def _backward_fake(self, *args, **kwargs):
        forward, _, wanted = self._split_backward(args, kwargs)
        tensors, _ = self._pack(forward)
        return [torch.empty_like(t, memory_format=torch.contiguous_format)
                for t, w in zip(tensors, wanted) if w]

    def _build_backward(self, g: Graph, *args):
        *inputs, layout, count, wanted = args
        return self._gradients(g, inputs[:count], inputs[count:], layout, wanted)

    def _backward_lower(self, g: Graph, *args, **kwargs):
        forward, grads, wanted = self._split_backward(args, kwargs)
        tensors, layout = self._pack(forward)
        results = self._gradients(g, tensors, grads, layout, wanted)
        return [rehome(r, g) for r in results]

    def _gradients(self, g: Graph, tensors: list, grads: list, layout: tuple,
                   wanted: list[bool]) -> list[GraphTensor]:
        """The wanted tensors' gradients (graph tensors of their shapes and dtypes; zeros
        where none reaches), derived or the user's."""
        tape = Tape(f"{self.short}_backward", on=g)
        tensors = [tape.adopt(t) for t in tensors]
        grads = [tape.adopt(d) for d in grads]
        values = self._unpack(tensors, layout)
        if self.user_backward is not None:
            found = self._user_gradients(values, grads)
        else:
            outputs = self._call(tape, values)
            used = [(o, d) for o, d in zip(outputs, grads) if o.dtype.is_float]
            found = gradients([o for o, _ in used], [_as(d, o.dtype) for o, d in used],
                              tensors)
        results = []
        for t, d, w in zip(tensors, found, wanted):
            if not w:
                continue
            if d is None:  # no gradient reaches t: zeros (constant, folded)
                d = tape.cast(tape.arange(1) * 0, t.dtype).reshape().broadcast_to(t.shape)
            results.append(_as(d, t.dtype))
        return results

    def _user_gradients(self, values: list, grads: list) -> list:
        positional = [v for a, v in zip(self.arguments, values) if not a.kwarg_only]
        named = {a.name: v for a, v in zip(self.arguments, values) if a.kwarg_only}
        result = self.user_backward(*positional, *grads, **named)
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        flat = [t for v in values for t in (v if isinstance(v, list) else [v])
                if isinstance(t, GraphTensor)]
        if len(result) != len(flat):
            raise HologramError(f"{self.name}: backward returned {len(result)} gradients; it "
                                f"must return one per tensor argument ({len(flat)}), None "
                                "where there is none")
        for r, t in zip(result, flat):
            if r is not None and (not isinstance(r, GraphTensor) or r.shape != t.shape):
                raise HologramError(f"{self.name}: backward returned "
                                    f"{getattr(r, 'shape', r)!r} as the gradient of an "
                                    f"argument of shape {list(t.shape)}; return a graph "
                                    "tensor of that shape (or None)")
        return list(result)


def _register_lowering(op, fn) -> None:
    """``fn`` as ``op``'s lowering in compiled graphs: the table of lowerings only compiled
    graphs use (the eager device runs the op's own implementation; the shared ATen table
    lists ATen ops only)."""
    graph_lowerings.EXTRA[op] = fn


def _as(t: GraphTensor, dtype) -> GraphTensor:
    return t if t.dtype is dtype else t.graph.cast(t, dtype)


def _overlaps(t: torch.Tensor) -> bool:
    """Does ``t`` read one element at two of its indices (an expanded tensor)?"""
    return any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())) or (
        t.numel() > 1 and not t.is_contiguous()
        and math.prod(t.shape) > 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape,
                                                                            t.stride())))
