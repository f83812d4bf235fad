"""Canonicalization: bring every kernel to one minimal normal form.

Two programs that compute the same thing in different spellings (``a+b`` and ``b+a``,
``x*2`` and ``x+x``) reach the same canonical program, so they share one cache entry and
one compiled kernel.

Per kernel, the body is rebuilt front to back through a hash-consing table (identical
instructions merge: common subexpressions vanish), and each instruction first passes
through the rewrite rules below. Rules see operands that are already canonical. Then dead
instructions are dropped and the body is put in a canonical order: loads first, sorted by
what they read, then everything else in depth-first order from the stores, sorted.
Operand order of commutative ops, and that sort, use a structural digest of each value's
expression tree that is the same in every process.

Across kernels: stores to temporaries nobody reads are dropped, kernels with no stores
are dropped, and unused temporaries are removed. A kernel that only copies a whole
temporary, element for element, into another buffer goes: the temporary's one writer
stores into that buffer instead (a lowering that computes into a temporary, then copies
into its ``out``: a convolution's batched product).

Every rule is exact under IEEE 754: results, including NaN, ±inf and -0.0, do not change
(NaN payloads are not preserved). Rules that are not exact run only with ``fast_math``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from hologram.compiler.options import CompileOptions
from hologram.isa import dtypes as dt
from hologram.isa.body import Body
from hologram.isa.ir import (
    COMMUTATIVE_OPS,
    MEMORY_OPS,
    WRITE_OPS,
    BufferDecl,
    Instr,
    Kernel,
    Program,
    encode_const,
)
from hologram.isa.semantics import evaluate

_SWAPPED_COMPARE = {"gt": "lt", "ge": "le"}
_UNFOLDABLE = ("load", "store", "gather", "scatter", "index")


# --- rules -----------------------------------------------------------------------------
# A rule takes (body, instr) where instr's operands are indices into body, and returns the
# index of an equivalent value, or None. The result may be narrower than the instruction
# (a constant for a whole tensor): a value of extent 1 broadcasts along that dimension, and
# consumers are re-typed from their operands.
Rule = Callable[[Body, Instr], int | None]


def _is_const(body: Body, i: int, value: object | None = None) -> bool:
    instr = body.get(i)
    if instr.op != "const":
        return False
    return value is None or instr.attrs[0] == encode_const(instr.dtype, value)


def _const_side(body: Body, instr: Instr, value: object) -> int | None:
    """The other operand of a binary op if one operand is the constant ``value``."""
    a, b = instr.args
    if _is_const(body, b, value):
        return a
    if _is_const(body, a, value) and instr.op in COMMUTATIVE_OPS:
        return b
    return None


def fold_constants(body: Body, instr: Instr) -> int | None:
    """Evaluate instructions whose operands are all constants with the ISA's executable
    semantics (which the reference interpreter runs), so folding can never disagree with
    execution."""
    if instr.op in _UNFOLDABLE or not instr.args:
        return None
    if not all(_is_const(body, a) for a in instr.args):
        return None
    args = [np.full(body.get(a).shape, body.get(a).value, body.get(a).dtype.compute)
            for a in instr.args]
    value = evaluate(instr, args, body.domain).reshape(-1)
    if value.size != 1:
        return None
    return body.const(value[0].item(), instr.dtype)


def trivial_reductions(body: Body, instr: Instr) -> int | None:
    """Reducing a value that is constant along the reduced axes: n copies of one element."""
    if instr.op != "reduce":
        return None
    x = body.get(instr.args[0])
    if any(x.shape[a] != 1 for a in instr.axes):
        return None
    n = 1
    for a in instr.axes:
        n *= body.domain[a]
    kind = instr.kind
    if kind in ("argmax", "argmin"):
        return body.const(0, dt.int64)
    if n == 0:  # the reduction's identity
        identity = {"sum": 0, "prod": 1, "max": x.dtype.min, "min": x.dtype.max}[kind]
        return body.const(identity, x.dtype)
    if n == 1 or kind in ("max", "min"):
        return instr.args[0]
    if kind == "sum" and x.dtype.is_int:  # wrapping n*x is exactly the wrapped sum
        return body.make("mul", (instr.args[0], body.const(n, x.dtype)))
    return None


def float_identities(body: Body, instr: Instr) -> int | None:
    """Identities exact for every IEEE value (and trivially for integers)."""
    op, t = instr.op, instr.dtype
    if op == "add":
        x = _const_side(body, instr, -0.0) if t.is_float else _const_side(body, instr, 0)
        if x is not None:
            return x  # x + -0.0 == x for every x, including -0.0 (x + 0.0 is not)
        a, b = instr.args
        if a == b and not t.is_bool:
            return body.make("mul", (a, body.const(2, t)))  # exact: one rounding of 2x
        for x, y in ((a, b), (b, a)):
            if body.get(y).op == "neg":
                return body.make("sub", (x, body.get(y).args[0]))
    if op == "sub":
        a, b = instr.args
        if _is_const(body, b, 0):
            return a  # x - (+0.0) == x + (-0.0) == x
        if body.get(b).op == "neg":
            return body.make("add", (a, body.get(b).args[0]))
        if a == b and t.is_int:
            return body.const(0, t)
    if op in ("mul", "div"):
        x = _const_side(body, instr, 1)
        if x is not None:
            return x
        x = _const_side(body, instr, -1)
        if x is not None and not (op == "div" and t.kind == "u"):  # u8: -1 encodes 255
            return body.make("neg", (x,))
        if op == "mul" and t.is_int and _const_side(body, instr, 0) is not None:
            return body.const(0, t)
    if op in ("min", "max", "and", "or") and instr.args[0] == instr.args[1]:
        return instr.args[0]
    if op == "xor" and instr.args[0] == instr.args[1]:
        return body.const(0, t)
    if op in ("neg", "not") and body.get(instr.args[0]).op == op:
        return body.get(instr.args[0]).args[0]
    if op == "abs" and t.kind == "u":
        return instr.args[0]  # unsigned: abs is the identity (and -x wraps, so no |-x|)
    if op == "abs" and body.get(instr.args[0]).op in ("abs", "neg"):
        return body.make("abs", (body.get(instr.args[0]).args[0],))
    return None


def logic_identities(body: Body, instr: Instr) -> int | None:
    op, t = instr.op, instr.dtype
    if op in ("and", "or") and not t.is_float:
        ones = True if t.is_bool else -1
        absorbing, neutral = (0, ones) if op == "and" else (ones, 0)
        if _const_side(body, instr, neutral) is not None:
            return _const_side(body, instr, neutral)
        if _const_side(body, instr, absorbing) is not None:
            return body.const(absorbing, t)
    if op == "select":
        c, a, b = instr.args
        if a == b:
            return a
        if _is_const(body, c):
            return a if body.get(c).value else b
        if body.get(c).op == "not":
            return body.make("select", (body.get(c).args[0], b, a))
    if op in _SWAPPED_COMPARE:
        a, b = instr.args
        return body.make(_SWAPPED_COMPARE[op], (b, a))
    if op in ("eq", "le") and instr.args[0] == instr.args[1] and not body.get(
        instr.args[0]
    ).dtype.is_float:
        return body.const(True, dt.bool_)
    if op in ("ne", "lt") and instr.args[0] == instr.args[1] and not body.get(
        instr.args[0]
    ).dtype.is_float:
        return body.const(False, dt.bool_)
    return None


def casts(body: Body, instr: Instr) -> int | None:
    if instr.op != "cast":
        return None
    x = body.get(instr.args[0])
    if x.dtype is instr.dtype:
        return instr.args[0]
    if x.op == "cast" and dt.exactly_representable(body.get(x.args[0]).dtype, x.dtype):
        # The inner cast is exact, so it can be skipped.
        return body.make("cast", (x.args[0],), (), instr.dtype)
    return None


def integer_reassociation(body: Body, instr: Instr) -> int | None:
    """(x + c1) + c2 -> x + (c1 + c2), likewise for mul: exact in wrapping integers."""
    if instr.op not in ("add", "mul") or not instr.dtype.is_int:
        return None
    a, b = instr.args
    inner, c2 = (a, b) if _is_const(body, b) else (b, a)
    if not _is_const(body, c2) or body.get(inner).op != instr.op:
        return None
    x, c1 = body.get(inner).args
    if not _is_const(body, c1):
        x, c1 = c1, x
    if not _is_const(body, c1):
        return None
    return body.make(instr.op, (x, body.make(instr.op, (c1, c2))))


def fast_math(body: Body, instr: Instr) -> int | None:
    """Rewrites that can change NaN, ±inf or -0.0 results; only with fast_math."""
    if not body.options.fast_math or not instr.dtype.is_float:
        return None
    op = instr.op
    if op == "add":
        x = _const_side(body, instr, 0.0)
        if x is not None:
            return x
        for m, c in (instr.args, instr.args[::-1]):
            if body.get(m).op == "mul":
                return body.make("fma", (*body.get(m).args, c))
    if op == "mul" and _const_side(body, instr, 0.0) is not None:
        return body.const(0.0, instr.dtype)
    if op == "sub" and instr.args[0] == instr.args[1]:
        return body.const(0.0, instr.dtype)
    if op == "div" and instr.args[0] == instr.args[1]:
        return body.const(1.0, instr.dtype)
    return None


RULES: tuple[Rule, ...] = (
    fold_constants, trivial_reductions, float_identities, logic_identities, casts,
    integer_reassociation, fast_math,
)


# --- the engine ------------------------------------------------------------------------
def rewrite(kernel: Kernel, options: CompileOptions) -> tuple[Kernel, bool]:
    """The kernel rebuilt through the rules, and whether any rule applied."""
    body = Body(kernel.domain, kernel.grid_rank, options)
    remap: list[int] = []
    fired = False
    for instr in kernel.body:
        args = tuple(remap[a] for a in instr.args)
        if instr.op in MEMORY_OPS:  # declared shapes (gather, scatter) are kept
            remap.append(body.add(instr.with_args(args)))
            continue
        # Re-typed where an operand was narrowed.
        instr = body.get(body.copy(instr, args, kernel.body))
        result = None
        for rule in RULES:
            result = rule(body, instr)
            if result is not None:
                assert body.get(result).dtype is instr.dtype, (rule, instr)
                fired = True
                break
        remap.append(body.interned[instr] if result is None else result)
    return _ordered(kernel, body), fired


def _ordered(kernel: Kernel, body: Body, dead: frozenset[int] = frozenset()) -> Kernel:
    """Drop dead values (and writes to the buffers in ``dead``) and emit loads first, then
    the writes' (stores' and scatters') operand trees depth-first.

    Loads go first so that a point-to-point read-modify-write (x += 1) keeps its load
    before its store; writes to different buffers commute (a scattered buffer is accessed
    by nothing else in its kernel), so sorting them is safe.
    """
    order: list[int] = []
    seen: set[int] = set()

    def visit(root: int) -> None:  # post-order, iterative: chains can be thousands deep
        stack = [(root, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                order.append(i)
            elif i not in seen:
                seen.add(i)
                stack.append((i, True))
                stack.extend((a, False) for a in reversed(body.get(i).args))

    stores = [i for i, ins in enumerate(body.instrs) if ins.op in WRITE_OPS
              and ins.buffer not in dead]
    live: set[int] = set()
    stack = list(stores)
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(body.get(i).args)
    for i in sorted((i for i in live if body.get(i).op == "load"), key=body.digest):
        visit(i)
    for i in sorted(stores, key=body.digest):
        visit(i)
    position = {old: new for new, old in enumerate(order)}
    instrs = tuple(body.get(i).with_args(tuple(position[a] for a in body.get(i).args))
                   for i in order)
    return kernel.evolve(body=instrs)


def drop_stores(kernel: Kernel, buffers: frozenset[int]) -> Kernel | None:
    """``kernel`` without its stores and scatters to ``buffers`` and what only they used;
    None if no write is left."""
    if not kernel.writes() - buffers:
        return None
    body = Body(kernel.domain, kernel.grid_rank)
    for instr in kernel.body:
        body.push(instr)
    return _ordered(kernel, body, buffers)


def _drop_dead_buffers(program: Program) -> Program:
    """Remove writes to temporaries no later kernel reads, empty kernels, unused temps
    (``program`` itself when there are none)."""
    kernels: list[Kernel] = []
    read_later: set[int] = set()
    changed = False
    for kernel in reversed(program.kernels):  # one backward pass: what is read later
        dead = frozenset(b for b in kernel.writes()
                         if program.buffers[b].kind == "temp" and b not in read_later)
        if dead:
            kernel = drop_stores(kernel, dead)
            changed = True
        if kernel is not None:
            kernels.append(kernel)
            read_later |= kernel.reads()
    kernels.reverse()
    used = set().union(*(k.reads() | k.writes() for k in kernels))
    keep = [i for i, b in enumerate(program.buffers) if b.kind != "temp" or i in used]
    if not changed and len(keep) == len(program.buffers):
        return program
    new_index = {old: new for new, old in enumerate(keep)}

    def renumber(instr: Instr) -> Instr:
        if instr.op not in MEMORY_OPS or new_index[instr.buffer] == instr.buffer:
            return instr
        return replace(instr, attrs=(new_index[instr.buffer], *instr.attrs[1:]))

    return program.evolve(
        buffers=tuple(program.buffers[i] for i in keep),
        kernels=tuple(k.evolve(body=tuple(map(renumber, k.body))) for k in kernels),
    )


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Do ``strides`` walk ``shape`` in row-major order from element 0, each element once?"""
    step = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def _whole_copy(kernel: Kernel, buffers: tuple[BufferDecl, ...]) -> tuple[int, int] | None:
    """(temporary, target) when ``kernel`` only copies a whole temporary into a buffer of
    the same dtype and size, element i to element i; else None."""
    if len(kernel.body) != 2 or kernel.body[0].op != "load" or kernel.body[1].op != "store":
        return None
    load, store = kernel.body
    t, out = load.buffer, store.buffer
    if (store.args != (0,) or buffers[t].kind != "temp" or t == out
            or buffers[t].dtype != buffers[out].dtype
            or not buffers[t].size == buffers[out].size == math.prod(kernel.domain)
            or load.shape != kernel.domain or store.shape != kernel.domain
            or load.map.offset or store.map.offset
            or not _dense(kernel.domain, load.map.strides)
            or not _dense(kernel.domain, store.map.strides)):
        return None
    return t, out


