// The vector vocabulary the kernels are written in.
//
// Kernel side only: no torch headers. Everything lives in the variant's
// namespace, so each VLEN build gets its own copy and nothing here has
// external linkage across variants.
//
// A kernel includes this header and nothing of the backends. It holds what
// every build shares: the block sizes, the scalar conversions and the exp
// and tanh constants with their scalar forms, the int8 scale folding, and
// the primary templates. The operations come from one backend, chosen by the
// build like Highway's per-target headers:
//   kernels/vec_rvv.h       RVV intrinsics (VF at LMUL 4, VW at LMUL 8);
//   kernels/vec_portable.h  plain arrays with the vlen128 build's lane
//                           count, so the portable build runs the same
//                           blocking and the same arithmetic (same exp
//                           polynomial, same RNE narrowing) without
//                           intrinsics.
//
// Types:
//   VF      up to kLanes float32 values (the accumulator type);
//   VIdx    up to kLanes byte offsets (for indexed loads);
//   VW      up to kWideLanes float32 values (the extend kernel's P.V rows);
//   VWord   up to kLanes 32-bit words; VIdx32 up to kLanes byte offsets
//           below 2^32 (half the registers of VIdx in the RVV build).
// Every operation takes ``vl`` (active lanes, <= kLanes, or <= kWideLanes
// for VW); operations that accumulate keep lanes >= vl unchanged
// (tail-undisturbed) unless they say otherwise.
//
// Operations on VF:
//   setvl(n)                 min(n, kLanes); zeros(), splat(a, vl);
//   load(p, vl), store(p, x, vl);
//   fmacc(acc, a, x, vl)     acc[i] += a * x[i] for i < vl; lanes >= vl keep
//                            their value;
//   fmacc_ta(acc, a, x, vl)  the same, tail-agnostic: for accumulators whose
//                            vl never changes (a P.V row chunk), where the
//                            tail-undisturbed policy buys nothing and costs
//                            a vsetvli switch next to every load;
//   mul(x, a | y, vl), sub(x, a | y, vl), abs(x, vl), div(x, a, vl);
//   reduce_max(x, vl)        NaNs skipped (as vfredmax does); reduce_sum;
//   first_non_finite(x, vl)  the first lane < vl holding inf or NaN, or -1;
//   exp(x, vl)               exp_scalar lane by lane (see kExpLo below);
//   exp_nonpositive(x, vl)   exp(x) for x <= 0 or NaN (softmax's s - max),
//                            bit for bit, in fewer instructions;
//   softcap(x, cap, vl)      cap * tanh(x / cap), as tanh_scalar.
//   fill_zero(p, n)          p[0..n) = 0 with vector stores (no memset);
//   hide_unshown(x, shown, vl)  x[i], or -inf where the byte shown[i] is 0
//                            (a tree mask's row).
// Offsets:
//   row_offsets(map, map_is_int64, row_bytes, base_bytes, vl)
//       map[0..vl) (int32 or int64 slot numbers, already validated) *
//       row_bytes + base_bytes: the rows of a KV block's tokens;
//   strided_offsets(step_bytes, base_bytes, vl)
//       base_bytes + i * step_bytes for i < vl: the rows of a contiguous
//       run of tokens (the new tokens' K rows), for Traits::gather;
//   store_offsets(dst, off, vl);
//   add_to_offsets(dst, bytes, vl)  dst[i] += bytes for i < vl (a stored
//       block's rows moved on to the next chunk of columns).
// Dtypes go through Traits<DType>: load a row segment widened to float32,
// gather rows through byte offsets, store with round-to-nearest-even
// narrowing; to_f32 for one element. Int8Traits does the same for an int8
// cache row segment (exact: sign extension, then integer -> float
// conversion), by unit-stride or indexed load; the scale is applied by the
// caller, once per token row or folded into sm_scale / the output.
// CacheTraits<T, kInt8> picks the cache's traits. store_i8(p, x, vl), for
// the quantizer: clamp to [-127, 127], round to nearest with ties to even,
// narrow to int8 and store.
// Wide vectors (VW), for the extend kernel's register-blocked GEMMs: P.V
// keeps two query rows' accumulator chunks of this width in registers plus
// one V chunk (3 of the 4 LMUL-8 groups), so each scalar probability feeds
// twice the lanes of a VF and each V load feeds two rows:
//   setvl_wide, load_wide, store_wide, mul_wide;
//   fmacc_wide(acc, a, x, vl)  tail-agnostic: its accumulators' vl never
//                              changes;
//   store_strided(p, stride_bytes, x, vl)  p[i * stride_bytes / 4] = x[i]
//       for i < vl, a VF (the query tile stored transposed, so the four
//       multipliers of a Q.K step are adjacent; also a score vector into
//       the decode kernel's token-major [token][head] table).
// Word gathers, for the decode kernel: a K column of a KV block is gathered
// through one byte offset per token. Gathering 32-bit words instead of
// single elements fetches 2 columns of a 16-bit cache (4 of an int8 one)
// per indexed load, all at the float32 register group, so no vtype switch
// sits between the load and the FMAs:
//   fits_u32(off, vl)        whether every offset is below 2^32;
//   narrow_offsets(off, vl)  then keeps the low halves (a VIdx32);
//   gather_words(base, off, vl)  the word at base + off[i] (4-byte aligned)
//                            for i < vl, through VIdx or VIdx32;
//   KvWords<T, Q8>::kCols    columns per word; col<K>(w, vl) column K
//                            widened to float32 (exact: the same values
//                            Traits/Int8Traits load); load(p, vl) a cache
//                            row segment widened to float32 with every step
//                            at the float32 register group (int8: vsext.vf4
//                            + vfcvt); the same in three steps, so a caller
//                            can spread them between other work (Raw r =
//                            fetch(p, vl); Half h = widen_first(r, vl);
//                            VF x = widen_last(h, vl)): an in-order core
//                            stalls an instruction that waits on a widening
//                            issued just before it; kStagedWidening says
//                            whether the decode kernel does that;
//   kColumnsAhead<T, Q8>     whether the decode kernel's Q.K widens each
//                            column one column ahead of its FMAs and
//                            gathers the next word early, for the same
//                            reason (both measured per variant, in the
//                            backend headers).
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
// Lanes of a wide vector (VW).
constexpr size_t kWideLanes = 2 * kLanes;

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
    const uint32_t an = a - 0x38000000u;          // rebias 127 -> 15
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

