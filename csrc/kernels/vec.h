// Vector helpers shared by the attention kernels (decode and extend).
//
// Kernel side only: no torch headers. Everything lives in the variant's
// namespace, so each VLEN build gets its own copy and nothing here has
// external linkage across variants.
//
// One vocabulary for both builds:
//   VF   a vector of up to kLanes float32 values (the accumulator type);
//   VIdx a vector of up to kLanes byte offsets (for indexed loads).
// The RVV build maps them to LMUL=4 registers; the portable build to plain
// arrays with the same lane count as the vlen128 build, so it runs the same
// blocking and the same arithmetic (same exp polynomial, same RNE narrowing)
// without intrinsics. Every operation takes ``vl`` (active lanes, <= kLanes);
// operations that accumulate keep lanes >= vl unchanged (tail-undisturbed).
//
// Dtypes go through Traits<DType>: load a row segment widened to float32,
// gather rows through byte offsets, store with round-to-nearest-even
// narrowing. Only the base V extension is used: bf16/f16 conversions are
// integer bit manipulation (no Zvfh/Zvfbfmin).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/kernel_api.h"
#include "kernels/variant.h"

namespace RVV_ATTN_NS {
namespace vec {

// ---------------------------------------------------------------------------
// Block sizes: the one place they follow from VLEN.
//
// LMUL=4 float32 registers: 4*VLEN/32 lanes (16 at VLEN 128 ... 128 at 1024).
// LMUL=4 leaves 8 register groups, enough for the byte-offset vector of an
// indexed load (e64 at LMUL 8) plus an accumulator and an operand. A KV block
// (one online-softmax step) is one vector of tokens, so its scores, max, exp
// and sum are each a single vector instruction sequence.
#if RVV_ATTN_HAS_RVV
constexpr int kLmul = 4;
constexpr size_t kLanes = static_cast<size_t>(RVV_ATTN_VLEN) / 32 * kLmul;
#else
// The portable build mirrors the vlen128 build's blocking.
constexpr size_t kLanes = 16;
#endif
// Tokens per KV block: the N of the Q.K^T and the K of the P.V GEMMs.
constexpr size_t kBlockN = kLanes;

// ---------------------------------------------------------------------------
// Scalar bit conversions (used by the portable build, and for single values
// such as a head's scalar query element).
inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if (x != x) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaNs NaN (quiet)
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// f16 magnitude shifted into the f32 field positions is the right value
// scaled by 2^-112 for normals *and* subnormals (an f16 subnormal becomes an
// f32 subnormal), so one exact multiply rebiases both; exponent 31 (inf/NaN)
// is patched to 255.
inline float f16_to_f32(uint16_t h) {
  const uint32_t mag = static_cast<uint32_t>(h & 0x7fffu) << 13;
  uint32_t bits = f32_bits(bits_f32(mag) * 0x1p112f);
  if (mag >= 0x0f800000u) bits = mag | 0x7f800000u;
  return bits_f32(bits | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// Round-to-nearest-even f32 -> f16 with integer operations only.
inline uint16_t f32_to_f16(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t r;
  if (a > 0x7f800000u) {
    r = 0x7e00u | ((a >> 13) & 0x3ffu);  // NaN stays NaN (quiet)
  } else if (a >= 0x477ff000u) {
    r = 0x7c00u;  // >= 65520 rounds to inf (65504 is odd, the tie goes up)
  } else if (a >= 0x38800000u) {
    const uint32_t an = a - 0x38000000u;  // rebias 127 -> 15
    r = (an + 0xfffu + ((an >> 13) & 1u)) >> 13;  // a mantissa carry bumps the exponent, as it should
  } else {
    // f16 subnormal (or zero): the 24-bit significand shifted right by
    // 126 - e, rounded to nearest even. Shifts past 31 all give 0 (the
    // value is below half the smallest subnormal), so clamp to 31.
    const uint32_t e = a >> 23;
    const uint32_t mm = (a & 0x7fffffu) | 0x800000u;
    const uint32_t sh = (126u - e) < 31u ? (126u - e) : 31u;
    const uint32_t q = mm >> sh, rem = mm - (q << sh), half = 1u << (sh - 1);
    r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  }
  return static_cast<uint16_t>(r | sign);
}

// ---------------------------------------------------------------------------
// exp: range reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-7 Taylor
// polynomial for e^r (truncation r^8/8! < 5.3e-9 relative) and 2^n built in
// the exponent field. Measured against double exp over [-87.3, 88.3]:
// portable build, every 7th float bit pattern: max relative error 7.9e-8
// (1.3 * 2^-24); RVV build (vlen128 under QEMU, 36.7M samples): 7.7e-8.
// The polynomial error is below float32 rounding. Below -87.3 the result is 0
// (the true value is < FLT_MIN: absolute error < 1.2e-38), above 88.3 it is
// +inf (true overflow is at 88.72), NaN stays NaN. Softmax only evaluates
// x <= 0.
constexpr float kExpLo = -87.3f;
constexpr float kExpHi = 88.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // few mantissa bits: n*kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723e-6f;
constexpr float kExpC[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

// tanh for the soft cap, accurate to a few float32 ulps of the result for
// every |y|: (1 - e^{-2|y|}) / (1 + e^{-2|y|}) cancels as |y| -> 0 (its
// error is ~2^-24 absolute, so cap * tanh(s / cap) was off by ~cap * 2^-24),
// so below |y| = 0.5 an odd polynomial y + y^3 P(y^2) is used instead.
// P is a least-squares fit of (tanh(y)/y - 1)/y^2 on [0, 0.25] in y^2,
// weighted for relative error (made with numpy in float64); evaluated in
// float32 its max relative error is 1.03 * 2^-24 on |y| < 0.5. Above 0.5
// the exp form loses at most one bit to cancellation (e^-1 / (1 - e^-1)).
constexpr float kTanhPolyLimit = 0.5f;
constexpr float kTanhC[5] = {-0.3333332659006102f, 0.13332954240019546f, -0.05389806913202003f,
                             0.02129291959791805f, -0.00663946699695033f};

inline float exp_scalar(float x) {
  if (x != x) return x;
  if (x < kExpLo) return 0.0f;
  if (x > kExpHi) return std::numeric_limits<float>::infinity();
  const float nf = std::nearbyint(x * kLog2e);
  float r = std::fma(-nf, kLn2Hi, x);
  r = std::fma(-nf, kLn2Lo, r);
  float p = kExpC[7];
  for (int k = 6; k >= 0; --k) p = std::fma(p, r, kExpC[k]);
  return p * bits_f32(static_cast<uint32_t>(static_cast<int32_t>(nf) + 127) << 23);
}

inline float tanh_scalar(float y) {
  const float a = std::fabs(y);
  if (a < kTanhPolyLimit) {
    const float y2 = y * y;
    float p = kTanhC[4];
    for (int k = 3; k >= 0; --k) p = std::fma(p, y2, kTanhC[k]);
    return std::fma(y * y2, p, y);
  }
  const float t = exp_scalar(-2.0f * a);
  return std::copysign((1.0f - t) / (1.0f + t), y);
}

#if RVV_ATTN_HAS_RVV
// ===========================================================================
// RVV build
using VF = vfloat32m4_t;
using VIdx = vuint64m8_t;
using VMask = vbool8_t;

inline size_t setvl(size_t n) { return __riscv_vsetvl_e32m4(n); }
inline VF zeros() { return __riscv_vfmv_v_f_f32m4(0.0f, __riscv_vsetvlmax_e32m4()); }
inline VF splat(float a, size_t vl) { return __riscv_vfmv_v_f_f32m4(a, vl); }
inline VF load(const float* p, size_t vl) { return __riscv_vle32_v_f32m4(p, vl); }
inline void store(float* p, VF v, size_t vl) { __riscv_vse32_v_f32m4(p, v, vl); }
// acc[i] += a * x[i] for i < vl; lanes >= vl keep their value.
inline VF fmacc(VF acc, float a, VF x, size_t vl) { return __riscv_vfmacc_vf_f32m4_tu(acc, a, x, vl); }
inline VF mul(VF x, float a, size_t vl) { return __riscv_vfmul_vf_f32m4(x, a, vl); }
inline VF sub(VF x, float a, size_t vl) { return __riscv_vfsub_vf_f32m4(x, a, vl); }
inline VF sub(VF x, VF y, size_t vl) { return __riscv_vfsub_vv_f32m4(x, y, vl); }

inline float reduce_max(VF x, size_t vl) {
  const vfloat32m1_t init = __riscv_vfmv_s_f_f32m1(-std::numeric_limits<float>::infinity(), 1);
  return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredmax_vs_f32m4_f32m1(x, init, vl));
}
inline float reduce_sum(VF x, size_t vl) {
  const vfloat32m1_t init = __riscv_vfmv_s_f_f32m1(0.0f, 1);
  return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m4_f32m1(x, init, vl));
}

inline VF exp(VF x, size_t vl) {
  // vfmin/vfmax return the non-NaN operand, so a NaN becomes kExpLo here
  // and is restored at the end.
  const VF xc = __riscv_vfmin_vf_f32m4(__riscv_vfmax_vf_f32m4(x, kExpLo, vl), kExpHi, vl);
  // The dynamic rounding mode is round-to-nearest-even (the ABI default).
  const vint32m4_t n = __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(xc, kLog2e, vl), vl);
  const VF nf = __riscv_vfcvt_f_x_v_f32m4(n, vl);
  VF r = __riscv_vfnmsac_vf_f32m4(xc, kLn2Hi, nf, vl);
  r = __riscv_vfnmsac_vf_f32m4(r, kLn2Lo, nf, vl);
  VF p = splat(kExpC[7], vl);
  for (int k = 6; k >= 0; --k) p = __riscv_vfmadd_vv_f32m4(p, r, splat(kExpC[k], vl), vl);
  const vuint32m4_t scale =
      __riscv_vsll_vx_u32m4(__riscv_vreinterpret_v_i32m4_u32m4(__riscv_vadd_vx_i32m4(n, 127, vl)), 23, vl);
  VF y = __riscv_vfmul_vv_f32m4(p, __riscv_vreinterpret_v_u32m4_f32m4(scale), vl);
  y = __riscv_vfmerge_vfm_f32m4(y, 0.0f, __riscv_vmflt_vf_f32m4_b8(x, kExpLo, vl), vl);
  y = __riscv_vfmerge_vfm_f32m4(y, std::numeric_limits<float>::infinity(), __riscv_vmfgt_vf_f32m4_b8(x, kExpHi, vl),
                                vl);
  return __riscv_vmerge_vvm_f32m4(y, x, __riscv_vmfne_vv_f32m4_b8(x, x, vl), vl);
}

// cap * tanh(x / cap), as tanh_scalar: the odd polynomial for |y| < 0.5,
// (1 - e^{-2|y|}) / (1 + e^{-2|y|}) above (the exponent is <= 0, so no
// overflow). Both are computed for every lane and merged by |y|.
inline VF softcap(VF x, float cap, size_t vl) {
  const VF y = __riscv_vfmul_vf_f32m4(x, 1.0f / cap, vl);
  const VF a = __riscv_vfabs_v_f32m4(y, vl);
  const VF t = exp(__riscv_vfmul_vf_f32m4(a, -2.0f, vl), vl);
  const VF num = __riscv_vfrsub_vf_f32m4(t, 1.0f, vl);
  const VF den = __riscv_vfadd_vf_f32m4(t, 1.0f, vl);
  const VF by_exp = __riscv_vfsgnj_vv_f32m4(__riscv_vfdiv_vv_f32m4(num, den, vl), y, vl);
  const VF y2 = __riscv_vfmul_vv_f32m4(y, y, vl);
  VF p = splat(kTanhC[4], vl);
  for (int k = 3; k >= 0; --k) p = __riscv_vfmadd_vv_f32m4(p, y2, splat(kTanhC[k], vl), vl);
  const VF by_poly = __riscv_vfmacc_vv_f32m4(y, __riscv_vfmul_vv_f32m4(y, y2, vl), p, vl);
  const VF th = __riscv_vmerge_vvm_f32m4(by_exp, by_poly, __riscv_vmflt_vf_f32m4_b8(a, kTanhPolyLimit, vl), vl);
  return __riscv_vfmul_vf_f32m4(th, cap, vl);
}

// Byte offsets of rows: map[0..vl) (int32 or int64 slot numbers, already
// validated) * row_bytes + base_bytes.
inline VIdx row_offsets(const void* map, bool map_is_int64, int64_t row_bytes, int64_t base_bytes, size_t vl) {
  vint64m8_t slots;
  if (map_is_int64) {
    slots = __riscv_vle64_v_i64m8(static_cast<const int64_t*>(map), vl);
  } else {
    slots = __riscv_vsext_vf2_i64m8(__riscv_vle32_v_i32m4(static_cast<const int32_t*>(map), vl), vl);
  }
  slots = __riscv_vmadd_vx_i64m8(slots, row_bytes, __riscv_vmv_v_x_i64m8(base_bytes, vl), vl);
  return __riscv_vreinterpret_v_i64m8_u64m8(slots);
}
inline void store_offsets(int64_t* dst, VIdx off, size_t vl) {
  __riscv_vse64_v_i64m8(dst, __riscv_vreinterpret_v_u64m8_i64m8(off), vl);
}

namespace detail {
inline VF widen_bf16(vuint16m2_t h, size_t vl) {
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(__riscv_vzext_vf2_u32m4(h, vl), 16, vl));
}
inline VF widen_f16(vuint16m2_t h, size_t vl) {
  const vuint32m4_t w = __riscv_vzext_vf2_u32m4(h, vl);
  const vuint32m4_t sign = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x8000u, vl), 16, vl);
  const vuint32m4_t mag = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x7fffu, vl), 13, vl);
  vuint32m4_t bits = __riscv_vreinterpret_v_f32m4_u32m4(
      __riscv_vfmul_vf_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(mag), 0x1p112f, vl));
  bits = __riscv_vmerge_vvm_u32m4(bits, __riscv_vor_vx_u32m4(mag, 0x7f800000u, vl),
                                  __riscv_vmsgeu_vx_u32m4_b8(mag, 0x0f800000u, vl), vl);
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vor_vv_u32m4(bits, sign, vl));
}
inline vuint16m2_t narrow_bf16(VF x, size_t vl) {
  const vuint32m4_t u = __riscv_vreinterpret_v_f32m4_u32m4(x);
  const vuint32m4_t lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(u, 16, vl), 1u, vl);
  vuint32m4_t r = __riscv_vsrl_vx_u32m4(__riscv_vadd_vv_u32m4(__riscv_vadd_vx_u32m4(u, 0x7fffu, vl), lsb, vl), 16, vl);
  const vuint32m4_t qnan = __riscv_vor_vx_u32m4(__riscv_vsrl_vx_u32m4(u, 16, vl), 0x40u, vl);
  r = __riscv_vmerge_vvm_u32m4(r, qnan, __riscv_vmfne_vv_f32m4_b8(x, x, vl), vl);
  return __riscv_vnsrl_wx_u16m2(r, 0, vl);
}
// Vector form of f32_to_f16 above: every case computed, then selected.
inline vuint16m2_t narrow_f16(VF x, size_t vl) {
  const vuint32m4_t u = __riscv_vreinterpret_v_f32m4_u32m4(x);
  const vuint32m4_t sign = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(u, 16, vl), 0x8000u, vl);
  const vuint32m4_t a = __riscv_vand_vx_u32m4(u, 0x7fffffffu, vl);
  // normal range
  const vuint32m4_t an = __riscv_vsub_vx_u32m4(a, 0x38000000u, vl);
  const vuint32m4_t an_lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(an, 13, vl), 1u, vl);
  const vuint32m4_t rn =
      __riscv_vsrl_vx_u32m4(__riscv_vadd_vv_u32m4(__riscv_vadd_vx_u32m4(an, 0xfffu, vl), an_lsb, vl), 13, vl);
  // subnormal range
  const vuint32m4_t e = __riscv_vsrl_vx_u32m4(a, 23, vl);
  const vuint32m4_t mm = __riscv_vor_vx_u32m4(__riscv_vand_vx_u32m4(a, 0x7fffffu, vl), 0x800000u, vl);
  const vuint32m4_t sh = __riscv_vminu_vx_u32m4(__riscv_vrsub_vx_u32m4(e, 126u, vl), 31u, vl);
  vuint32m4_t q = __riscv_vsrl_vv_u32m4(mm, sh, vl);
  const vuint32m4_t rem = __riscv_vsub_vv_u32m4(mm, __riscv_vsll_vv_u32m4(q, sh, vl), vl);
  const vuint32m4_t half =
      __riscv_vsll_vv_u32m4(__riscv_vmv_v_x_u32m4(1u, vl), __riscv_vsub_vx_u32m4(sh, 1u, vl), vl);
  const VMask up = __riscv_vmor_mm_b8(
      __riscv_vmsgtu_vv_u32m4_b8(rem, half, vl),
      __riscv_vmand_mm_b8(__riscv_vmseq_vv_u32m4_b8(rem, half, vl),
                          __riscv_vmsne_vx_u32m4_b8(__riscv_vand_vx_u32m4(q, 1u, vl), 0u, vl), vl),
      vl);
  q = __riscv_vadd_vx_u32m4_mu(up, q, q, 1u, vl);
  // select: subnormal, normal, overflow, NaN
  vuint32m4_t r = __riscv_vmerge_vvm_u32m4(q, rn, __riscv_vmsgeu_vx_u32m4_b8(a, 0x38800000u, vl), vl);
  r = __riscv_vmerge_vxm_u32m4(r, 0x7c00u, __riscv_vmsgeu_vx_u32m4_b8(a, 0x477ff000u, vl), vl);
  const vuint32m4_t nan = __riscv_vor_vx_u32m4(__riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(a, 13, vl), 0x3ffu, vl),
                                               0x7e00u, vl);
  r = __riscv_vmerge_vvm_u32m4(r, nan, __riscv_vmsgtu_vx_u32m4_b8(a, 0x7f800000u, vl), vl);
  return __riscv_vnsrl_wx_u16m2(__riscv_vor_vv_u32m4(r, sign, vl), 0, vl);
}
}  // namespace detail