def _forward_copies(program: Program) -> Program:
    """``program`` without the kernels that only copy a whole temporary into another
    buffer in the same element order, the temporary's single writer storing into that
    buffer instead (``program`` itself when there are none). Exact: the writer stores
    the same values to the same elements, and nothing between it and the copy touches
    the buffer (the temporary, no longer used, is dropped after)."""
    kernels = list(program.kernels)
    j = 0
    while j < len(kernels):
        found = _whole_copy(kernels[j], program.buffers)
        writers = [i for i in range(j) if found[0] in kernels[i].writes()] if found else []
        if len(writers) != 1:
            j += 1
            continue
        (t, out), i = found, writers[0]
        writer = kernels[i]
        if (any(x.buffer == t and x.op != "store" for x in writer.body if x.op in MEMORY_OPS)
                or any(t in k.reads() for n, k in enumerate(kernels) if n != j)
                or any(out in k.reads() | k.writes() for k in kernels[i:j])):
            j += 1
            continue
        kernels[i] = writer.evolve(body=tuple(
            replace(x, attrs=(out, *x.attrs[1:])) if x.op == "store" and x.buffer == t else x
            for x in writer.body))
        del kernels[j]  # (j is now the next kernel's position)
    if len(kernels) == len(program.kernels):
        return program
    return program.evolve(kernels=tuple(kernels))


