// The portable backend of kernels/vec.h: the same operations on plain
// arrays, lane by lane, with the vlen128 build's lane count, so it runs the
// same blocking and the same arithmetic (the same exp polynomial, the same
// RNE narrowing) as an RVV build, on any CPU and with any compiler.
//
// Included by kernels/vec.h only, after the shared part it builds on (block
// sizes, scalar helpers, the primary templates).
#pragma once

#ifndef RVV_ATTN_VEC_BACKEND
#error "kernels include kernels/vec.h, which picks the backend for the build"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace RVV_ATTN_NS {
namespace vec {

struct VF {
  float v[kLanes];
};

// Scalar loops have no vector latencies to hide, and copying the staged
// rows' arrays costs instructions (3-6% more in the portable decode).
constexpr bool kStagedWidening = false;
// The int8 decode's Q.K with each column widened ahead (see vec_rvv.h):
// -3.3% instructions here; for bf16 it is +2.7% (the copied column arrays).
template <DType T, KvKind K>
constexpr bool kColumnsAhead = K != KvKind::Float;
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
inline int64_t first_non_finite(const VF& x, size_t vl) {
  for (size_t i = 0; i < vl; ++i) {
    if (!std::isfinite(x.v[i])) return static_cast<int64_t>(i);
  }
  return -1;
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
    const int64_t slot = map_is_int64 ? static_cast<const int64_t*>(map)[i] : static_cast<const int32_t*>(map)[i];
    r.v[i] = slot * row_bytes + base_bytes;
  }
  return r;
}
inline void store_offsets(int64_t* dst, const VIdx& off, size_t vl) {
  for (size_t i = 0; i < vl; ++i) dst[i] = off.v[i];
}
inline void add_to_offsets(int64_t* dst, int64_t bytes, size_t vl) {
  for (size_t i = 0; i < vl; ++i) dst[i] += bytes;
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

template <>
struct Traits<DType::Float32> : PortableTraits<float, f32_identity, f32_identity> {};
template <>
struct Traits<DType::BFloat16> : PortableTraits<uint16_t, bf16_to_f32, f32_to_bf16> {};
template <>
struct Traits<DType::Float16> : PortableTraits<uint16_t, f16_to_f32, f32_to_f16> {};

// ---------------------------------------------------------------------------
// The extend kernel's tail-agnostic accumulation (arrays have no tail policy)
// and strided offsets.
inline VF fmacc_ta(VF acc, float a, const VF& x, size_t vl) { return fmacc(acc, a, x, vl); }

inline VIdx strided_offsets(int64_t step_bytes, int64_t base_bytes, size_t vl) {
  VIdx r{};
  for (size_t i = 0; i < vl; ++i) r.v[i] = base_bytes + static_cast<int64_t>(i) * step_bytes;
  return r;
}

// ---------------------------------------------------------------------------
// The int8 cache: std::nearbyint rounds to nearest even under the default
// rounding mode, as vfncvt does in the RVV build.
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

// float8_e4m3fn codes, lane by lane with vec.h's scalar conversions.
struct E4m3Codes {
  using Elem = uint8_t;
  static VF load(const Elem* p, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = e4m3_to_f32(p[i]);
    return r;
  }
  static VF gather(const Elem* base, const VIdx& off, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = e4m3_to_f32(base[off.v[i]]);
    return r;
  }
  static void store(Elem* p, const VF& x, bool saturate, size_t vl) {
    for (size_t i = 0; i < vl; ++i) p[i] = f32_to_e4m3(x.v[i], saturate);
  }
};

inline bool any_e4m3_nan(const int64_t* k_rows, int64_t k_bytes, const int64_t* v_rows, int64_t v_bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto* k = reinterpret_cast<const uint8_t*>(k_rows[i]);
    for (int64_t c = 0; c < k_bytes; ++c) {
      if (e4m3_is_nan(k[c])) return true;
    }
    const auto* v = reinterpret_cast<const uint8_t*>(v_rows[i]);
    for (int64_t c = 0; c < v_bytes; ++c) {
      if (e4m3_is_nan(v[c])) return true;
    }
  }
  return false;
}

inline VF hide_unshown(VF x, const uint8_t* shown, size_t vl) {
  for (size_t i = 0; i < vl; ++i) {
    if (shown[i] == 0) x.v[i] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

// ---------------------------------------------------------------------------
// Wide vectors.
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

// The scalar exp has no clamp or merge to skip.
inline VF exp_nonpositive(VF x, size_t vl) { return exp(x, vl); }

// ---------------------------------------------------------------------------
// Word gathers for the decode kernel's K columns.
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

// KvWords' three widening steps: a row is widened as it is fetched, so the
// other two steps pass it through.
template <typename Tr>
struct WidenedOnFetch {
  using Raw = VF;
  using Half = VF;
  static Raw fetch(const typename Tr::Elem* p, size_t vl) { return Tr::load(p, vl); }
  static Half widen_first(const Raw& x, size_t) { return x; }
  static VF widen_last(const Half& x, size_t) { return x; }
};

template <DType T>
struct KvWords<T, KvKind::Int8> : WidenedOnFetch<Int8Traits> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(const VWord& w, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = static_cast<float>(static_cast<int8_t>(w.v[i] >> (8 * K)));
    return r;
  }
  static VF load(const int8_t* p, size_t vl) { return Int8Traits::load(p, vl); }
};
// The fp8 cache placed, not rebiased (vec.h, e4m3_placed).
struct E4m3Placed {
  using Elem = uint8_t;
  static VF load(const Elem* p, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = e4m3_placed(p[i]);
    return r;
  }
};
template <DType T>
struct KvWords<T, KvKind::Fp8> : WidenedOnFetch<E4m3Placed> {
  static constexpr int kCols = 4;
  template <int K>
  static VF col(const VWord& w, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = e4m3_placed(static_cast<uint8_t>(w.v[i] >> (8 * K)));
    return r;
  }
  static VF load(const uint8_t* p, size_t vl) { return E4m3Placed::load(p, vl); }
  static VF gather(const uint8_t* base, const VIdx& off, size_t vl) {
    VF r{};
    for (size_t i = 0; i < vl; ++i) r.v[i] = e4m3_placed(base[off.v[i]]);
    return r;
  }
};
template <DType T>
struct KvWords<T, KvKind::Float> : WidenedOnFetch<Traits<T>> {
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

}  // namespace vec
}  // namespace RVV_ATTN_NS