template <DType T>
struct Traits;

template <>
struct Traits<DType::Float32> {
  using Elem = float;
  static VF load(const Elem* p, size_t vl) { return __riscv_vle32_v_f32m4(p, vl); }
  static VF gather(const Elem* base, VIdx off, size_t vl) { return __riscv_vluxei64_v_f32m4(base, off, vl); }
  static void store(Elem* p, VF v, size_t vl) { __riscv_vse32_v_f32m4(p, v, vl); }
  static float to_f32(Elem x) { return x; }
};

template <>
struct Traits<DType::BFloat16> {
  using Elem = uint16_t;
  static VF load(const Elem* p, size_t vl) { return detail::widen_bf16(__riscv_vle16_v_u16m2(p, vl), vl); }
  static VF gather(const Elem* base, VIdx off, size_t vl) {
    return detail::widen_bf16(__riscv_vluxei64_v_u16m2(base, off, vl), vl);
  }
  static void store(Elem* p, VF v, size_t vl) { __riscv_vse16_v_u16m2(p, detail::narrow_bf16(v, vl), vl); }
  static float to_f32(Elem x) { return bf16_to_f32(x); }
};

template <>
struct Traits<DType::Float16> {
  using Elem = uint16_t;
  static VF load(const Elem* p, size_t vl) { return detail::widen_f16(__riscv_vle16_v_u16m2(p, vl), vl); }
  static VF gather(const Elem* base, VIdx off, size_t vl) {
    return detail::widen_f16(__riscv_vluxei64_v_u16m2(base, off, vl), vl);
  }
  static void store(Elem* p, VF v, size_t vl) { __riscv_vse16_v_u16m2(p, detail::narrow_f16(v, vl), vl); }
  static float to_f32(Elem x) { return f16_to_f32(x); }
};

