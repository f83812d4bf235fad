"""WGSL helper functions the renderer calls: narrow formats in 32-bit words, exact fmod,
total-order keys for max/min and argmax/argmin, saturating casts.

All of them compute on the bits with integer operations, so their results do not depend
on how a driver treats NaN, infinities or subnormal floats.
"""

from __future__ import annotations

#: name -> WGSL source. The renderer emits the ones a shader calls (and what they call).
HELPERS: dict[str, str] = {
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
    # f32 -> bf16 bits (the high half), rounded to nearest even; NaN stays quiet.
    "hg_f32_to_bf16": """\
fn hg_f32_to_bf16(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return ((b | 0x00400000u) >> 16u); }
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}""",
    "hg_round_bf16": """\
fn hg_round_bf16(x: f32) -> f32 { return bitcast<f32>(hg_f32_to_bf16(x) << 16u); }""",
    # A total order on f32 bits as u32 keys: -NaN.. < -inf < .. < -0 < +0 < .. < +inf;
    # every NaN becomes the top key (nan_top) or the bottom one.
    "hg_key_f32": """\
fn hg_key_f32(x: f32, nan_top: bool) -> u32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return select(0u, 0xffffffffu, nan_top); }
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}""",
    "hg_unkey_f32": """\
fn hg_unkey_f32(k: u32) -> f32 {
  return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
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
    # value is scaled once at the end (k: 0 at run time, a barrier to reassociation).
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
    return hg_prod_norm(HgProd(v * 0x1p+24f, -24));
  }
  return hg_prod_norm(HgProd(v, 0));
}
fn hg_pow2(n: i32) -> f32 { return bitcast<f32>(u32(n + 127) << 23u); }
fn hg_prod_value(p: HgProd, k: u32) -> f32 {
  let m = p.m;
  let x = (bitcast<u32>(m) >> 23u) & 0xffu;
  if (x == 0u || x == 0xffu) { return m; }
  let e = clamp(p.e, -300, 300);
  let a = select(max(e, -126), min(e, 127), e >= 0);
  let first = bitcast<f32>(bitcast<u32>(m * hg_pow2(a)) ^ k);
  let rest = e - a;
  if (rest > 127) { return first * hg_pow2(127) * 2.0f; }
  if (rest < -126) { return first * hg_pow2(-126) * 0x1p-30f; }
  return first * hg_pow2(rest);
}""",
}

#: What each helper calls.
NEEDS: dict[str, tuple[str, ...]] = {
    "hg_round_f16": ("hg_f16_to_f32", "hg_f32_to_f16"),
    "hg_round_bf16": ("hg_f32_to_bf16",),
}


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
