// The RVV backend of kernels/vec.h: the vocabulary at LMUL 4 (VF, VIdx at
// LMUL 8 with 64-bit offsets) and LMUL 8 for the wide vectors. Only the base
// V extension: bf16/f16 conversions are integer bit manipulation (no Zvfh,
// no Zvfbfmin), so every RVV 1.0 CPU runs it.
//
// Included by kernels/vec.h only, after the shared part it builds on (block
// sizes, scalar helpers, the primary templates).
#pragma once

#ifndef RVV_ATTN_VEC_BACKEND
#error "kernels include kernels/vec.h, which picks the backend for the build"
#endif

#include <riscv_vector.h>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace RVV_ATTN_NS {
namespace vec {

using VF = vfloat32m4_t;

// Whether the decode kernel's P.V spreads each V row's widening between the
// FMAs of other rows (KvWords fetch / widen_first / widen_last). Measured on
// the LLVM scheduling model of each VLEN's benchmark core, decode bf16 at
// 4,096 tokens: -15% cycles on the SpacemiT X60 (VLEN 256, in order) for
// +1.6% instructions; at VLEN 128 (SiFive P670, out of order) -0.2% cycles
// for +3% instructions, and +0.2% / +3.6% cycles on the X280 (512) and the
// X390 (1024), whose plain loop already overlaps the widening.
constexpr bool kStagedWidening = RVV_ATTN_VLEN == 256;
// Whether the decode kernel's Q.K widens each K column one column ahead of
// its FMAs and gathers the next K word as soon as the current one is taken
// apart (Decode::scores_by_words_ahead). Measured on each VLEN's benchmark
// core, decode at 4,096 tokens, cycles (instructions): bf16 -5.1% (+0.7%)
// on the X60, -1.1% (+0.1%) on the P670, -2.4% (+0.4%) on the X280, -1.7%
// (+0.6%) on the X390; int8 -2.5% (+0.1%) on the X60 and -1.1% (+0.4%) on
// the X390, but +0.1% on the P670 and the X280, so not there. Not for f16,
// whose software widening needs more registers than the pipeline leaves,
// and spills.
// The fp8 cache's columns take the same three steps as the int8 one's.
template <DType T, KvKind K>
constexpr bool kColumnsAhead = K != KvKind::Float ? RVV_ATTN_VLEN == 256 || RVV_ATTN_VLEN == 1024 : T != DType::Float16;
using VIdx = vuint64m8_t;
using VMask = vbool8_t;

inline size_t setvl(size_t n) { return __riscv_vsetvl_e32m4(n); }
#if defined(__clang__)
inline VF zeros() { return __riscv_vfmv_v_f_f32m4(0.0f, __riscv_vsetvlmax_e32m4()); }
#else
// For GCC, AVL kLanes (VLMAX of e32m4 at this fixed VLEN) rather than
// __riscv_vsetvlmax_e32m4(): GCC 14's vsetvl pass moves that request's
// `vsetvli rd,zero` onto a control-flow edge and keeps rd, a register that
// holds another live value there (in decode, the sequence length: every KV
// block after the first was dropped, or the process crashed). A constant
// AVL leaves no result register to misplace. Clang keeps the one-instruction
// VLMAX request (a constant AVL above 31 costs it an extra `li` per block:
// +0.3% instructions in bf16 decode at VLEN 256). docs/gcc.md has the evidence.
inline VF zeros() { return __riscv_vfmv_v_f_f32m4(0.0f, kLanes); }
#endif
inline VF splat(float a, size_t vl) { return __riscv_vfmv_v_f_f32m4(a, vl); }
inline VF load(const float* p, size_t vl) { return __riscv_vle32_v_f32m4(p, vl); }
inline void store(float* p, VF v, size_t vl) { __riscv_vse32_v_f32m4(p, v, vl); }
inline VF fmacc(VF acc, float a, VF x, size_t vl) { return __riscv_vfmacc_vf_f32m4_tu(acc, a, x, vl); }
inline VF mul(VF x, float a, size_t vl) { return __riscv_vfmul_vf_f32m4(x, a, vl); }
inline VF sub(VF x, float a, size_t vl) { return __riscv_vfsub_vf_f32m4(x, a, vl); }
inline VF sub(VF x, VF y, size_t vl) { return __riscv_vfsub_vv_f32m4(x, y, vl); }

// The first lane i < vl whose value is inf or NaN (x - x is NaN exactly
// there), or -1.
inline int64_t first_non_finite(VF x, size_t vl) {
  return __riscv_vfirst_m_b8(__riscv_vmfne_vf_f32m4_b8(__riscv_vfsub_vv_f32m4(x, x, vl), 0.0f, vl), vl);
}
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

// tanh_scalar's two forms, the odd polynomial for |y| < 0.5 and
// (1 - e^{-2|y|}) / (1 + e^{-2|y|}) above (the exponent is <= 0, so no
// overflow), both computed for every lane and merged by |y|.
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
inline void add_to_offsets(int64_t* dst, int64_t bytes, size_t vl) {
  __riscv_vse64_v_i64m8(dst, __riscv_vadd_vx_i64m8(__riscv_vle64_v_i64m8(dst, vl), bytes, vl), vl);
}

// ---------------------------------------------------------------------------
// Dtypes: widening loads and gathers, RNE narrowing stores.
namespace detail {
// The bf16 bits zero-extended to 32-bit words, as float32.
inline VF widen_bf16_words(vuint32m4_t w, size_t vl) {
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(w, 16, vl));
}
inline VF widen_bf16(vuint16m2_t h, size_t vl) { return widen_bf16_words(__riscv_vzext_vf2_u32m4(h, vl), vl); }
// The f16 bits zero-extended to 32-bit words, as float32.
inline VF widen_f16_words(vuint32m4_t w, size_t vl) {
  const vuint32m4_t sign = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x8000u, vl), 16, vl);
  const vuint32m4_t mag = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x7fffu, vl), 13, vl);
  vuint32m4_t bits =
      __riscv_vreinterpret_v_f32m4_u32m4(__riscv_vfmul_vf_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(mag), 0x1p112f, vl));
  bits = __riscv_vmerge_vvm_u32m4(bits, __riscv_vor_vx_u32m4(mag, 0x7f800000u, vl),
                                  __riscv_vmsgeu_vx_u32m4_b8(mag, 0x0f800000u, vl), vl);
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vor_vv_u32m4(bits, sign, vl));
}
inline VF widen_f16(vuint16m2_t h, size_t vl) { return widen_f16_words(__riscv_vzext_vf2_u32m4(h, vl), vl); }
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
  const vuint32m4_t half = __riscv_vsll_vv_u32m4(__riscv_vmv_v_x_u32m4(1u, vl), __riscv_vsub_vx_u32m4(sh, 1u, vl), vl);
  const VMask up =
      __riscv_vmor_mm_b8(__riscv_vmsgtu_vv_u32m4_b8(rem, half, vl),
                         __riscv_vmand_mm_b8(__riscv_vmseq_vv_u32m4_b8(rem, half, vl),
                                             __riscv_vmsne_vx_u32m4_b8(__riscv_vand_vx_u32m4(q, 1u, vl), 0u, vl), vl),
                         vl);
  q = __riscv_vadd_vx_u32m4_mu(up, q, q, 1u, vl);
  // select: subnormal, normal, overflow, NaN
  vuint32m4_t r = __riscv_vmerge_vvm_u32m4(q, rn, __riscv_vmsgeu_vx_u32m4_b8(a, 0x38800000u, vl), vl);
  r = __riscv_vmerge_vxm_u32m4(r, 0x7c00u, __riscv_vmsgeu_vx_u32m4_b8(a, 0x477ff000u, vl), vl);
  const vuint32m4_t nan =
      __riscv_vor_vx_u32m4(__riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(a, 13, vl), 0x3ffu, vl), 0x7e00u, vl);
  r = __riscv_vmerge_vvm_u32m4(r, nan, __riscv_vmsgtu_vx_u32m4_b8(a, 0x7f800000u, vl), vl);
  return __riscv_vnsrl_wx_u16m2(__riscv_vor_vv_u32m4(r, sign, vl), 0, vl);
}
}  // namespace detail

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

