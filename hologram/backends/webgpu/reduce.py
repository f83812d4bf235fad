"""Reductions in WGSL: one accumulator's variables, how a term is folded in, and its tree
over a workgroup (:mod:`.render` decides where each reduction runs).

- float sums: f32 with Neumaier's compensation per invocation; partials added in the tree;
- float products: a significand in [1, 2) and an exponent (``hg_prod``), scaled once;
- max/min and argmax/argmin: total-order keys of the bits (``hg_key_f32``; i64: the two
  words with the sign flipped, compared as u64): NaN wins, ``-0.0 < +0.0``, ties go to
  the first index;
- integer sums and products wrap (i64: ``hg_add64``, ``hg_mul64lo``); bool sum is ``or``,
  bool product ``and``.

A split reduction (:func:`.render.split`) stores each workgroup's result as a partial
state of 32-bit words (:meth:`Accumulator.state`) and folds the partials back in as
terms of the same kind (:meth:`Accumulator.fold_state`), so the rules above hold across
the chunks.
"""

from __future__ import annotations

import math

from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr

from .mathlib import f32_literal
from .values import REG, WORKGROUP

#: The WGSL type of i64 values: (low word, high word).
WIDE = "vec2<u32>"


def shared_array(wgsl_type: str) -> str:
    """The name of the workgroup array of ``wgsl_type`` values (one per invocation)."""
    return "hg_sh_" + wgsl_type.replace("<", "_").replace(">", "")


def tree(r, level) -> None:
    """The loop over a workgroup tree's levels, ``level()`` for the invocations below ``s``
    at each, a barrier after each."""
    def step() -> None:
        r.block("if (lid < s)", level)
        r.line("workgroupBarrier();")

    r.loop(f"for (var s = {r.workgroup // 2}u; s > 0u; s = s >> 1u)",
           r.workgroup.bit_length() - 1, step)