#else
// ===========================================================================
// Portable build: the same operations on arrays, lane by lane.
struct VF {
  float v[kLanes];
};
struct VIdx {
  int64_t v[kLanes];
};

inline size_t setvl(size_t n) { return n < kLanes ? n : kLanes; }
inline VF zeros() { return VF{}; }
inline VF splat(float a, size_t vl) {
  VF r{};
  for (size_t i = 0; i < vl; ++i) r.v[i] = a;
  return r;
}
inline VF load(const float* p, size_t vl) {
  VF r{};
  for (size_t i = 0; i < vl; ++i) r.v[i] = p[i];
  return r;
}
inline void store(float* p, const VF& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) p[i] = x.v[i];
}
inline VF fmacc(VF acc, float a, const VF& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) acc.v[i] += a * x.v[i];
  return acc;
}
inline VF mul(VF x, float a, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] *= a;
  return x;
}
inline VF sub(VF x, float a, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] -= a;
  return x;
}
inline VF sub(VF x, const VF& y, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] -= y.v[i];
  return x;
}
// NaNs are skipped, as vfredmax does.
inline float reduce_max(const VF& x, size_t vl) {
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < vl; ++i) m = x.v[i] > m ? x.v[i] : m;
  return m;
}
inline float reduce_sum(const VF& x, size_t vl) {
  float s = 0.0f;
  for (size_t i = 0; i < vl; ++i) s += x.v[i];
  return s;
}
inline VF exp(VF x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] = exp_scalar(x.v[i]);
  return x;
}
inline VF softcap(VF x, float cap, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] = tanh_scalar(x.v[i] * (1.0f / cap)) * cap;
  return x;
}
inline VIdx row_offsets(const void* map, bool map_is_int64, int64_t row_bytes, int64_t base_bytes, size_t vl) {
  VIdx r{};
  for (size_t i = 0; i < vl; ++i) {
    const int64_t slot =
        map_is_int64 ? static_cast<const int64_t*>(map)[i] : static_cast<const int32_t*>(map)[i];
    r.v[i] = slot * row_bytes + base_bytes;
  }
  return r;
}
inline void store_offsets(int64_t* dst, const VIdx& off, size_t vl) {
  for (size_t i = 0; i < vl; ++i) dst[i] = off.v[i];
}