// ---------------------------------------------------------------------------
// The extend kernel's tail-agnostic accumulation and strided offsets.
inline VF fmacc_ta(VF acc, float a, VF x, size_t vl) { return __riscv_vfmacc_vf_f32m4(acc, a, x, vl); }

inline VIdx strided_offsets(int64_t step_bytes, int64_t base_bytes, size_t vl) {
  const vint64m8_t i = __riscv_vreinterpret_v_u64m8_i64m8(__riscv_vid_v_u64m8(vl));
  return __riscv_vreinterpret_v_i64m8_u64m8(
      __riscv_vmadd_vx_i64m8(i, step_bytes, __riscv_vmv_v_x_i64m8(base_bytes, vl), vl));
}

// ---------------------------------------------------------------------------
// The int8 cache: vfncvt rounds with the dynamic rounding mode,
// round-to-nearest-even (the ABI default).
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

// ---------------------------------------------------------------------------
// float8_e4m3fn codes (vec.h's e4m3_to_f32 / f32_to_e4m3, every case
// computed, then selected), one code per 32-bit word.
namespace detail {
inline VF widen_e4m3_words(vuint32m4_t w, size_t vl) {
  // The code to the top byte, then arithmetically back by 4: the sign stays
  // in bit 31, the magnitude lands on bits 26..20, and the mask clears the
  // copies of the sign in 30..27.
  const vint32m4_t top = __riscv_vreinterpret_v_u32m4_i32m4(__riscv_vsll_vx_u32m4(w, 24, vl));
  const vuint32m4_t placed =
      __riscv_vand_vx_u32m4(__riscv_vreinterpret_v_i32m4_u32m4(__riscv_vsra_vx_i32m4(top, 4, vl)), 0x87f00000u, vl);
  const vuint32m4_t value = __riscv_vreinterpret_v_f32m4_u32m4(
      __riscv_vfmul_vf_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(placed), kE4m3Rebias, vl));
  const VMask nan =
      __riscv_vmseq_vx_u32m4_b8(__riscv_vand_vx_u32m4(placed, 0x7fffffffu, vl), kE4m3NanMagnitude << 20, vl);
  return __riscv_vreinterpret_v_u32m4_f32m4(
      __riscv_vmerge_vvm_u32m4(value, __riscv_vor_vx_u32m4(placed, 0x7ff00000u, vl), nan, vl));
}
inline vuint32m4_t narrow_e4m3_words(VF x, bool saturate, size_t vl) {
  const vuint32m4_t u = __riscv_vreinterpret_v_f32m4_u32m4(x);
  const vuint32m4_t sign = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(u, 24, vl), 0x80u, vl);
  const vuint32m4_t a = __riscv_vand_vx_u32m4(u, 0x7fffffffu, vl);
  // normal range: rebias, round to nearest even
  const vuint32m4_t lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(a, 20, vl), 1u, vl);
  vuint32m4_t r = __riscv_vsrl_vx_u32m4(
      __riscv_vadd_vv_u32m4(__riscv_vadd_vx_u32m4(a, 0x7ffffu - 0x3c000000u, vl), lsb, vl), 20, vl);
  // subnormal range: the FPU rounds to the subnormal spacing
  const VF shifted = __riscv_vfadd_vf_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(a), 0x1p14f, vl);
  const vuint32m4_t sub = __riscv_vsub_vx_u32m4(__riscv_vreinterpret_v_f32m4_u32m4(shifted), 0x46800000u, vl);
  r = __riscv_vmerge_vvm_u32m4(r, sub, __riscv_vmsltu_vx_u32m4_b8(a, 0x3c800000u, vl), vl);
  // past 448: saturate (a rounding into the NaN code, and every larger
  // value, leave codes >= 0x7f) or NaN
  if (saturate) {
    r = __riscv_vminu_vx_u32m4(r, kE4m3NanMagnitude - 1, vl);
  } else {
    r = __riscv_vmerge_vxm_u32m4(r, kE4m3NanMagnitude, __riscv_vmsgeu_vx_u32m4_b8(a, 0x43f00000u, vl), vl);
  }
  r = __riscv_vmerge_vxm_u32m4(r, kE4m3NanMagnitude, __riscv_vmsgtu_vx_u32m4_b8(a, 0x7f800000u, vl), vl);
  return __riscv_vor_vv_u32m4(r, sign, vl);
}
}  // namespace detail

