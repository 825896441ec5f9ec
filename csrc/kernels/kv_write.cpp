// decode_set_kv_buffer: scatter this step's K/V rows into the token pool;
// the int8 and fp8 caches' quantizing writes and the scan of the dynamic
// scales that int8 attention is about to read.
#include <cstring>
#include <limits>

#include "kernels/kernel_api.h"
#include "kernels/variant.h"
#include "kernels/vec.h"

namespace RVV_ATTN_NS {
namespace {

using rvv_attn::DType;

// Copies ``n`` elements of ``Bytes`` bytes each. The RVV build moves them with
// unit-stride vector loads/stores of the element width; the portable build
// with memcpy. Only the bit pattern is copied, so one routine serves
// float32, bfloat16 and float16.
template <int Bytes>
inline void copy_row(void* dst, const void* src, int64_t n) {
#if RVV_ATTN_HAS_RVV
  if constexpr (Bytes == 1) {
    auto* d = static_cast<int8_t*>(dst);
    const auto* s = static_cast<const int8_t*>(src);
    for (size_t vl; n > 0; n -= vl, s += vl, d += vl) {
      vl = __riscv_vsetvl_e8m8(static_cast<size_t>(n));
      __riscv_vse8_v_i8m8(d, __riscv_vle8_v_i8m8(s, vl), vl);
    }
  } else if constexpr (Bytes == 4) {
    auto* d = static_cast<uint32_t*>(dst);
    const auto* s = static_cast<const uint32_t*>(src);
    for (size_t vl; n > 0; n -= vl, s += vl, d += vl) {
      vl = __riscv_vsetvl_e32m8(static_cast<size_t>(n));
      __riscv_vse32_v_u32m8(d, __riscv_vle32_v_u32m8(s, vl), vl);
    }
  } else {
    static_assert(Bytes == 2, "kv rows are 1-, 2- or 4-byte elements");
    auto* d = static_cast<uint16_t*>(dst);
    const auto* s = static_cast<const uint16_t*>(src);
    for (size_t vl; n > 0; n -= vl, s += vl, d += vl) {
      vl = __riscv_vsetvl_e16m8(static_cast<size_t>(n));
      __riscv_vse16_v_u16m8(d, __riscv_vle16_v_u16m8(s, vl), vl);
    }
  }
#else
  std::memcpy(dst, src, static_cast<size_t>(n) * Bytes);
#endif
}

template <int Bytes>
void write_kv_typed(const rvv_attn::KvWriteParams& p, const rvv_attn::ThreadPool& pool) {
  struct Ctx {
    const rvv_attn::KvWriteParams* p;
  } ctx{&p};
  // One work item per (entry, kv head): the binding hands over distinct
  // slots (each slot's last entry), so no two items write the same row and
  // the result does not depend on which thread runs which item.
  auto body = [](void* c, int64_t begin, int64_t end) {
    const auto& q = *static_cast<Ctx*>(c)->p;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = i / q.heads_kv, h = i % q.heads_kv;
      const int64_t slot = q.loc[e], b = q.rows != nullptr ? q.rows[e] : e;
      copy_row<Bytes>(static_cast<char*>(q.k_buffer) + (slot * q.k_buffer_stride_t + h * q.k_buffer_stride_h) * Bytes,
                      static_cast<const char*>(q.key) + (b * q.key_stride_b + h * q.key_stride_h) * Bytes, q.head_dim);
      if (q.value == nullptr) continue;  // an MLA cache: V lives in the K row just written
      copy_row<Bytes>(static_cast<char*>(q.v_buffer) + (slot * q.v_buffer_stride_t + h * q.v_buffer_stride_h) * Bytes,
                      static_cast<const char*>(q.value) + (b * q.value_stride_b + h * q.value_stride_h) * Bytes,
                      q.head_dim_v);
    }
  };
  pool.run(p.batch * p.heads_kv, &ctx, body);
}

// ---- int8 KV cache ----------------------------------------------------------

// One cache row: dst[0:n] = quantized src[0:n]. ``scale`` > 0 is the static
// scale; NaN asks for the row's dynamic scale max|x| / 127 (float32), which
// becomes 1.0 when it is 0 (an all-zero row, or magnitudes below ~1e-43),
// and is stored in *scale_out.
template <DType T>
void quantize_row(int8_t* dst, float* scale_out, const typename vec::Traits<T>::Elem* src, int64_t n, float scale) {
  using Tr = vec::Traits<T>;
  if (scale != scale) {
    float amax = 0.0f;
    for (int64_t c = 0; c < n;) {
      const size_t vl = vec::setvl(static_cast<size_t>(n - c));
      const float m = vec::reduce_max(vec::abs(Tr::load(src + c, vl), vl), vl);
      amax = m > amax ? m : amax;
      c += static_cast<int64_t>(vl);
    }
    scale = amax / 127.0f;
    if (!(scale > 0.0f)) scale = 1.0f;
    *scale_out = scale;
  }
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    vec::store_i8(dst + c, vec::div(Tr::load(src + c, vl), scale, vl), vl);
    c += static_cast<int64_t>(vl);
  }
}