def canonicalize(program: Program, options: CompileOptions | None = None) -> Program:
    """The canonical form of ``program`` (a pure function; the input is not modified)."""
    options = options or CompileOptions()
    if options in _CANONICAL.get(program, ()):
        return program
    # Dead stores first (fusion leaves its producers' stores to temporaries it inlined):
    # the first round then often changes nothing but the order, and is the last.
    program = _drop_dead_buffers(_forward_copies(program))
    for _ in range(8):  # rules can enable each other; a few rounds reach the fixpoint
        rewritten = [rewrite(k, options) for k in program.kernels]
        built = program.evolve(kernels=tuple(k for k, _ in rewritten))
        result = _drop_dead_buffers(_forward_copies(built))
        if result == program:
            converged = True
            break
        program = result
        if result is built and not any(fired for _, fired in rewritten):
            # No rule applied and nothing was dropped: the round only ordered the bodies
            # and merged equal instructions, which a next round would find as they are
            # (the order is a function of the instructions, and the rules already saw each
            # instruction with its operands in that order): a fixpoint, without a round
            # to confirm it.
            converged = True
            break
    else:
        converged = False
    names = iter(range(len(program.kernels)))
    program = program.evolve(kernels=tuple(k.evolve(name=f"k{next(names)}")
                                             for k in program.kernels))
    if converged:  # a fixpoint (the rules ignore kernel names): canonical as it is
        _CANONICAL.setdefault(program, set()).add(options)
    return program


# Canonical forms made in this process, with the options they are canonical under: the
# pipeline canonicalizes again after fusion, which leaves most programs as they were
# (a kernel each), and a second pass over them would only confirm the fixpoint.
_CANONICAL: weakref.WeakKeyDictionary[Program, set[CompileOptions]] = \
    weakref.WeakKeyDictionary()