struct E4m3Codes {
  using Elem = uint8_t;
  static VF load(const Elem* p, size_t vl) {
    return detail::widen_e4m3_words(__riscv_vzext_vf4_u32m4(__riscv_vle8_v_u8m1(p, vl), vl), vl);
  }
  static VF gather(const Elem* base, VIdx off, size_t vl) {
    return detail::widen_e4m3_words(__riscv_vzext_vf4_u32m4(__riscv_vluxei64_v_u8m1(base, off, vl), vl), vl);
  }
  static void store(Elem* p, VF x, bool saturate, size_t vl) {
    const vuint16m2_t half = __riscv_vnsrl_wx_u16m2(detail::narrow_e4m3_words(x, saturate, vl), 0, vl);
    __riscv_vse8_v_u8m1(p, __riscv_vnsrl_wx_u8m1(half, 0, vl), vl);
  }
};

// x[i] where shown[i] != 0, else -inf, for i < vl (speculative decoding's
// tree mask over a row of scores).
inline VF hide_unshown(VF x, const uint8_t* shown, size_t vl) {
  const vuint32m4_t bytes = __riscv_vzext_vf4_u32m4(__riscv_vle8_v_u8m1(shown, vl), vl);
  return __riscv_vfmerge_vfm_f32m4(x, -std::numeric_limits<float>::infinity(), __riscv_vmseq_vx_u32m4_b8(bytes, 0, vl),
                                   vl);
}