// float8_e4m3fn (sign, 4 exponent bits with bias 7, 3 mantissa bits; no
// infinity, S.1111.111 is NaN; largest finite 448), as torch defines it.
// The 7 magnitude bits placed at float32's bit positions 26..20 read as the
// value times 2^-120, normals and subnormals alike (an e4m3 subnormal lands
// on a float32 subnormal, exactly), so one exact multiply rebiases both.
// NaN comes out with torch's bits (0x7ff00000 and the sign).
constexpr float kE4m3Rebias = 0x1p120f;
constexpr uint32_t kE4m3NanMagnitude = 0x7fu;
// The code placed (sign at bit 31, magnitude at 26..20) and not rebiased:
// the value times 2^-120, or for a NaN code a finite number. The fp8
// attention kernels read the cache this way and fold 2^120 into the query
// or the probabilities, finding NaN codes separately (any_e4m3_nan).
inline float e4m3_placed(uint8_t b) {
  return bits_f32(static_cast<uint32_t>(b & 0x80u) << 24 | static_cast<uint32_t>(b & 0x7fu) << 20);
}
inline bool e4m3_is_nan(uint8_t b) { return (b & 0x7fu) == kE4m3NanMagnitude; }
inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  if (e4m3_is_nan(b)) return bits_f32(0x7ff00000u | sign);
  return bits_f32(f32_bits(bits_f32(static_cast<uint32_t>(b & 0x7fu) << 20) * kE4m3Rebias) | sign);
}

