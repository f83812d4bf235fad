"""Reductions in Triton: the part of the cuda renderer (:mod:`.render`) that accumulates
a reduction over a loop of ``[XBLOCK, RBLOCK]`` tiles and folds the lanes
(:meth:`Reductions.reduce`), and combines a split reduction's partials
(:meth:`Reductions.combine`).

- float sums: lanes of the register type with Kahan compensation (a split's partials
  added in float64);
- float products: in float64, rounded once;
- max/min and argmax/argmin: total-order integer keys of the bits (NaN wins, ``-0.0 <
  +0.0``, ties go to the first index), turned back into values by :meth:`Reductions.unkey`;
- integer sums and products wrap in their dtype; bool sum is ``or``, bool product ``and``.
"""

from __future__ import annotations

import math

from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr

from .values import BITS, KEY, LIMITS, TL, float_format, pow2


class Reductions:
    """The reductions of :class:`.render._Kernel` (a mixin): they use its text builders
    (``line``, ``bind``, ``open_loop``), its values (``value``, ``constant``) and its state
    (``xblock``, ``rblock``, ``mask``, ``zero``, ``local``, ``point``, ``split``,
    ``partials``, ``index_t``)."""

    def reduce(self, position: int, instr: Instr, part: tuple[str, int] | None = None):
        """A reduction computed once per grid point: a loop over the flat index of its
        axes (row-major, so argmax indices are that index), lanes folded at the end. A
        contraction is the sum of its operands' products (exact in f32 for f16/bf16
        operands), accumulated like a float sum.

        With ``part`` (the chunk's number, a scalar, and its length), only that chunk of
        the flat index is reduced, and the result is the partial state that
        :meth:`combine` folds, ``{field: (tile, register type)}``: a float sum's value
        (unrounded; -0.0 exactly when every term is), a float product in float64, an
        integer sum or product in its dtype, an extreme's total-order key, an
        argmax/argmin's key and index."""
        kernel = self.kernel
        t = kernel.body[instr.args[0]].dtype
        kind = "sum" if instr.op == "contract" else instr.kind
        axes = list(instr.axes)
        total = math.prod(kernel.domain[d] for d in axes)
        if total == 0:  # the identity (a sum: +0.0); argmax over nothing is refused
            identity = {"sum": 0, "prod": 1, "max": t.min, "min": t.max}[kind]
            return self.constant(identity, t)
        span = part[1] if part else total
        rblock = min(pow2(span), self.rblock) if span > 1 else 1
        start = f"{part[0]} * {part[1]} + " if part else ""
        shape = f"[{self.xblock}, {rblock}]"
        self.names += 1
        n = self.names
        acc, comp, best = f"acc{n}", f"comp{n}", f"arg{n}"
        signed = f"nz{n}"  # float sums: 1 where a lane met a term other than -0.0
        key_t = KEY.get(t.name, "tl.int32")
        lo, hi = LIMITS[key_t]
        reg = TL[t.name] if t.is_float else None
        bits, sign = BITS.get(reg, (None, None))
        if kind == "sum" and t.is_float:
            self.line(f"{acc} = tl.full({shape}, {sign}, {bits}).to({reg}, bitcast=True)")
            self.line(f"{comp} = tl.zeros({shape}, {reg})")
            self.line(f"{signed} = tl.zeros({shape}, tl.int32)")
        elif kind == "sum":
            self.line(f"{acc} = tl.zeros({shape}, {TL[t.name]})")
        elif kind == "prod":  # floats in float64: no intermediate overflow of f32 products
            wide = "tl.float64" if t.is_float else TL[t.name]
            self.line(f"{acc} = tl.full({shape}, 1, {wide})")
        elif kind in ("max", "argmax", "min", "argmin"):
            ident = lo if kind in ("max", "argmax") else hi
            self.line(f"{acc} = tl.full({shape}, {ident}, {key_t})")
            if kind.startswith("arg"):
                self.line(f"{best} = tl.full({shape}, {total}, {self.index_t})")
        else:
            raise CompileError(f"cuda: kernel {kernel.name}: no {kind} reduction on {t.name} "
                               "(Backend.supports should have refused it)")
        saved = self.local, self.mask, self.zero
        flat = self.open_loop(axes, total, span, rblock, start)
        self.local = {}
        v = self.value(instr.args[0])
        if instr.op == "contract":
            v = self.bind(f"{v} * {self.value(instr.args[1])}")
        m = self.mask
        if kind == "sum" and t.is_float:  # Kahan: comp holds what each addition lost
            y = self.bind(f"tl.where({m}, {v}, hg_neg_zero()) - {comp}")
            s = self.bind(f"{acc} + {y}")
            self.line(f"{comp} = tl.where(tl.abs({s}) < HG_INF, ({s} - {acc}) - {y}, 0.0)")
            self.line(f"{acc} = {s}")
            self.line(f"{signed} = tl.maximum({signed}, ({m} & ({v}.to({bits}, bitcast=True) "
                      f"!= {sign})).to(tl.int32))")
        elif kind == "sum":
            self.line(f"{acc} = {acc} + tl.where({m}, {v}, 0)")
        elif kind == "prod":
            self.line(f"{acc} = {acc} * tl.where({m}, {v}, 1).to({acc}.dtype)")
        else:
            largest = kind in ("max", "argmax")
            if t.is_float:
                nan = hi if largest else lo  # NaN wins
                key = self.bind(f"tl.where({v} != {v}, {nan}, hg_key_{float_format(t)}({v}))")
            elif t.name in ("i32", "i64"):
                key = v
            else:  # bool and narrow integers compare as i32
                key = self.bind(f"{v}.to(tl.int32)")
            ident = lo if largest else hi
            key = self.bind(f"tl.where({m}, {key}, {ident})")
            if kind.startswith("arg"):
                cmp = ">" if largest else "<"
                # Strictly better only: a lane meets its indices in increasing order.
                better = self.bind(f"{m} & (({key} {cmp} {acc}) | ({best} == {total}))")
                self.line(f"{best} = tl.where({better}, {flat}, {best})")
                self.line(f"{acc} = tl.where({better}, {key}, {acc})")
            else:
                self.line(f"{acc} = tl.{'maximum' if largest else 'minimum'}({acc}, {key})")
        self.depth -= 1
        for d in axes:
            self.index.pop(d, None)
        self.local, self.mask, self.zero = saved
        if kind == "sum" and t.is_float:
            s = self.bind(f"tl.sum({acc}, 1)[:, None]")
            c = self.bind(f"tl.sum({comp}, 1)[:, None]")
            # The plain sum where nothing was lost (keeps -0.0) or it is not finite.
            total_ = self.bind(f"tl.where(({c} == 0.0) | ~(tl.abs({s}) < HG_INF), "
                               f"{s}, {s} - {c})")
            # -0.0 exactly when every term is -0.0 (the lane folds may drop the sign).
            neg_zero = self.bind(f"tl.max({signed}, 1)[:, None] == 0")
            result = self.bind(f"tl.where({neg_zero}, hg_neg_zero(), {total_} + 0.0)")
            return {"value": (result, reg)} if part else self.rounded(result, t)
        if kind == "sum":
            value = self.bind(f"tl.sum({acc}, 1)[:, None].to({TL[t.name]})")
            return {"value": (value, TL[t.name])} if part else value
        if kind == "prod":
            p = self.bind(f"tl.reduce({acc}, 1, hg_mul)[:, None]")
            if part:
                return {"value": (p, "tl.float64" if t.is_float else TL[t.name])}
            return self.rounded(self.bind(f"{p}.to({TL[t.name]})"), t)
        fold = "tl.max" if kind in ("max", "argmax") else "tl.min"
        top = self.bind(f"{fold}({acc}, 1)[:, None]")
        if kind.startswith("arg"):
            index = self.bind(f"tl.min(tl.where({acc} == {top}, {best}, {total}), 1)"
                              "[:, None]")
            if part:
                return {"key": (top, key_t), "index": (index, self.index_t)}
            return self.bind(f"{index}.to({TL[instr.dtype.name]})")
        return {"key": (top, key_t)} if part else self.unkey(top, t)

    def unkey(self, top: str, t: DType) -> str:
        """The value of dtype ``t`` whose max/min key is ``top``."""
        if t.is_float:
            return self.bind(f"hg_unkey_{float_format(t)}({top})")
        if t.is_bool:
            return self.bind(f"{top} != 0")
        return self.bind(f"{top}.to({TL[t.name]})")  # narrow integers compare as i32

    def combine(self, position: int, instr: Instr) -> None:
        """The reduction's result of this program instance's row from the row's ``parts``
        partials (one ``[1, parts]`` tile, read past the L1 cache: other SMs wrote them).

        Float sums add the partials in float64 (f64: a tree of at most ``MAX_PARTS``
        float64 partials, 10 levels), so the split costs at most about 10 more roundings
        of the accumulation precision, well inside the ISA's bound; the result is rounded
        to the dtype once (f16/bf16 through float32 rounded to odd), and is -0.0 exactly
        when every partial (so every term) is. argmax/argmin take the best key and, among
        the partials holding it, the smallest index: partials hold global indices, and
        each partial's index is its chunk's first best, so this is the row's first."""
        kernel = self.kernel
        parts = self.split[0]
        t = kernel.body[instr.args[0]].dtype
        kind = "sum" if instr.op == "contract" else instr.kind
        total = math.prod(kernel.domain[d] for d in instr.axes)
        self.rblock = pow2(parts)
        self.line(f"p = tl.arange(0, {self.rblock})[None, :]")
        m = self.bind(f"xmask & (p < {parts})")

        def load(field: str) -> str:
            index, _ = self.partials[field]
            return self.bind(f"tl.load(b{index} + x * {parts} + p, mask={m}, other=0, "
                             "cache_modifier=\".cg\")")

        if kind in ("sum", "prod") and not t.is_float:
            fold = "tl.sum" if kind == "sum" else "tl.reduce"
            ident, extra = (0, "") if kind == "sum" else (1, ", hg_mul")
            v = self.bind(f"tl.where({m}, {load('value')}, {ident})")
            result = self.bind(f"{fold}({v}, 1{extra})[:, None].to({TL[t.name]})")
        elif kind == "sum":
            v = load("value")
            bits, sign = BITS[TL[t.name]]
            wide = self.bind(f"tl.where({m}, {v}, hg_neg_zero()).to(tl.float64)")
            s = self.bind(f"tl.sum({wide}, 1)[:, None]")
            # the fold may drop -0.0's sign: -0.0 exactly when every partial is -0.0
            nz = self.bind(f"tl.max(({m} & ({v}.to({bits}, bitcast=True) != {sign}))"
                           ".to(tl.int32), 1)[:, None]")
            s = self.bind(f"tl.where({nz} == 0, hg_neg_zero(), {s} + 0.0)")
            result = self.narrowed(s, t)
        elif kind == "prod":
            v = self.bind(f"tl.where({m}, {load('value')}, 1.0)")
            result = self.narrowed(self.bind(f"tl.reduce({v}, 1, hg_mul)[:, None]"), t)
        else:
            largest = kind in ("max", "argmax")
            lo, hi = LIMITS[KEY.get(t.name, "tl.int32")]
            key = self.bind(f"tl.where({m}, {load('key')}, {lo if largest else hi})")
            top = self.bind(f"{'tl.max' if largest else 'tl.min'}({key}, 1)[:, None]")
            if kind.startswith("arg"):
                index = self.bind(f"tl.where({m} & ({key} == {top}), {load('index')}, "
                                  f"{total})")
                result = self.bind(f"tl.min({index}, 1)[:, None].to("
                                   f"{TL[instr.dtype.name]})")
            else:
                result = self.unkey(top, t)
        self.point[position] = result

    def narrowed(self, value: str, t: DType) -> str:
        """A float64 value rounded once to float dtype ``t``."""
        if t is dt.float64:
            return value
        if t is dt.float32:
            return self.bind(f"{value}.to(tl.float32)")
        return self.rounded(self.bind(f"hg_f64_to_f32_odd({value})"), t)

    def rounded(self, value: str, t: DType) -> str:
        if t.name == "f16":
            return self.bind(f"{value}.to(tl.float16).to(tl.float32)")
        if t.name == "bf16":
            return self.bind(f"hg_round_bf16({value})")
        return value