template <typename E, float (*Widen)(E), E (*Narrow)(float)>
struct PortableTraits {
  using Elem = E;
  static VF load(const Elem* p, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = Widen(p[i]);
    return r;
  }
  static VF gather(const Elem* base, const VIdx& off, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) {
      r.v[i] = Widen(*reinterpret_cast<const Elem*>(reinterpret_cast<const char*>(base) + off.v[i]));
    }
    return r;
  }
  static void store(Elem* p, const VF& x, size_t vl) {
    for (size_t i = 0; i < vl; ++i) p[i] = Narrow(x.v[i]);
  }
  static float to_f32(Elem x) { return Widen(x); }
};

inline float f32_identity(float x) { return x; }

template <DType T>
struct Traits;
template <>
struct Traits<DType::Float32> : PortableTraits<float, f32_identity, f32_identity> {};
template <>
struct Traits<DType::BFloat16> : PortableTraits<uint16_t, bf16_to_f32, f32_to_bf16> {};
template <>
struct Traits<DType::Float16> : PortableTraits<uint16_t, f16_to_f32, f32_to_f16> {};
#endif

// ===========================================================================
// Added for the extend kernel (csrc/kernels/extend.cpp).
//
// fmacc_ta: acc += a * x over vl lanes, tail-agnostic. For accumulators
// whose vl never changes (a P.V row chunk), where fmacc's tail-undisturbed
// policy buys nothing and costs a vsetvli switch next to every load.
// strided_offsets: byte offsets base_bytes + i * step_bytes for i < vl, the
// rows of a contiguous run of tokens (the new tokens' K rows), for
// Traits::gather.
#if RVV_ATTN_HAS_RVV
inline VF fmacc_ta(VF acc, float a, VF x, size_t vl) { return __riscv_vfmacc_vf_f32m4(acc, a, x, vl); }

