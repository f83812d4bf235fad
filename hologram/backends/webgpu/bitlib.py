"""WGSL helper functions the renderer calls: narrow formats in 32-bit words, exact fmod,
total-order keys for max/min and argmax/argmin, saturating casts.

All of them compute on the bits with integer operations, so their results do not depend
on how a driver treats NaN, infinities or subnormal floats. bf16 rounding and the
total-order keys are the shared rules of :mod:`hologram.codegen.numerics`, written out by
:func:`.mathlib.function`.
"""

from __future__ import annotations

from hologram.codegen import numerics

from .mathlib import function

#: The unsigned order keys of max/min are the shared signed keys with the sign bit
#: flipped; every NaN becomes the top key (``nan_top``) or the bottom one.
_FLIP = "0x80000000u"

#: name -> WGSL source. The renderer emits the ones a shader calls (and what they call).
HELPERS: dict[str, str] = {
    # f32 -> bf16 bits (the high half), rounded to nearest even; NaN stays quiet.
    "hg_f32_to_bf16": function("fn hg_f32_to_bf16(x: f32) -> u32", numerics.bf16_bits, ("x",),
                               "bitcast<u32>({}) >> 16u"),
    "hg_round_bf16": function("fn hg_round_bf16(x: f32) -> f32", numerics.round_bf16, ("x",)),
    # A total order on f32 bits as u32 keys: -NaN.. < -inf < .. < -0 < +0 < .. < +inf;
    # every NaN becomes the top key (nan_top) or the bottom one.
    "hg_key_f32": function(
        "fn hg_key_f32(x: f32, nan_top: bool) -> u32", numerics.order_key, ("x",),
        f"select(bitcast<u32>({{}}) ^ {_FLIP}, select(0u, 0xffffffffu, nan_top), hg_isnan(x))"),
    "hg_unkey_f32": function("fn hg_unkey_f32(k: u32) -> f32", numerics.from_order_key,
                             (f"bitcast<i32>(k ^ {_FLIP})",)),
    # f16 bits (low 16 bits of a u32) <-> f32 value, exact.
    "hg_f16_to_f32": """\
fn hg_f16_to_f32(h: u32) -> f32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) {
    let v = f32(m) * 0x1p-24f;
    return bitcast<f32>(bitcast<u32>(v) | sign);
  }
  if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}""",
    # f32 -> f16 bits, rounded to nearest even (overflow: inf; NaN stays a quiet NaN).
    "hg_f32_to_f16": """\
fn hg_f32_to_f16(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let sign = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7e00u | ((a >> 13u) & 0x3ffu); }
  if (a >= 0x477ff000u) { return sign | 0x7c00u; }
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal f16 (units of 2^-24). The significand, shifted so the
    // unit lands at bit 0, rounded to nearest even by its dropped bits.
    let e = a >> 23u;
    if (e < 102u) { return sign; }
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;
    let kept = m >> shift;
    let rest = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rest > half || (rest == half && (kept & 1u) == 1u);
    return sign | (kept + select(0u, 1u, up));
  }
  let r = a + 0xfffu + ((a >> 13u) & 1u);
  return sign | ((r - 0x38000000u) >> 13u);
}""",
    "hg_round_f16": """\
fn hg_round_f16(x: f32) -> f32 { return hg_f16_to_f32(hg_f32_to_f16(x)); }""",
    # f32 bits as an i32 that orders like the values (-0.0 and +0.0: 0; not for NaN).
    "hg_ord_f32": """\
fn hg_ord_f32(x: f32) -> i32 {
  let b = bitcast<i32>(x);
  return select(b, -(b & 0x7fffffff), b < 0);
}""",
    # C's remainder of i32s from their magnitudes' u32 remainder: NVIDIA's Vulkan driver
    # (580, H100) computes the signed remainder WGSL's % becomes as an unsigned one
    # (-7 % 2 gave 1). The divisor is never 0 or -1 (decompose guards them).
    "hg_mod_i32": """\
fn hg_mod_i32(x: i32, y: i32) -> i32 {
  let r = select(u32(x), 0u - u32(x), x < 0) % select(u32(y), 0u - u32(y), y < 0);
  return select(i32(r), i32(0u - r), x < 0);
}""",
    # C's quotient and remainder of i64s (two words), from their magnitudes' unsigned long
    # division, one bit a step. A magnitude is at most 2^63 (INT64_MIN's), so the partial
    # remainder (below the divisor) never loses a bit when shifted. The divisor is never 0
    # or -1 (decompose guards them).
    "hg_divmod64": """\
struct HgDivMod64 { q: vec2<u32>, r: vec2<u32> }
fn hg_divmod64(x: vec2<u32>, y: vec2<u32>) -> HgDivMod64 {
  let zero = vec2<u32>(0u, 0u);
  let nx = (x.y & 0x80000000u) != 0u;
  let ny = (y.y & 0x80000000u) != 0u;
  let n = select(x, hg_sub64(zero, x), nx);
  let d = select(y, hg_sub64(zero, y), ny);
  var q = zero;
  var r = zero;
  for (var i: u32 = 0u; i < 64u; i++) {
    let bit = 63u - i;
    let word = select(n.x, n.y, bit >= 32u);
    r = vec2<u32>((r.x << 1u) | ((word >> (bit & 31u)) & 1u), (r.y << 1u) | (r.x >> 31u));
    if (!hg_lt64(r, d)) {
      r = hg_sub64(r, d);
      if (bit >= 32u) { q.y = q.y | (1u << (bit - 32u)); } else { q.x = q.x | (1u << bit); }
    }
  }
  return HgDivMod64(select(q, hg_sub64(zero, q), nx != ny), select(r, hg_sub64(zero, r), nx));
}""",
    # Exact fmod (the result of C's fmodf): long division of the significands.
    "hg_fmod": """\
fn hg_fmod(x: f32, y: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let by = bitcast<u32>(y);
  let sx = bx & 0x80000000u;
  let ax = bx & 0x7fffffffu;
  let ay = by & 0x7fffffffu;
  if (ay == 0u || ax >= 0x7f800000u || ay > 0x7f800000u) { return hg_f32_bits(0x7fc00000u); }
  if (ax < ay) { return x; }
  var ex = i32(ax >> 23u);
  var ey = i32(ay >> 23u);
  var mx = ax & 0x7fffffu;
  var my = ay & 0x7fffffu;
  if (ex == 0) { let s = countLeadingZeros(mx) - 8u; mx = mx << s; ex = 1 - i32(s); }
  else { mx = mx | 0x800000u; }
  if (ey == 0) { let s = countLeadingZeros(my) - 8u; my = my << s; ey = 1 - i32(s); }
  else { my = my | 0x800000u; }
  loop {
    if (ex <= ey) { break; }
    if (mx >= my) { mx = mx - my; }
    if (mx == 0u) { return bitcast<f32>(sx); }
    mx = mx << 1u;
    ex = ex - 1;
  }
  if (mx >= my) { mx = mx - my; }
  if (mx == 0u) { return bitcast<f32>(sx); }
  let s = countLeadingZeros(mx) - 8u;
  mx = mx << s;
  ey = ey - i32(s);
  if (ey > 0) { return bitcast<f32>(sx | (u32(ey) << 23u) | (mx & 0x7fffffu)); }
  return bitcast<f32>(sx | (mx >> u32(1 - ey)));
}""",
    # A signed integer rounded to f32 *to odd* (truncated, last bit set if inexact): its
    # nearest-even rounding to f16/bf16 is then the integer's own (one rounding).
    "hg_i32_to_f32_odd": """\
fn hg_i32_to_f32_odd(x: i32) -> f32 {
  let u = select(u32(x), 0u - u32(x), x < 0);
  let lz = countLeadingZeros(u);
  var v = f32(u);
  if (lz < 8u) {
    let sh = 8u - lz;
    let kept = (u >> sh) | select(0u, 1u, (u & ((1u << sh) - 1u)) != 0u);
    v = f32(kept) * bitcast<f32>((127u + sh) << 23u);
  }
  return select(v, -v, x < 0);
}""",
    # f32 -> i32 / u32 saturating, NaN -> 0 (the ISA's float-to-integer cast).
    "hg_f32_to_i32": """\
fn hg_f32_to_i32(x: f32, lo: f32, hi: f32, lo_i: i32, hi_i: i32) -> i32 {
  if (hg_isnan(x)) { return 0; }
  if (x <= lo) { return lo_i; }
  if (x >= hi) { return hi_i; }
  return i32(x);
}""",
    "hg_f32_to_u32": """\
fn hg_f32_to_u32(x: f32, hi: f32, hi_u: u32) -> u32 {
  if (hg_isnan(x) || x <= 0.0f) { return 0u; }
  if (x >= hi) { return hi_u; }
  return u32(x);
}""",
    # Float products as a significand in [1, 2) and an exponent, so that no partial
    # product over- or underflows: each multiplication rounds once, relative u, and the
    # value is assembled once at the end, on the bits.
    "hg_prod": """\
struct HgProd { m: f32, e: i32 }
fn hg_prod_norm(p: HgProd) -> HgProd {
  let b = bitcast<u32>(p.m);
  let x = (b >> 23u) & 0xffu;
  if (x == 0u || x == 0xffu) { return p; }
  return HgProd(bitcast<f32>((b & 0x807fffffu) | 0x3f800000u), p.e + i32(x) - 127);
}
fn hg_prod_mul(a: HgProd, b: HgProd) -> HgProd {
  return hg_prod_norm(HgProd(a.m * b.m, a.e + b.e));
}
fn hg_prod_of(v: f32) -> HgProd {
  let b = bitcast<u32>(v);
  if ((b & 0x7f800000u) == 0u && (b & 0x7fffffffu) != 0u) {
    // A subnormal is its significand's integer times 2^-149, normalized exactly by the
    // conversion: no float operation sees it (a driver may flush subnormals).
    let m = bitcast<u32>(f32(b & 0x7fffffu)) | (b & 0x80000000u);
    return hg_prod_norm(HgProd(bitcast<f32>(m), -149));
  }
  return hg_prod_norm(HgProd(v, 0));
}
fn hg_prod_value(p: HgProd) -> f32 {
  // m * 2^e on the bits: exact for normal results, rounded once to nearest even for
  // subnormal ones, overflow to inf, underflow to a zero of the product's sign, whatever
  // a driver does with subnormal floats.
  let b = bitcast<u32>(p.m);
  let x = (b >> 23u) & 0xffu;
  if (x == 0u || x == 0xffu) { return p.m; }
  let sign = b & 0x80000000u;
  let e = p.e + i32(x) - 127;
  if (e > 127) { return bitcast<f32>(sign | 0x7f800000u); }
  if (e >= -126) { return bitcast<f32>(sign | (u32(e + 127) << 23u) | (b & 0x7fffffu)); }
  if (e < -150) { return bitcast<f32>(sign); }
  let m = (b & 0x7fffffu) | 0x800000u;
  let shift = u32(-126 - e);
  let kept = m >> shift;
  let rest = m & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  let up = rest > half || (rest == half && (kept & 1u) == 1u);
  return bitcast<f32>(sign | (kept + select(0u, 1u, up)));
}""",
    # 64-bit unsigned integers as vec2<u32>(low, high), for hg_fma. Shifts take any
    # amount (WGSL's own take it modulo 32).
    "hg_u64": """\
fn hg_shl64(x: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return x; }
  if (s >= 64u) { return vec2<u32>(0u, 0u); }
  if (s >= 32u) { return vec2<u32>(0u, x.x << (s - 32u)); }
  return vec2<u32>(x.x << s, (x.y << s) | (x.x >> (32u - s)));
}
fn hg_shr64(x: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return x; }
  if (s >= 64u) { return vec2<u32>(0u, 0u); }
  if (s >= 32u) { return vec2<u32>(x.y >> (s - 32u), 0u); }
  return vec2<u32>((x.x >> s) | (x.y << (32u - s)), x.y >> s);
}
fn hg_below64(x: vec2<u32>, s: u32) -> bool {
  // Whether any of the bits of x below bit s is set.
  if (s == 0u) { return false; }
  if (s >= 64u) { return x.x != 0u || x.y != 0u; }
  let back = hg_shl64(hg_shr64(x, s), s);
  return back.x != x.x || back.y != x.y;
}
fn hg_jam64(x: vec2<u32>, s: u32) -> vec2<u32> {
  // x >> s, the lowest bit set if any bit shifted out was (a sticky bit).
  let r = hg_shr64(x, s);
  return vec2<u32>(r.x | select(0u, 1u, hg_below64(x, s)), r.y);
}
fn hg_add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let lo = a.x + b.x;
  return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn hg_sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn hg_lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
  return a.y < b.y || (a.y == b.y && a.x < b.x);
}
fn hg_clz64(x: vec2<u32>) -> u32 {
  return select(countLeadingZeros(x.x) + 32u, countLeadingZeros(x.y), x.y != 0u);
}
fn hg_slt64(a: vec2<u32>, b: vec2<u32>) -> bool {
  // Signed a < b of two's-complement i64 values.
  return hg_lt64(vec2<u32>(a.x, a.y ^ 0x80000000u), vec2<u32>(b.x, b.y ^ 0x80000000u));
}
fn hg_mul64lo(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  // The low 64 bits of a * b (the same for signed and unsigned values).
  let low = hg_mul64(a.x, b.x);
  return vec2<u32>(low.x, low.y + a.x * b.y + a.y * b.x);
}
fn hg_mul64(a: u32, b: u32) -> vec2<u32> {
  // The full product of two u32, from 16-bit halves.
  let a0 = a & 0xffffu;
  let a1 = a >> 16u;
  let b0 = b & 0xffffu;
  let b1 = b >> 16u;
  let p00 = a0 * b0;
  let p01 = a0 * b1;
  let p10 = a1 * b0;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>((p00 & 0xffffu) | (mid << 16u),
                   a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}""",
    # a * b + c rounded once (to nearest even), on the integers: WGSL's fma() may round
    # twice (it does on lavapipe). Finite nonzero operands: the 48-bit product and c's
    # significand are placed with their top bits at bit 61 of a 64-bit integer, the one
    # with the smaller exponent shifted down with a sticky bit, added or subtracted, and
    # the sum rounded to 24 bits (or to the subnormal grid) by its round and sticky bits.
    "hg_fma": """\
fn hg_fma(a: f32, b: f32, c: f32) -> f32 {
  let ba = bitcast<u32>(a);
  let bb = bitcast<u32>(b);
  let bc = bitcast<u32>(c);
  let xa = (ba >> 23u) & 0xffu;
  let xb = (bb >> 23u) & 0xffu;
  let xc = (bc >> 23u) & 0xffu;
  let sp = (ba ^ bb) & 0x80000000u;
  let sc = bc & 0x80000000u;
  let za = (ba & 0x7fffffffu) == 0u;
  let zb = (bb & 0x7fffffffu) == 0u;
  if (xa == 0xffu || xb == 0xffu || xc == 0xffu || za || zb) {
    // inf, NaN or an exact zero product, decided on the bits: a driver that flushes
    // subnormals would make inf * subnormal NaN and drop a subnormal c.
    if ((ba & 0x7fffffffu) > 0x7f800000u || (bb & 0x7fffffffu) > 0x7f800000u
        || (bc & 0x7fffffffu) > 0x7f800000u) { return hg_f32_bits(0x7fc00000u); }
    if (xa == 0xffu || xb == 0xffu) {
      if (za || zb || (xc == 0xffu && sc != sp)) { return hg_f32_bits(0x7fc00000u); }
      return bitcast<f32>(sp | 0x7f800000u);
    }
    if (xc == 0xffu || (bc & 0x7fffffffu) != 0u) { return c; }
    return bitcast<f32>(sp & sc);  // 0 + 0: -0.0 only when both are
  }
  // c = 0 too goes the integer way: the product rounded once, its sign kept
  let ma = select((ba & 0x7fffffu) | 0x800000u, ba & 0x7fffffu, xa == 0u);
  let mb = select((bb & 0x7fffffu) | 0x800000u, bb & 0x7fffffu, xb == 0u);
  let mc = select((bc & 0x7fffffu) | 0x800000u, bc & 0x7fffffu, xc == 0u);
  // value = significand * 2^exponent-of-its-last-bit
  let ea = select(i32(xa) - 150, -149, xa == 0u);
  let eb = select(i32(xb) - 150, -149, xb == 0u);
  let ec = select(i32(xc) - 150, -149, xc == 0u);
  var p = hg_mul64(ma, mb);
  let shift_p = hg_clz64(p) - 2u;
  p = hg_shl64(p, shift_p);
  let ep = ea + eb - i32(shift_p);
  var q = vec2<u32>(mc, 0u);
  let shift_q = hg_clz64(q) - 2u;
  q = hg_shl64(q, shift_q);
  let eq = ec - i32(shift_q);
  let e = max(ep, eq);
  if (ep < eq) { p = hg_jam64(p, u32(eq - ep)); } else { q = hg_jam64(q, u32(ep - eq)); }
  var sign = sp;
  var r: vec2<u32>;
  if (sp == sc) {
    r = hg_add64(p, q);
  } else if (hg_lt64(p, q)) {
    r = hg_sub64(q, p);
    sign = sc;
  } else {
    r = hg_sub64(p, q);
  }
  if (r.x == 0u && r.y == 0u) { return 0.0f; }  // exact cancellation: +0
  let t = 63 - i32(hg_clz64(r));
  var top = t + e;  // the exponent of the result's leading bit
  let s = select(-149 - e, t - 23, top >= -126);  // right shift to the last kept bit
  var keep: u32;
  if (s <= 0) {
    keep = hg_shl64(r, u32(-s)).x;
  } else {
    keep = hg_shr64(r, u32(s)).x;
    let half = (hg_shr64(r, u32(s - 1)).x & 1u) == 1u;
    if (half && (hg_below64(r, u32(s - 1)) || (keep & 1u) == 1u)) { keep = keep + 1u; }
  }
  if (top < -126) { return bitcast<f32>(sign | keep); }  // subnormal (or rounded up to 2^-126)
  if (keep >= 0x1000000u) {
    keep = keep >> 1u;
    top = top + 1;
  }
  if (top > 127) { return bitcast<f32>(sign | 0x7f800000u); }
  return bitcast<f32>(sign | (u32(top + 127) << 23u) | (keep & 0x7fffffu));
}""",
    # A finite nonzero f32 magnitude (bits) as k 2^(e - 23), k in [2^23, 2^24). A
    # subnormal's bits are its value in units of 2^-149, an integer below 2^23 that
    # converts to f32 exactly: no float operation sees the subnormal (a driver may flush).
    "hg_sig": """\
struct HgSig { k: u32, e: i32 }
fn hg_sig(a: u32) -> HgSig {
  if (a >= 0x00800000u) { return HgSig((a & 0x7fffffu) | 0x800000u, i32(a >> 23u) - 127); }
  let b = bitcast<u32>(f32(a));
  return HgSig((b & 0x7fffffu) | 0x800000u, i32(b >> 23u) - 276);
}""",
    # k 2^(e - 23), k in [2^23, 2^24], plus what lies below k's last bit (half: at least
    # half of it; sticky: anything but exactly 0 or exactly half), rounded once to nearest
    # even into an f32: subnormal results on their own grid, overflow to inf.
    "hg_round_pack": """\
fn hg_round_pack(sign: u32, e: i32, k: u32, half: bool, sticky: bool) -> f32 {
  var x = e;
  var kk = k;
  if (kk >= 0x1000000u) { kk = kk >> 1u; x = x + 1; }
  let k2 = (kk << 1u) | select(0u, 1u, half);
  var shift = 1u;
  if (x < -126) { shift = 1u + u32(min(-126 - x, 26)); }
  let kept = k2 >> shift;
  let rest = k2 & ((1u << shift) - 1u);
  let halfway = 1u << (shift - 1u);
  let up = rest > halfway || (rest == halfway && (sticky || (kept & 1u) == 1u));
  var m = kept + select(0u, 1u, up);
  if (x < -126) { return bitcast<f32>(sign | m); }
  if (m >= 0x1000000u) { m = m >> 1u; x = x + 1; }
  if (x > 127) { return bitcast<f32>(sign | 0x7f800000u); }
  return bitcast<f32>(sign | (u32(x + 127) << 23u) | (m & 0x7fffffu));
}""",
    # p 2^n rounded once (MathEmitter.scale), on the integers; NaN, inf and 0 unchanged.
    "hg_scale": """\
fn hg_scale(p: f32, n: i32) -> f32 {
  let b = bitcast<u32>(p);
  if ((b & 0x7f800000u) == 0x7f800000u || (b & 0x7fffffffu) == 0u) { return p; }
  let s = hg_sig(b & 0x7fffffffu);
  return hg_round_pack(b & 0x80000000u, s.e + n, s.k, false, false);
}""",
    # x / y rounded once. WGSL allows a division 2.5 ulp off (NVIDIA's Vulkan driver
    # computes x * (1/y): inf / 3e38 is NaN there, the reciprocal a flushed subnormal). So
    # the significands' quotient v = mx / my in [1, 2) is k = floor(v 2^23) with the
    # remainder r = mx 2^23 - k my in [0, my), from the driver's estimate corrected on the
    # integers; r says whether v is past the midpoint above k. The integers wrap: r is
    # small, so its low 32 bits are r. IEEE's special cases on the bits.
    "hg_div": """\
fn hg_div(x: f32, y: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let by = bitcast<u32>(y);
  let ax = bx & 0x7fffffffu;
  let ay = by & 0x7fffffffu;
  let sign = (bx ^ by) & 0x80000000u;
  if (ax > 0x7f800000u || ay > 0x7f800000u || (ax == ay && (ax == 0u || ax == 0x7f800000u))) {
    return hg_f32_bits(0x7fc00000u);
  }
  if (ax == 0x7f800000u || ay == 0u) { return bitcast<f32>(sign | 0x7f800000u); }
  if (ax == 0u || ay == 0x7f800000u) { return bitcast<f32>(sign); }
  let sx = hg_sig(ax);
  let sy = hg_sig(ay);
  let my = sy.k;
  var mx = sx.k;
  var e = sx.e - sy.e;
  if (mx < my) { mx = mx << 1u; e = e - 1; }
  let top = mx << 23u;
  var k = u32(f32(mx) / f32(my) * 0x1p23f);
  var r = bitcast<i32>(top - k * my);
  k = u32(i32(k) + i32(floor(f32(r) / f32(my))));
  r = bitcast<i32>(top - k * my);
  if (r < 0) { k = k - 1u; r = r + i32(my); }
  if (r >= i32(my)) { k = k + 1u; r = r - i32(my); }
  let twice = u32(r) << 1u;
  return hg_round_pack(sign, e, k, twice >= my, r != 0 && twice != my);
}""",
    # sqrt(x) rounded once, the same way: m 2^-23 in [1, 4) (an even exponent), v =
    # sqrt(m 2^-23) in [1, 2), k = floor(v 2^23) with r = m 2^23 - k^2 in [0, 2k]; v is
    # past the midpoint above k where r > k (m 2^23 >= (k + 1/2)^2 = k^2 + k + 1/4).
    "hg_sqrt": """\
fn hg_sqrt(x: f32) -> f32 {
  let bx = bitcast<u32>(x);
  if ((bx & 0x7fffffffu) == 0u || bx == 0x7f800000u) { return x; }
  if (bx > 0x7f800000u) { return hg_f32_bits(0x7fc00000u); }
  let s = hg_sig(bx);
  let odd = (s.e & 1) != 0;
  let m = select(s.k, s.k << 1u, odd);
  let e = (s.e - select(0, 1, odd)) >> 1u;
  let top = m << 23u;
  var k = u32(sqrt(f32(m) * 0x1p-23f) * 0x1p23f);
  var r = bitcast<i32>(top - k * k);
  k = u32(i32(k) + i32(floor(f32(r) / f32(2u * k))));
  r = bitcast<i32>(top - k * k);
  if (r < 0) { k = k - 1u; r = bitcast<i32>(top - k * k); }
  if (r > i32(2u * k)) { k = k + 1u; r = bitcast<i32>(top - k * k); }
  return hg_round_pack(0u, e, k, r > i32(k), r != 0);
}""",
    # i64 values as vec2<u32>(low, high) words: only casts and stores (indices, labels).
    # f32 -> i64 saturating, NaN -> 0 (the ISA's float-to-integer cast).
    "hg_f32_to_i64": """\
fn hg_f32_to_i64(x: f32) -> vec2<u32> {
  let b = bitcast<u32>(x);
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return vec2<u32>(0u, 0u); }
  let negative = (b & 0x80000000u) != 0u;
  if (a >= 0x5f000000u) {  // |x| >= 2^63: the extreme of its sign
    return select(vec2<u32>(0xffffffffu, 0x7fffffffu), vec2<u32>(0u, 0x80000000u), negative);
  }
  let e = a >> 23u;
  var m: vec2<u32>;
  if (e < 127u) {
    m = vec2<u32>(0u, 0u);
  } else if (e < 150u) {
    m = vec2<u32>(((a & 0x7fffffu) | 0x800000u) >> (150u - e), 0u);
  } else {
    m = hg_shl64(vec2<u32>((a & 0x7fffffu) | 0x800000u, 0u), e - 150u);
  }
  if (!negative) { return m; }
  return hg_sub64(vec2<u32>(0u, 0u), m);
}""",
    # i64 -> f32, rounded to nearest even, or to odd (odd: the f32 whose nearest-even
    # rounding to f16/bf16 is the integer's own).
    "hg_i64_to_f32": """\
fn hg_i64_to_f32(v: vec2<u32>, odd: bool) -> f32 {
  let negative = (v.y & 0x80000000u) != 0u;
  let m = select(v, hg_sub64(vec2<u32>(0u, 0u), v), negative);
  if (m.x == 0u && m.y == 0u) { return 0.0f; }
  let t = 63u - hg_clz64(m);  // the leading bit
  var keep: u32;
  var top = t;
  if (t <= 23u) {
    keep = m.x;
  } else {
    let s = t - 23u;
    keep = hg_shr64(m, s).x;
    let half = (hg_shr64(m, s - 1u).x & 1u) == 1u;
    let rest = hg_below64(m, s - 1u);
    if (odd) {
      keep = keep | select(0u, 1u, half || rest);
    } else if (half && (rest || (keep & 1u) == 1u)) {
      keep = keep + 1u;
      if (keep == 0x1000000u) { keep = 0x800000u; top = top + 1u; }
    }
  }
  let bits = ((top + 127u) << 23u) | ((keep << (23u - min(t, 23u))) & 0x7fffffu);
  return bitcast<f32>(bits | select(0u, 0x80000000u, negative));
}""",
}