class Accumulator:
    """One reduction's accumulator in a renderer: its variables, how a term is folded in,
    and (shared) the tree over the workgroup."""

    def __init__(self, r, kind: str, t: DType, reg: str):
        self.r, self.kind, self.t, self.reg = r, kind, t, reg
        self.keyed = kind in ("max", "min", "argmax", "argmin")
        self.largest = kind in ("max", "argmax")
        self.float_sum = kind == "sum" and t.is_float
        self.float_prod = kind == "prod" and t.is_float
        self.wide = reg == WIDE  # i64: two words; keys (low, high ^ sign) compare as u64
        if self.wide:
            r.used.add("hg_u64")
        self.best: str | None = None
        if self.keyed and self.wide:
            init = "vec2<u32>(0u, 0u)" if self.largest else "vec2<u32>(0xffffffffu, 0xffffffffu)"
            self.acc = r.var(init, WIDE)
            self.best = r.var("0", "i32") if kind.startswith("arg") else None
        elif self.wide:
            self.acc = r.var(f"vec2<u32>({int(kind == 'prod')}u, 0u)", WIDE)
        elif self.keyed:
            init = "0u" if self.largest else "0xffffffffu"
            self.acc = r.var(init, "u32")
            self.best = r.var("0", "i32") if kind.startswith("arg") else None
        elif self.float_sum:
            # -0.0 (the sum's identity) opaque to the compiler: a -0.0f it can see may be
            # folded to +0.0 (Triton's did so for NVIDIA GPUs; mathlib.f32_literal).
            self.acc = r.var(f32_literal(-0.0), "f32")
            self.comp = r.var("0.0f", "f32")
        elif self.float_prod:
            r.used.add("hg_prod")
            self.acc = r.var("HgProd(1.0f, 0)", "HgProd")
        else:
            one = kind == "prod"
            init = {"f32": "1.0f" if one else f32_literal(-0.0), "i32": "1" if one else "0",
                    "u32": "1u" if one else "0u", "bool": "true" if one else "false"}[reg]
            self.acc = r.var(init, reg)

    def key(self, value: str) -> str:
        r, t = self.r, self.t
        if self.wide:
            return f"vec2<u32>({value}.x, {value}.y ^ 0x80000000u)"
        if t.is_float:
            return r.call("hg_key_f32", value, "true" if self.largest else "false")
        if t.is_bool:
            return f"select(0u, 1u, {value})"
        if self.reg == "u32":
            return value
        return f"(bitcast<u32>({value}) ^ 0x80000000u)"

    def unkey(self, key: str) -> str:
        t = self.t
        if self.wide:
            return f"vec2<u32>({key}.x, {key}.y ^ 0x80000000u)"
        if t.is_float:
            return self.r.call("hg_unkey_f32", key)
        if t.is_bool:
            return f"{key} != 0u"
        if self.reg == "u32":
            return key
        return f"bitcast<i32>({key} ^ 0x80000000u)"

    def fold(self, value: str, flat: str) -> None:
        r = self.r
        if self.keyed:
            self.fold_key(r.bind("u32", self.key(value)), flat)
        elif self.wide:
            combine = "hg_add64" if self.kind == "sum" else "hg_mul64lo"
            r.line(f"{self.acc} = {combine}({self.acc}, {value});")
        elif self.float_sum:  # Neumaier: c collects what each addition loses
            s, c = self.acc, self.comp
            total = r.bind("f32", f"{s} + {value}")
            r.line(f"if (abs({s}) >= abs({value})) {{ {c} += ({s} - {total}) + {value}; }} "
                   f"else {{ {c} += ({value} - {total}) + {s}; }}")
            r.line(f"{s} = {total};")
        elif self.float_prod:
            r.line(f"{self.acc} = hg_prod_mul({self.acc}, hg_prod_of({value}));")
        elif self.kind == "sum":
            r.line(f"{self.acc} = {self.sum_expr(self.acc, value)};")
        else:
            r.line(f"{self.acc} = {self.prod_expr(self.acc, value)};")

    def fold_key(self, k: str, flat: str) -> None:
        """Fold in the term whose key is ``k`` (its flat index ``flat``: argmax/argmin)."""
        r = self.r
        better = self.better(k, self.acc)
        if self.best is not None:  # in order: strictly better only (first wins)
            r.line(f"if ({better}) {{ {self.acc} = {k}; {self.best} = {flat}; }}")
        elif self.wide:
            r.line(f"{self.acc} = select({self.acc}, {k}, {better});")
        else:
            r.line(f"{self.acc} = {'max' if self.largest else 'min'}({self.acc}, {k});")

    def better(self, a: str, b: str) -> str:
        """Whether key ``a`` is strictly better than key ``b``."""
        if self.wide:
            return f"hg_lt64({b}, {a})" if self.largest else f"hg_lt64({a}, {b})"
        return f"{a} {'>' if self.largest else '<'} {b}"

    def product(self, shared: bool) -> str:
        """A float product's (significand, exponent), over the workgroup if ``shared``."""
        r, acc = self.r, self.acc
        if not shared:
            return acc
        r.shared.update(("f32", "i32"))
        r.line(f"hg_sh_f32[lid] = {acc}.m;")
        r.line(f"hg_sh_i32[lid] = {acc}.e;")
        r.line("workgroupBarrier();")

        def level() -> None:
            r.line("let p = hg_prod_mul(HgProd(hg_sh_f32[lid], hg_sh_i32[lid]), "
                   "HgProd(hg_sh_f32[lid + s], hg_sh_i32[lid + s]));")
            r.line("hg_sh_f32[lid] = p.m;")
            r.line("hg_sh_i32[lid] = p.e;")

        tree(r, level)
        out = r.bind("HgProd", "HgProd(hg_sh_f32[0], hg_sh_i32[0])")
        r.line("workgroupBarrier();")
        return out

    def sum_expr(self, a: str, b: str) -> str:
        if self.t.is_bool:
            return f"{a} | {b}"
        return f"{a} + {b}"

    def prod_expr(self, a: str, b: str) -> str:
        if self.t.is_bool:
            return f"{a} & {b}"
        return f"{a} * {b}"

    def partial(self) -> str:
        """This invocation's result (a float sum's compensation added in)."""
        r = self.r
        if self.float_sum:
            s, c = self.acc, self.comp
            # The plain sum where nothing was lost (keeps -0.0) or it is not finite, both
            # tested on the bits, and s + c opaque: a driver that may ignore the sign of
            # zero could otherwise fold select(s + c, s, c == 0) into s + c, which
            # turns a -0.0 sum into +0.0.
            total = r.bind("f32", f"{s} + {c}")
            return r.bind("f32", f"select({total}, {s}, (bitcast<u32>({c}) & 0x7fffffffu) "
                                 f"== 0u || (bitcast<u32>({s}) & 0x7f800000u) == 0x7f800000u)")
        return self.acc

    def finish(self, shared: bool, empty: bool) -> str:
        r = self.r
        if empty and self.kind == "sum":
            return "0.0f" if self.t.is_float else self.acc
        if self.float_prod:
            return r.bind("f32", f"hg_prod_value({self.product(shared)})")
        if not shared:
            mine = self.partial()
            return self.unkey(mine) if self.kind in ("max", "min") else (
                self.best if self.best is not None else mine)
        out, best = self.combined()
        if best is not None:
            return best
        if self.keyed:
            return self.unkey(out)
        return f"({out} != 0u)" if self.reg == "bool" else out

    def combined(self) -> tuple[str, str | None]:
        """The workgroup's result through the tree in workgroup memory: the value (a key
        for max/min, a bool as a u32), and the index of argmax/argmin (else None)."""
        r = self.r
        mine = self.partial()
        vtype = self.vtype
        r.shared.add(vtype)
        values = shared_array(vtype)
        stored = f"select(0u, 1u, {mine})" if self.reg == "bool" and not self.keyed else mine
        r.line(f"{values}[lid] = {stored};")
        if self.best is not None:
            r.shared.add("i32")
            r.line(f"hg_sh_i32[lid] = {self.best};")
        r.line("workgroupBarrier();")

        def level() -> None:
            a, b = f"{values}[lid]", f"{values}[lid + s]"
            if self.best is not None:
                r.line(f"if ({self.better(b, a)} || (all({b} == {a}) && hg_sh_i32[lid + s] < "
                       f"hg_sh_i32[lid])) {{ {a} = {b}; hg_sh_i32[lid] = hg_sh_i32[lid + s]; }}")
            elif self.keyed and self.wide:
                r.line(f"{a} = select({a}, {b}, {self.better(b, a)});")
            elif self.keyed:
                r.line(f"{a} = {'max' if self.largest else 'min'}({a}, {b});")
            elif self.wide:
                combine = "hg_add64" if self.kind == "sum" else "hg_mul64lo"
                r.line(f"{a} = {combine}({a}, {b});")
            elif self.reg == "bool":
                r.line(f"{a} = {a} {'|' if self.kind == 'sum' else '&'} {b};")
            elif self.kind == "sum":
                r.line(f"{a} = {a} + {b};")
            else:
                r.line(f"{a} = {a} * {b};")

        tree(r, level)
        out = r.bind(vtype, f"{values}[0]")
        best = r.bind("i32", "hg_sh_i32[0]") if self.best is not None else None
        r.line("workgroupBarrier();")  # everyone has read before the arrays are reused
        return out, best

    @property
    def vtype(self) -> str:
        """The WGSL type of the values the tree combines (keys: u32; bool: u32)."""
        if (self.keyed and not self.wide) or self.reg == "bool":
            return "u32"
        return self.reg

    # --- split reductions: a workgroup's partial state as 32-bit words ---------------------
    def state_words(self) -> int:
        """How many u32 words a partial state takes (:meth:`state`)."""
        words = 2 if self.wide or self.float_prod else 1
        return words + (self.best is not None)

    def state(self) -> list[str]:
        """The workgroup's partial state after the tree, as u32 expressions: a float sum's
        (compensated) f32, a float product's significand and exponent, a max/min key
        (not the value: keys fold again as they are), integers as their bits (i64: low
        word, high word), then argmax/argmin's flat index."""
        if self.float_prod:
            p = self.product(True)
            return [f"bitcast<u32>({p}.m)", f"bitcast<u32>({p}.e)"]
        out, best = self.combined()
        words = [f"{out}.x", f"{out}.y"] if self.wide else [
            out if self.vtype == "u32" else f"bitcast<u32>({out})"]
        if best is not None:
            words.append(f"bitcast<u32>({best})")
        return words

    def fold_state(self, words: list[str]) -> None:
        """Fold in a partial state (:meth:`state`'s words, read back) as one term."""
        r = self.r
        value = f"vec2<u32>({words[0]}, {words[1]})" if self.wide else words[0]
        if self.keyed:
            flat = f"bitcast<i32>({words[-1]})" if self.best is not None else "0"
            self.fold_key(r.bind("u32", value), flat)
        elif self.float_prod:
            r.line(f"{self.acc} = hg_prod_mul({self.acc}, HgProd(bitcast<f32>({words[0]}), "
                   f"bitcast<i32>({words[1]})));")
        elif self.wide or self.reg == "u32":
            self.fold(r.bind(self.reg, value), "0")
        elif self.reg == "bool":
            self.fold(r.bind("bool", f"{value} != 0u"), "0")
        else:  # f32 (a sum: compensated again), i32
            self.fold(r.bind(self.reg, f"bitcast<{self.reg}>({value})"), "0")