inline VIdx strided_offsets(int64_t step_bytes, int64_t base_bytes, size_t vl) {
  const vint64m8_t i = __riscv_vreinterpret_v_u64m8_i64m8(__riscv_vid_v_u64m8(vl));
  return __riscv_vreinterpret_v_i64m8_u64m8(
      __riscv_vmadd_vx_i64m8(i, step_bytes, __riscv_vmv_v_x_i64m8(base_bytes, vl), vl));
}
#else
inline VF fmacc_ta(VF acc, float a, const VF& x, size_t vl) { return fmacc(acc, a, x, vl); }

inline VIdx strided_offsets(int64_t step_bytes, int64_t base_bytes, size_t vl) {
  VIdx r{};
  for (size_t i = 0; i < vl; ++i) r.v[i] = base_bytes + static_cast<int64_t>(i) * step_bytes;
  return r;
}
#endif

// ===========================================================================
// Added for the int8 KV cache (csrc/kernels/kv_write.cpp write_kv_int8,
// decode.cpp and extend.cpp with kv_int8).
//
// Int8Traits: an int8 cache row segment widened to float32 (exact: sign
// extension, then integer -> float conversion), by unit-stride or indexed
// load; the scale is applied by the caller, once per token row or folded
// into sm_scale / the output. CacheTraits<T, kInt8> picks the cache's traits.
// mul(x, y): lane-wise product (a block's per-token scales). abs, div:
// for the quantizer. store_i8: clamp to [-127, 127], round to nearest with
// ties to even (the ABI's default rounding mode; the portable build uses
// std::nearbyint under the same default), narrow to int8 and store.
// How an int8 cache's scales enter attention (decode and extend alike): a
// dynamic (NaN) scale is per token, gathered per KV block and applied to the
// block's scores (K) or probabilities (V); a static one folds into the
// query's scale (K) or the output's 1/l (V). For a float cache (Q8 false)
// nothing is scaled.
struct ScaleFold {
  bool k_dynamic, v_dynamic;
  float q_scale, out_scale;
};
template <bool Q8>
inline ScaleFold fold_scales(const rvv_attn::Int8Scales& s, float sm_scale) {
  const bool k_dyn = Q8 && s.k_scale != s.k_scale, v_dyn = Q8 && s.v_scale != s.v_scale;
  return {k_dyn, v_dyn, Q8 && !k_dyn ? sm_scale * s.k_scale : sm_scale, Q8 && !v_dyn ? s.v_scale : 1.0f};
}