// ---------------------------------------------------------------------------
// Wide vectors: LMUL 8.
using VW = vfloat32m8_t;
inline size_t setvl_wide(size_t n) { return __riscv_vsetvl_e32m8(n); }
inline VW load_wide(const float* p, size_t vl) { return __riscv_vle32_v_f32m8(p, vl); }
inline void store_wide(float* p, VW x, size_t vl) { __riscv_vse32_v_f32m8(p, x, vl); }
inline VW mul_wide(VW x, float a, size_t vl) { return __riscv_vfmul_vf_f32m8(x, a, vl); }
inline VW fmacc_wide(VW acc, float a, VW x, size_t vl) { return __riscv_vfmacc_vf_f32m8(acc, a, x, vl); }
inline void store_strided(float* p, ptrdiff_t stride_bytes, VF x, size_t vl) {
  __riscv_vsse32_v_f32m4(p, stride_bytes, x, vl);
}

// No clamp to kExpHi and no overflow merge (both are no-ops below 0; a NaN is
// still clamped to kExpLo by vfmax and restored at the end), and the first
// Horner step as one vfmacc.vf into a splat of c6 (the same fma(c7, r, c6)).
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

// ---------------------------------------------------------------------------
// Word gathers for the decode kernel's K columns.
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

template <DType T>
struct KvWords<T, KvKind::Int8> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(VWord w, size_t vl) {
    return detail::word_i8<K>(w, vl);
  }
  static VF load(const int8_t* p, size_t vl) { return widen_last(widen_first(fetch(p, vl), vl), vl); }
  using Raw = vint8m1_t;
  using Half = vint32m4_t;
  static Raw fetch(const int8_t* p, size_t vl) { return __riscv_vle8_v_i8m1(p, vl); }
  static Half widen_first(Raw b, size_t vl) { return __riscv_vsext_vf4_i32m4(b, vl); }
  static VF widen_last(Half x, size_t vl) { return __riscv_vfcvt_f_x_v_f32m4(x, vl); }
};
// float8_e4m3fn codes placed, not rebiased (vec.h, e4m3_placed): the code
// moved to the top byte, arithmetically back by 4 so the magnitude lands on
// bits 26..20 with the sign in bit 31, and the copies of the sign in 30..27
// cleared. A V row segment: sign-extended bytes moved up by 20, the same
// bits.
template <DType T>
struct KvWords<T, KvKind::Fp8> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(VWord w, size_t vl) {
    if constexpr (K < 3) w = __riscv_vsll_vx_u32m4(w, 24 - 8 * K, vl);
    const vint32m4_t code_on_top = __riscv_vreinterpret_v_u32m4_i32m4(w);
    return detail::word_as_f32(__riscv_vand_vx_u32m4(
        __riscv_vreinterpret_v_i32m4_u32m4(__riscv_vsra_vx_i32m4(code_on_top, 4, vl)), 0x87f00000u, vl));
  }
  static VF load(const uint8_t* p, size_t vl) { return widen_last(widen_first(fetch(p, vl), vl), vl); }
  static VF gather(const uint8_t* base, VIdx off, size_t vl) {
    return widen_last(widen_first(__riscv_vluxei64_v_i8m1(reinterpret_cast<const int8_t*>(base), off, vl), vl), vl);
  }
  using Raw = vint8m1_t;
  using Half = vint32m4_t;
  static Raw fetch(const uint8_t* p, size_t vl) { return __riscv_vle8_v_i8m1(reinterpret_cast<const int8_t*>(p), vl); }
  static Half widen_first(Raw b, size_t vl) { return __riscv_vsext_vf4_i32m4(b, vl); }
  static VF widen_last(Half x, size_t vl) {
    return detail::word_as_f32(
        __riscv_vand_vx_u32m4(__riscv_vreinterpret_v_i32m4_u32m4(__riscv_vsll_vx_i32m4(x, 20, vl)), 0x87f00000u, vl));
  }
};