// T: the dtype of key/value; kCopy: they are int8 already.
template <DType T, bool kCopy>
void write_kv_int8_typed(const rvv_attn::KvQuantWriteParams& p, const rvv_attn::ThreadPool& pool) {
  struct Ctx {
    const rvv_attn::KvQuantWriteParams* p;
  } ctx{&p};
  // One work item per (entry, kv head); slots are distinct (each slot's last
  // entry), so a slot's codes and dynamic scale come from one row.
  auto body = [](void* c, int64_t begin, int64_t end) {
    const auto& q = *static_cast<Ctx*>(c)->p;
    const rvv_attn::KvWriteParams& kv = q.kv;
    using Elem = typename vec::Traits<T>::Elem;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = i / kv.heads_kv, h = i % kv.heads_kv;
      const int64_t slot = kv.loc[e], row = kv.rows != nullptr ? kv.rows[e] : e;
      int8_t* kd = static_cast<int8_t*>(kv.k_buffer) + slot * kv.k_buffer_stride_t + h * kv.k_buffer_stride_h;
      int8_t* vd = static_cast<int8_t*>(kv.v_buffer) + slot * kv.v_buffer_stride_t + h * kv.v_buffer_stride_h;
      const int64_t ks = row * kv.key_stride_b + h * kv.key_stride_h;
      const int64_t vs = row * kv.value_stride_b + h * kv.value_stride_h;
      if constexpr (kCopy) {
        copy_row<1>(kd, static_cast<const int8_t*>(kv.key) + ks, kv.head_dim);
        copy_row<1>(vd, static_cast<const int8_t*>(kv.value) + vs, kv.head_dim_v);
      } else {
        quantize_row<T>(kd, q.scales.k_scale_buf + slot * q.scales.k_scale_stride_t + h * q.scales.k_scale_stride_h,
                        static_cast<const Elem*>(kv.key) + ks, kv.head_dim, q.scales.k_scale);
        quantize_row<T>(vd, q.scales.v_scale_buf + slot * q.scales.v_scale_stride_t + h * q.scales.v_scale_stride_h,
                        static_cast<const Elem*>(kv.value) + vs, kv.head_dim_v, q.scales.v_scale);
      }
    }
  };
  pool.run(p.kv.batch * p.kv.heads_kv, &ctx, body);
}

}  // namespace

// The RVV build checks a vector of entries per step: one gather per head,
// the heads' verdicts OR-ed into one mask, one vfirst. Usable means
// 0 < s <= FLT_MAX, which NaN fails by comparing false.
int64_t first_unusable_scale(const rvv_attn::ScaleScanParams& p) {
  const char* entries = static_cast<const char*>(p.slots);
  const size_t entry_bytes = p.slots_int64 ? sizeof(int64_t) : sizeof(int32_t);
  const int64_t row_bytes = p.stride_t * static_cast<int64_t>(sizeof(float));
  constexpr float kMax = std::numeric_limits<float>::max();
  for (int64_t done = 0; done < p.count;) {
    const size_t vl = vec::setvl(static_cast<size_t>(p.count - done));
    const vec::VIdx off = vec::row_offsets(entries + done * entry_bytes, p.slots_int64, row_bytes, 0, vl);
#if RVV_ATTN_HAS_RVV
    vec::VMask bad = __riscv_vmclr_m_b8(vl);
    for (int64_t h = 0; h < p.heads; ++h) {
      const vec::VF s = vec::Traits<DType::Float32>::gather(p.scale_buf + h * p.stride_h, off, vl);
      const vec::VMask ok =
          __riscv_vmand_mm_b8(__riscv_vmfgt_vf_f32m4_b8(s, 0.0f, vl), __riscv_vmfle_vf_f32m4_b8(s, kMax, vl), vl);
      bad = __riscv_vmorn_mm_b8(bad, ok, vl);
    }
    const long first = __riscv_vfirst_m_b8(bad, vl);
    if (first >= 0) return done + first;
#else
    for (size_t i = 0; i < vl; ++i) {
      const float* row = reinterpret_cast<const float*>(reinterpret_cast<const char*>(p.scale_buf) + off.v[i]);
      for (int64_t h = 0; h < p.heads; ++h) {
        const float s = row[h * p.stride_h];
        if (!(s > 0.0f && s <= kMax)) return done + static_cast<int64_t>(i);
      }
    }
#endif
    done += static_cast<int64_t>(vl);
  }
  return p.count;
}

