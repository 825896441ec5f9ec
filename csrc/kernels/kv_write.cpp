// decode_set_kv_buffer: scatter this step's K/V rows into the token pool.
#include <cstring>

#include "kernel_api.h"
#include "variant.h"

namespace RVV_ATTN_NS {
namespace {

// Copies ``n`` elements of ``Bytes`` bytes each. The RVV build moves them with
// unit-stride vector loads/stores of the element width; the portable build
// with memcpy. Only the bit pattern is copied, so one routine serves
// float32, bfloat16 and float16.
template <int Bytes>
inline void copy_row(void* dst, const void* src, int64_t n) {
#if RVV_ATTN_HAS_RVV
  if constexpr (Bytes == 4) {
    auto* d = static_cast<uint32_t*>(dst);
    const auto* s = static_cast<const uint32_t*>(src);
    for (size_t vl; n > 0; n -= vl, s += vl, d += vl) {
      vl = __riscv_vsetvl_e32m8(static_cast<size_t>(n));
      __riscv_vse32_v_u32m8(d, __riscv_vle32_v_u32m8(s, vl), vl);
    }
  } else {
    static_assert(Bytes == 2, "kv rows are 2- or 4-byte elements");
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
  // One work item per (token, kv head): rows are independent and slots are
  // distinct (checked by the binding), so no two items write the same row.
  auto body = [](void* c, int64_t begin, int64_t end) {
    const auto& q = *static_cast<Ctx*>(c)->p;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / q.heads_kv, h = i % q.heads_kv;
      const int64_t slot = q.loc[b];
      copy_row<Bytes>(static_cast<char*>(q.k_buffer) + (slot * q.k_buffer_stride_t + h * q.k_buffer_stride_h) * Bytes,
                      static_cast<const char*>(q.key) + (b * q.key_stride_b + h * q.key_stride_h) * Bytes,
                      q.head_dim);
      copy_row<Bytes>(static_cast<char*>(q.v_buffer) + (slot * q.v_buffer_stride_t + h * q.v_buffer_stride_h) * Bytes,
                      static_cast<const char*>(q.value) + (b * q.value_stride_b + h * q.value_stride_h) * Bytes,
                      q.head_dim_v);
    }
  };
  pool.run(p.batch * p.heads_kv, &ctx, body);
}

}  // namespace

void write_kv(const rvv_attn::KvWriteParams& p, const rvv_attn::ThreadPool& pool) {
  if (rvv_attn::dtype_bytes(p.dtype) == 4) {
    write_kv_typed<4>(p, pool);
  } else {
    write_kv_typed<2>(p, pool);
  }
}

}  // namespace RVV_ATTN_NS