#if RVV_ATTN_HAS_RVV
inline VF mul(VF x, VF y, size_t vl) { return __riscv_vfmul_vv_f32m4(x, y, vl); }
inline VF abs(VF x, size_t vl) { return __riscv_vfabs_v_f32m4(x, vl); }
inline VF div(VF x, float a, size_t vl) { return __riscv_vfdiv_vf_f32m4(x, a, vl); }
inline void store_i8(int8_t* p, VF x, size_t vl) {
  const VF c = __riscv_vfmin_vf_f32m4(__riscv_vfmax_vf_f32m4(x, -127.0f, vl), 127.0f, vl);
  __riscv_vse8_v_i8m1(p, __riscv_vncvt_x_x_w_i8m1(__riscv_vfncvt_x_f_w_i16m2(c, vl), vl), vl);
}
struct Int8Traits {
  using Elem = int8_t;
  static VF widen(vint8m1_t b, size_t vl) { return __riscv_vfwcvt_f_x_v_f32m4(__riscv_vsext_vf2_i16m2(b, vl), vl); }
  static VF load(const Elem* p, size_t vl) { return widen(__riscv_vle8_v_i8m1(p, vl), vl); }
  static VF gather(const Elem* base, VIdx off, size_t vl) { return widen(__riscv_vluxei64_v_i8m1(base, off, vl), vl); }
};
#else
inline VF mul(VF x, const VF& y, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] *= y.v[i];
  return x;
}
inline VF abs(VF x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] = std::fabs(x.v[i]);
  return x;
}
inline VF div(VF x, float a, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] /= a;
  return x;
}
inline void store_i8(int8_t* p, const VF& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) {
    const float c = std::fmin(std::fmax(x.v[i], -127.0f), 127.0f);
    p[i] = static_cast<int8_t>(std::nearbyint(c));
  }
}
struct Int8Traits {
  using Elem = int8_t;
  static VF load(const Elem* p, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = static_cast<float>(p[i]);
    return r;
  }
  static VF gather(const Elem* base, const VIdx& off, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = static_cast<float>(base[off.v[i]]);
    return r;
  }
};
#endif