#: What each helper calls.
NEEDS: dict[str, tuple[str, ...]] = {
    "hg_div": ("hg_sig", "hg_round_pack"),
    "hg_sqrt": ("hg_sig", "hg_round_pack"),
    "hg_scale": ("hg_sig", "hg_round_pack"),
    "hg_round_f16": ("hg_f16_to_f32", "hg_f32_to_f16"),
    "hg_fma": ("hg_u64",),
    "hg_divmod64": ("hg_u64",),
    "hg_f32_to_i64": ("hg_u64",),
    "hg_i64_to_f32": ("hg_u64",),
}


#: Loop iterations a call of a helper may run at most, with its loop's last test (lavapipe
#: counts them with the kernel's: render.EMULATED_LOOP_LIMIT): hg_fmod's steps are the
#: exponents' difference, at most 277 (254 + 23 of a subnormal's shift).
LOOPS = {"hg_divmod64": 65, "hg_fmod": 278}


def source(used: set[str]) -> str:
    """The WGSL of the helpers in ``used`` and of what they call."""
    names: set[str] = set()
    stack = list(used)
    while stack:
        name = stack.pop()
        if name in HELPERS and name not in names:
            names.add(name)
            stack.extend(NEEDS.get(name, ()))
    return "\n".join(HELPERS[n] for n in HELPERS if n in names)