// float32 -> float8_e4m3fn as torch converts (c10's fp8e4m3fn_from_fp32_value):
// round to nearest even; NaN stays NaN (sign kept). Above the largest finite
// value torch has two behaviours, so the caller says which: in newer torch
// (2.13 and 2.14 here) a magnitude that rounds past 448 (from just above
// 464) and infinities saturate to +-448 (``saturate``); in older torch (2.6,
// Debian trixie's) they become NaN.
inline uint8_t f32_to_e4m3(float x, bool saturate) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  uint32_t r;
  if (a > 0x7f800000u) {
    r = kE4m3NanMagnitude;
  } else if (a >= 0x43f00000u) {  // 480 and up, infinity
    r = saturate ? kE4m3NanMagnitude - 1 : kE4m3NanMagnitude;
  } else if (a < 0x3c800000u) {
    // Below 2^-6, e4m3's subnormal range (or zero): adding 2^14 rounds the
    // value to a multiple of 2^-9, the subnormal spacing, by the FPU's own
    // round-to-nearest-even; the low bits are then the e4m3 code.
    r = f32_bits(bits_f32(a) + 0x1p14f) - 0x46800000u;
  } else {
    // Rebias 127 -> 7, round the 20 dropped mantissa bits to nearest even
    // (a mantissa carry bumps the exponent, as it should; past 448 it
    // reaches the NaN code).
    r = (a - 0x3c000000u + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    if (saturate && r == kE4m3NanMagnitude) r = kE4m3NanMagnitude - 1;
  }
  return static_cast<uint8_t>(r | sign);
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
// error is ~2^-24 absolute, so cap * tanh(s / cap) would be off by ~cap * 2^-24),
// so below |y| = 0.5 an odd polynomial y + y^3 P(y^2) is used instead.
// P is a least-squares fit of (tanh(y)/y - 1)/y^2 on [0, 0.25] in y^2,
// weighted for relative error (made with numpy in float64); evaluated in
// float32 its max relative error is 1.03 * 2^-24 on |y| < 0.5. Above 0.5
// the exp form loses at most one bit to cancellation (e^-1 / (1 - e^-1)).
constexpr float kTanhPolyLimit = 0.5f;
constexpr float kTanhC[5] = {-0.3333332659006102f, 0.13332954240019546f, -0.05389806913202003f, 0.02129291959791805f,
                             -0.00663946699695033f};

inline float exp_scalar(float x) {
  // The online softmax's rescale exp(m_old - m_new) is exp(0) on most blocks
  // (the running max seldom moves): 1, exactly what the polynomial gives.
  if (x == 0.0f) return 1.0f;
  if (x != x) return x;
  if (x < kExpLo) return 0.0f;
  if (x > kExpHi) return std::numeric_limits<float>::infinity();
  // Rounds to nearest even as nearbyint does (the default rounding mode), but
  // clang makes rint + int conversion one fcvt.w.s where nearbyint is a libm
  // call: decode runs this once per KV block and head, thousands of times.
  const int32_t n = static_cast<int32_t>(std::rint(x * kLog2e));
  const float nf = static_cast<float>(n);
  float r = std::fma(-nf, kLn2Hi, x);
  r = std::fma(-nf, kLn2Lo, r);
  float p = kExpC[7];
  for (int k = 6; k >= 0; --k) p = std::fma(p, r, kExpC[k]);
  return p * bits_f32(static_cast<uint32_t>(n + 127) << 23);
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

// ---------------------------------------------------------------------------
// What a KV cache stores: the query's float dtype, int8 codes with scales,
// or float8_e4m3fn codes with static scales.
enum class KvKind { Float, Int8, Fp8 };

// How a quantized cache's scales enter attention (decode and extend alike):
// a dynamic (NaN) scale, int8 only, is per token, gathered per KV block and
// applied to the block's scores (K) or probabilities (V); a static one
// folds into the query's scale (K) or the output's 1/l (V). For a float
// cache (Q8 false) nothing is scaled.
struct ScaleFold {
  bool k_dynamic, v_dynamic;
  float q_scale, out_scale;
};
template <bool Q8>
inline ScaleFold fold_scales(const rvv_attn::Int8Scales& s, float sm_scale) {
  const bool k_dyn = Q8 && s.k_scale != s.k_scale, v_dyn = Q8 && s.v_scale != s.v_scale;
  return {k_dyn, v_dyn, Q8 && !k_dyn ? sm_scale * s.k_scale : sm_scale, Q8 && !v_dyn ? s.v_scale : 1.0f};
}

// Specialised by each backend.
template <DType T>
struct Traits;
template <DType T, KvKind K>
struct KvWords;

}  // namespace vec
}  // namespace RVV_ATTN_NS

#define RVV_ATTN_VEC_BACKEND
#if RVV_ATTN_HAS_RVV
#include "kernels/vec_rvv.h"
#else
#include "kernels/vec_portable.h"
#endif
#undef RVV_ATTN_VEC_BACKEND

namespace RVV_ATTN_NS {
namespace vec {

template <DType T, KvKind K>
struct CacheTraitsOf {
  using type = Traits<T>;
};
template <DType T>
struct CacheTraitsOf<T, KvKind::Int8> {
  using type = Int8Traits;
};
template <DType T>
struct CacheTraitsOf<T, KvKind::Fp8> {
  using type = E4m3Codes;
};
template <DType T, KvKind K>
using CacheTraits = typename CacheTraitsOf<T, K>::type;

// dst[0:n] = e4m3(src[0:n] / scale) as SGLang's fp8 pool quantizes: the
// quotient in float32, rounded to src's dtype (the pool divides in place),
// then torch's conversion (``saturate``: see f32_to_e4m3).
template <DType T>
inline void quantize_e4m3_row(uint8_t* dst, const typename Traits<T>::Elem* src, int64_t n, float scale,
                              bool saturate) {
  using Tr = Traits<T>;
  typename Tr::Elem rounded[kLanes];
  for (int64_t i = 0; i < n;) {
    const size_t vl = setvl(static_cast<size_t>(n - i));
    VF x = div(Tr::load(src + i, vl), scale, vl);
    if constexpr (T != DType::Float32) {
      Tr::store(rounded, x, vl);
      x = Tr::load(rounded, vl);
    }
    E4m3Codes::store(dst + i, x, saturate, vl);
    i += static_cast<int64_t>(vl);
  }
}

// Zeroes a float buffer with vector stores rather than memset: a libc call
// would run outside the library, where neither the benchmark's instruction
// counts nor its cycle estimate see it.
inline void fill_zero(float* dst, int64_t n) {
  const VF zero = zeros();
  for (int64_t c = 0; c < n;) {
    const size_t vl = setvl(static_cast<size_t>(n - c));
    store(dst + c, zero, vl);
    c += static_cast<int64_t>(vl);
  }
}

}  // namespace vec
}  // namespace RVV_ATTN_NS