// ===========================================================================
// Added for the extend kernel's register-blocked GEMMs (csrc/kernels/extend.cpp).
//
// VW: a wide float32 vector of up to kWideLanes = 2 * kLanes values (LMUL=8
// in the RVV build). P.V keeps two query rows' accumulator chunks of this
// width in registers plus one V chunk (3 of the 4 LMUL-8 groups), so each
// scalar probability feeds twice the lanes of a VF and each V load feeds two
// rows. fmacc_wide is tail-agnostic: its accumulators' vl never changes.
// store_strided: p[i * stride_bytes / 4] = x[i] for i < vl (the query tile
// stored transposed, so the four multipliers of a Q.K step are adjacent).
constexpr size_t kWideLanes = 2 * kLanes;
#if RVV_ATTN_HAS_RVV
using VW = vfloat32m8_t;
inline size_t setvl_wide(size_t n) { return __riscv_vsetvl_e32m8(n); }
inline VW load_wide(const float* p, size_t vl) { return __riscv_vle32_v_f32m8(p, vl); }
inline void store_wide(float* p, VW x, size_t vl) { __riscv_vse32_v_f32m8(p, x, vl); }
inline VW mul_wide(VW x, float a, size_t vl) { return __riscv_vfmul_vf_f32m8(x, a, vl); }
inline VW fmacc_wide(VW acc, float a, VW x, size_t vl) { return __riscv_vfmacc_vf_f32m8(acc, a, x, vl); }
inline void store_strided(float* p, ptrdiff_t stride_bytes, VF x, size_t vl) {
  __riscv_vsse32_v_f32m4(p, stride_bytes, x, vl);
}
#else
struct VW {
  float v[kWideLanes];
};
inline size_t setvl_wide(size_t n) { return n < kWideLanes ? n : kWideLanes; }
inline VW load_wide(const float* p, size_t vl) {
  VW r{};
  for (size_t i = 0; i < vl; ++i) r.v[i] = p[i];
  return r;
}
inline void store_wide(float* p, const VW& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) p[i] = x.v[i];
}
inline VW mul_wide(VW x, float a, size_t vl) {
  for (size_t i = 0; i < vl; ++i) x.v[i] *= a;
  return x;
}
inline VW fmacc_wide(VW acc, float a, const VW& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) acc.v[i] += a * x.v[i];
  return acc;
}
inline void store_strided(float* p, ptrdiff_t stride_bytes, const VF& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) p[static_cast<ptrdiff_t>(i) * (stride_bytes / 4)] = x.v[i];
}
#endif

// exp_nonpositive(x): exp(x) for x <= 0 or NaN (softmax's s - max), bit for
// bit what exp() returns for those inputs, in fewer instructions: no clamp
// to kExpHi and no overflow merge (both are no-ops below 0; a NaN is still
// clamped to kExpLo by vfmax and restored at the end), and the first Horner
// step as one vfmacc.vf into a splat of c6 (the same fma(c7, r, c6)).
#if RVV_ATTN_HAS_RVV
inline VF exp_nonpositive(VF x, size_t vl) {
  const VF xc = __riscv_vfmax_vf_f32m4(x, kExpLo, vl);
  const vint32m4_t n = __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(xc, kLog2e, vl), vl);
  const VF nf = __riscv_vfcvt_f_x_v_f32m4(n, vl);
  VF r = __riscv_vfnmsac_vf_f32m4(xc, kLn2Hi, nf, vl);
  r = __riscv_vfnmsac_vf_f32m4(r, kLn2Lo, nf, vl);
  VF p = __riscv_vfmacc_vf_f32m4(splat(kExpC[6], vl), kExpC[7], r, vl);
  for (int k = 5; k >= 0; --k) p = __riscv_vfmadd_vv_f32m4(p, r, splat(kExpC[k], vl), vl);
  const vuint32m4_t scale =
      __riscv_vsll_vx_u32m4(__riscv_vreinterpret_v_i32m4_u32m4(__riscv_vadd_vx_i32m4(n, 127, vl)), 23, vl);
  VF y = __riscv_vfmul_vv_f32m4(p, __riscv_vreinterpret_v_u32m4_f32m4(scale), vl);
  y = __riscv_vfmerge_vfm_f32m4(y, 0.0f, __riscv_vmflt_vf_f32m4_b8(x, kExpLo, vl), vl);
  return __riscv_vmerge_vvm_f32m4(y, x, __riscv_vmfne_vv_f32m4_b8(x, x, vl), vl);
}
#else
inline VF exp_nonpositive(VF x, size_t vl) { return exp(x, vl); }
#endif

template <DType T, bool kInt8>
struct CacheTraitsOf {
  using type = Traits<T>;
};
template <DType T>
struct CacheTraitsOf<T, true> {
  using type = Int8Traits;
};
template <DType T, bool kInt8>
using CacheTraits = typename CacheTraitsOf<T, kInt8>::type;

// ===========================================================================
// Added for the decode kernel (csrc/kernels/decode.cpp).
//
// A K column of a KV block is gathered through one byte offset per token.
// Gathering 32-bit words instead of single elements fetches 2 columns of a
// 16-bit cache (4 of an int8 one) per indexed load, all at the float32
// register group, so no vtype switch sits between the load and the FMAs:
//   VWord        up to kLanes 32-bit words;
//   VIdx32       up to kLanes byte offsets below 2^32 (half the registers of VIdx);
//   fits_u32     whether every offset is below 2^32; narrow_offsets then keeps the low halves;
//   gather_words the word at base + off[i] (4-byte aligned) for i < vl;
//   KvWords<T, Q8>::kCols columns per word, col<K>(w) column K widened to float32
//                (exact: the same values Traits/Int8Traits load);
//   KvWords<T, Q8>::load a cache row segment widened to float32 with every
//                step at the float32 register group (int8: vsext.vf4 + vfcvt);
// (A score vector goes into the token-major [token][head] table with the
// extend section's store_strided.)
#if RVV_ATTN_HAS_RVV
using VWord = vuint32m4_t;
using VIdx32 = vuint32m4_t;