// Whether any of the n K rows (k_bytes codes at address k_rows[i]) or V
// rows holds a NaN code (magnitude 0x7f): running unsigned and signed byte
// maxima, since 0xff is the largest code unsigned and 0x7f the largest
// signed. Every load has one length, min(k_bytes, v_bytes, VLMAX), so the
// loop runs at one vtype; a longer row is read in pieces of that length, its
// last piece overlapping the one before (a byte read twice changes no
// maximum). Three vector instructions per row segment, and one reduction
// pair per call.
inline bool any_e4m3_nan(const int64_t* k_rows, int64_t k_bytes, const int64_t* v_rows, int64_t v_bytes, size_t n) {
  const size_t shortest = static_cast<size_t>(k_bytes < v_bytes ? k_bytes : v_bytes);
  const size_t vl = __riscv_vsetvl_e8m4(shortest);
  vuint8m4_t hi = __riscv_vmv_v_x_u8m4(0, vl);
  vint8m4_t top = __riscv_vmv_v_x_i8m4(0, vl);
  const auto piece = [&](const int64_t address) {
    const vuint8m4_t b = __riscv_vle8_v_u8m4(reinterpret_cast<const uint8_t*>(address), vl);
    hi = __riscv_vmaxu_vv_u8m4(hi, b, vl);
    top = __riscv_vmax_vv_i8m4(top, __riscv_vreinterpret_v_u8m4_i8m4(b), vl);
  };
  const auto row = [&](const int64_t address, int64_t bytes) {
    for (int64_t c = 0; c + static_cast<int64_t>(vl) < bytes; c += static_cast<int64_t>(vl)) piece(address + c);
    piece(address + bytes - static_cast<int64_t>(vl));
  };
  if (static_cast<int64_t>(vl) == k_bytes && k_bytes == v_bytes) {
    // Every row one piece (D = Dv <= VLEN / 2, the common head): no piece
    // loop, and two tokens per trip halve the loop bookkeeping.
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      piece(k_rows[i]);
      piece(v_rows[i]);
      piece(k_rows[i + 1]);
      piece(v_rows[i + 1]);
    }
    if (i < n) {
      piece(k_rows[i]);
      piece(v_rows[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      row(k_rows[i], k_bytes);
      row(v_rows[i], v_bytes);
    }
  }
  const uint8_t max_unsigned =
      __riscv_vmv_x_s_u8m1_u8(__riscv_vredmaxu_vs_u8m4_u8m1(hi, __riscv_vmv_s_x_u8m1(0, 1), vl));
  const int8_t max_signed = __riscv_vmv_x_s_i8m1_i8(__riscv_vredmax_vs_i8m4_i8m1(top, __riscv_vmv_s_x_i8m1(0, 1), vl));
  return max_unsigned == 0xffu || max_signed == 0x7f;
}

// The first two widening steps of a 16-bit cache row, the same for bf16 and
// f16: the halfwords fetched, then zero-extended to 32-bit words.
struct HalfwordRows {
  using Raw = vuint16m2_t;
  using Half = vuint32m4_t;
  static Raw fetch(const uint16_t* p, size_t vl) { return __riscv_vle16_v_u16m2(p, vl); }
  static Half widen_first(Raw h, size_t vl) { return __riscv_vzext_vf2_u32m4(h, vl); }
};
template <>
struct KvWords<DType::BFloat16, KvKind::Float> : HalfwordRows {
  static constexpr int kCols = 2;
  // Little endian: column 2j is the low half of word j.
  template <int K>
  static VF col(VWord w, size_t vl) {
    if constexpr (K == 0) return detail::widen_bf16_words(w, vl);
    else return detail::word_as_f32(__riscv_vand_vx_u32m4(w, 0xffff0000u, vl));
  }
  static VF load(const uint16_t* p, size_t vl) { return Traits<DType::BFloat16>::load(p, vl); }
  static VF widen_last(Half w, size_t vl) { return detail::widen_bf16_words(w, vl); }
};
template <>
struct KvWords<DType::Float16, KvKind::Float> : HalfwordRows {
  static constexpr int kCols = 2;
  template <int K>
  static VF col(VWord w, size_t vl) {
    return detail::widen_f16(__riscv_vnsrl_wx_u16m2(w, 16 * K, vl), vl);
  }
  static VF load(const uint16_t* p, size_t vl) { return Traits<DType::Float16>::load(p, vl); }
  static VF widen_last(Half w, size_t vl) { return detail::widen_f16_words(w, vl); }
};
template <>
struct KvWords<DType::Float32, KvKind::Float> {
  static constexpr int kCols = 1;
  template <int K>
  static VF col(VWord w, size_t) {
    return detail::word_as_f32(w);
  }
  static VF load(const float* p, size_t vl) { return Traits<DType::Float32>::load(p, vl); }
  using Raw = VF;
  using Half = VF;
  static Raw fetch(const float* p, size_t vl) { return load(p, vl); }
  static Half widen_first(Raw x, size_t) { return x; }
  static VF widen_last(Half x, size_t) { return x; }
};

}  // namespace vec
}  // namespace RVV_ATTN_NS