namespace {
template <DType T>
int64_t first_non_finite_typed(const rvv_attn::FiniteScanParams& p) {
  using Elem = typename vec::Traits<T>::Elem;
  const Elem* data = static_cast<const Elem*>(p.data);
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t row = p.rows != nullptr ? p.rows[i] : i;
    for (int64_t h = 0; h < p.heads; ++h) {
      const Elem* x = data + row * p.stride_t + h * p.stride_h;
      for (int64_t d = 0; d < p.dim;) {
        const size_t vl = vec::setvl(static_cast<size_t>(p.dim - d));
        const int64_t lane = vec::first_non_finite(vec::Traits<T>::load(x + d, vl), vl);
        if (lane >= 0) return (i * p.heads + h) * p.dim + d + lane;
        d += static_cast<int64_t>(vl);
      }
    }
  }
  return -1;
}
}  // namespace

// The widened values (exact for every dtype, inf and NaN included), a
// vector at a time.
int64_t first_non_finite(const rvv_attn::FiniteScanParams& p) {
  switch (p.dtype) {
    case DType::Float32: return first_non_finite_typed<DType::Float32>(p);
    case DType::BFloat16: return first_non_finite_typed<DType::BFloat16>(p);
    case DType::Float16: return first_non_finite_typed<DType::Float16>(p);
    default: return -1;  // not a float dtype: nothing to check
  }
}

void write_kv_int8(const rvv_attn::KvQuantWriteParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.kv.batch == 0 || p.kv.heads_kv == 0) return;
  if (p.src_int8) {
    write_kv_int8_typed<DType::Float32, true>(p, pool);
    return;
  }
  switch (p.kv.dtype) {
    case DType::Float32: write_kv_int8_typed<DType::Float32, false>(p, pool); break;
    case DType::BFloat16: write_kv_int8_typed<DType::BFloat16, false>(p, pool); break;
    case DType::Float16: write_kv_int8_typed<DType::Float16, false>(p, pool); break;
    case DType::Bytes: break;  // never quantized (the binding refuses it)
  }
}

void write_kv(const rvv_attn::KvWriteParams& p, const rvv_attn::ThreadPool& pool) {
  switch (rvv_attn::dtype_bytes(p.dtype)) {
    case 4: return write_kv_typed<4>(p, pool);
    case 2: return write_kv_typed<2>(p, pool);
    default: return write_kv_typed<1>(p, pool);
  }
}

}  // namespace RVV_ATTN_NS

// ---- float8_e4m3fn KV cache -------------------------------------------------

namespace RVV_ATTN_NS {
namespace {

template <DType T>
void write_kv_fp8_typed(const rvv_attn::Fp8KvWriteParams& p, const rvv_attn::ThreadPool& pool) {
  struct Ctx {
    const rvv_attn::Fp8KvWriteParams* p;
  } ctx{&p};
  // One work item per (entry, kv head), slots distinct, as in write_kv.
  auto body = [](void* c, int64_t begin, int64_t end) {
    const auto& q = *static_cast<Ctx*>(c)->p;
    const rvv_attn::KvWriteParams& kv = q.kv;
    using Elem = typename vec::Traits<T>::Elem;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = i / kv.heads_kv, h = i % kv.heads_kv;
      const int64_t slot = kv.loc[e], row = kv.rows != nullptr ? kv.rows[e] : e;
      vec::quantize_e4m3_row<T>(
          static_cast<uint8_t*>(kv.k_buffer) + slot * kv.k_buffer_stride_t + h * kv.k_buffer_stride_h,
          static_cast<const Elem*>(kv.key) + row * kv.key_stride_b + h * kv.key_stride_h, kv.head_dim, q.k_scale,
          q.saturate);
      if (kv.value == nullptr) continue;  // an MLA cache: V lives in the K row just written
      vec::quantize_e4m3_row<T>(
          static_cast<uint8_t*>(kv.v_buffer) + slot * kv.v_buffer_stride_t + h * kv.v_buffer_stride_h,
          static_cast<const Elem*>(kv.value) + row * kv.value_stride_b + h * kv.value_stride_h, kv.head_dim_v,
          q.v_scale, q.saturate);
    }
  };
  pool.run(p.kv.batch * p.kv.heads_kv, &ctx, body);
}

}  // namespace

void write_kv_fp8(const rvv_attn::Fp8KvWriteParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.kv.batch == 0 || p.kv.heads_kv == 0) return;
  switch (p.kv.dtype) {
    case DType::Float32: return write_kv_fp8_typed<DType::Float32>(p, pool);
    case DType::BFloat16: return write_kv_fp8_typed<DType::BFloat16>(p, pool);
    case DType::Float16: return write_kv_fp8_typed<DType::Float16>(p, pool);
    case DType::Bytes: return;  // never quantized (the binding refuses it)
  }
}

}  // namespace RVV_ATTN_NS