inline bool fits_u32(VIdx off, size_t vl) {
  const vuint64m1_t zero = __riscv_vmv_s_x_u64m1(0, 1);
  return __riscv_vmv_x_s_u64m1_u64(__riscv_vredmaxu_vs_u64m8_u64m1(off, zero, vl)) <= 0xffffffffu;
}
inline VIdx32 narrow_offsets(VIdx off, size_t vl) { return __riscv_vnsrl_wx_u32m4(off, 0, vl); }
inline VWord gather_words(const void* base, VIdx32 off, size_t vl) {
  return __riscv_vluxei32_v_u32m4(static_cast<const uint32_t*>(base), off, vl);
}
inline VWord gather_words(const void* base, VIdx off, size_t vl) {
  return __riscv_vluxei64_v_u32m4(static_cast<const uint32_t*>(base), off, vl);
}

namespace detail {
inline VF word_as_f32(VWord w) { return __riscv_vreinterpret_v_u32m4_f32m4(w); }
// Signed byte K of each word (K = 0 the lowest) as float32.
template <int K>
inline VF word_i8(VWord w, size_t vl) {
  vint32m4_t x = __riscv_vreinterpret_v_u32m4_i32m4(w);
  if constexpr (K < 3) x = __riscv_vsll_vx_i32m4(x, 24 - 8 * K, vl);
  return __riscv_vfcvt_f_x_v_f32m4(__riscv_vsra_vx_i32m4(x, 24, vl), vl);
}
}  // namespace detail

template <DType T, bool Q8>
struct KvWords;
template <DType T>
struct KvWords<T, true> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(VWord w, size_t vl) { return detail::word_i8<K>(w, vl); }
  static VF load(const int8_t* p, size_t vl) {
    return __riscv_vfcvt_f_x_v_f32m4(__riscv_vsext_vf4_i32m4(__riscv_vle8_v_i8m1(p, vl), vl), vl);
  }
};
template <>
struct KvWords<DType::BFloat16, false> {
  static constexpr int kCols = 2;
  // Little endian: column 2j is the low half of word j.
  template <int K>
  static VF col(VWord w, size_t vl) {
    if constexpr (K == 0) return detail::word_as_f32(__riscv_vsll_vx_u32m4(w, 16, vl));
    else return detail::word_as_f32(__riscv_vand_vx_u32m4(w, 0xffff0000u, vl));
  }
  static VF load(const uint16_t* p, size_t vl) { return Traits<DType::BFloat16>::load(p, vl); }
};
template <>
struct KvWords<DType::Float16, false> {
  static constexpr int kCols = 2;
  template <int K>
  static VF col(VWord w, size_t vl) { return detail::widen_f16(__riscv_vnsrl_wx_u16m2(w, 16 * K, vl), vl); }
  static VF load(const uint16_t* p, size_t vl) { return Traits<DType::Float16>::load(p, vl); }
};
template <>
struct KvWords<DType::Float32, false> {
  static constexpr int kCols = 1;
  template <int K>
  static VF col(VWord w, size_t) { return detail::word_as_f32(w); }
  static VF load(const float* p, size_t vl) { return Traits<DType::Float32>::load(p, vl); }
};
#else
struct VWord {
  uint32_t v[kLanes];
};
using VIdx32 = VIdx;

inline bool fits_u32(const VIdx& off, size_t vl) {
  for (size_t i = 0; i < vl; ++i) {
    if (static_cast<uint64_t>(off.v[i]) > 0xffffffffu) return false;
  }
  return true;
}
inline VIdx32 narrow_offsets(const VIdx& off, size_t) { return off; }
inline VWord gather_words(const void* base, const VIdx& off, size_t vl) {
  VWord r{};
  for (size_t i = 0; i < vl; ++i) std::memcpy(&r.v[i], static_cast<const char*>(base) + off.v[i], 4);
  return r;
}

template <DType T, bool Q8>
struct KvWords;
template <DType T>
struct KvWords<T, true> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(const VWord& w, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = static_cast<float>(static_cast<int8_t>(w.v[i] >> (8 * K)));
    return r;
  }
  static VF load(const int8_t* p, size_t vl) { return Int8Traits::load(p, vl); }
};
template <DType T>
struct KvWords<T, false> {
  static constexpr int kCols = T == DType::Float32 ? 1 : 2;
  template <int K>
  static VF col(const VWord& w, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) {
      if constexpr (T == DType::Float32) r.v[i] = bits_f32(w.v[i]);
      else r.v[i] = Traits<T>::to_f32(static_cast<uint16_t>(w.v[i] >> (16 * K)));
    }
    return r;
  }
  static VF load(const typename Traits<T>::Elem* p, size_t vl) { return Traits<T>::load(p, vl); }
};
#endif

}  // namespace vec
}  // namespace RVV_ATTN_NS