class Reductions:
    """The reductions of :class:`.render._Kernel` (a mixin): one accumulator
    (:class:`Accumulator`) per invocation over its share of the reduced indices, then a
    workgroup tree in the group mode, or a split reduction's partials and their
    combination."""

    def reduce(self, instr: Instr, shared: bool) -> str:
        """A reduction's result: folded sequentially by this invocation, or (``shared``)
        by the whole workgroup and a tree in workgroup memory."""
        kernel = self.kernel
        position = kernel.body.index(instr)
        t = kernel.body[instr.args[0]].dtype
        kind = "sum" if instr.op == "contract" else instr.kind
        axes = list(instr.axes)
        count = math.prod(kernel.domain[a] for a in axes)
        reg = REG[t.name]
        acc = Accumulator(self, kind, t, reg)
        saved = self.local

        def term(flat: str | None) -> None:
            self.local = {}
            values = [self.value(a) for a in instr.args]
            if instr.op == "contract":
                value = self.bind(reg, self.arith("*", values, t))
            else:
                value = values[0]
            acc.fold(value, flat or self.flat_index(axes))

        if count == 0:  # the identity (a sum: +0.0); argmax/argmin: index 0
            self.local = saved
            if kind in ("argmax", "argmin"):
                return self.bind(instr.dtype.name, self.const(0, instr.dtype))
            if kind in ("sum", "prod"):
                return self.bind(t.name, self.const(int(kind == "prod"), t))
            if t.is_bool:
                return self.bind(t.name, self.const(kind == "min", t))
            return self.bind(t.name, self.const(t.max if kind == "min" else t.min, t))
        split = self.split
        buffer = split.buffer(position) if split is not None else None
        if split is not None and position == split.target:  # this workgroup's chunk
            flat = f"r{position}"
            start = self.bind("i32", f"i32(part) * {split.chunk}")
            end = f"min({start} + {split.chunk}, {count})"
            self.strided(axes, lambda: term(flat), flat=flat, span=(start, end, split.chunk))
            self.local = saved
            self.state_words = acc.state_words()
            words = acc.state()
            at = self.bind("u32", f"g * {self.state_words}u")

            def store() -> None:
                for n, word in enumerate(words):
                    self.line(f"b{buffer}[{at} + {n}u] = {word};")

            self.block("if (lid == 0u)", store)
            return ""
        if split is not None:  # the row's partials, in order, as its terms
            words = acc.state_words()
            self.scratch_reads.add(buffer)
            loop = f"p{position}"

            def partial() -> None:
                at = self.bind("u32", f"({self.row} * {split.parts}u + u32({loop})) * {words}u")
                acc.fold_state([f"b{buffer}[{at} + {n}u]" for n in range(words)])

            self.loop(f"for (var {loop}: i32 = i32(lid); {loop} < {split.parts}; "
                      f"{loop} += {WORKGROUP})", -(-split.parts // WORKGROUP), partial)
        elif shared:
            flat = f"r{position}"  # the strided loop's flat index over the axes
            self.strided(axes, lambda: term(flat), flat=flat)
        else:
            self.serial(axes, lambda: term(None))
        self.local = saved
        result = acc.finish(shared, empty=count == 0)
        return self.bind(instr.dtype.name, self.reduced(result, kind, t, instr.dtype))

    def flat_index(self, axes: list[int]) -> str:
        flat = "0"
        for a in axes:
            flat = f"({flat}) * {self.kernel.domain[a]} + {self.index.get(a, '0')}"
        return flat

    def reduced(self, value: str, kind: str, t: DType, result: DType) -> str:
        if kind in ("argmax", "argmin"):  # the index is >= 0
            if result.name == "i64":
                return f"vec2<u32>(u32({value}), 0u)"
            return self.int_cast(value, dt.int32, result)
        if t.name == "f16":
            return self.call("hg_round_f16", value)
        if t.name == "bf16":
            return self.call("hg_round_bf16", value)
        if t.is_int:
            return self.wrap(value, t)
        return value
