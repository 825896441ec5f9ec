// The exported table of this variant's kernels; dispatch/dispatch.cpp
// collects one per compiled variant.
#include "kernels/kernel_api.h"
#include "kernels/variant.h"
#include "kernels/vec.h"

#define RVV_ATTN_STR2(x) #x
#define RVV_ATTN_STR(x) RVV_ATTN_STR2(x)

namespace RVV_ATTN_NS {

void write_kv(const rvv_attn::KvWriteParams&, const rvv_attn::ThreadPool&);
bool decode_attention(const rvv_attn::DecodeParams&, const rvv_attn::ThreadPool&);
rvv_attn::ExtendBlocking extend_blocking();
int64_t extend_arena_bytes(int64_t head_dim, int64_t head_dim_v);
void extend_attention(const rvv_attn::ExtendParams&, const rvv_attn::ThreadPool&);
void write_kv_int8(const rvv_attn::KvQuantWriteParams&, const rvv_attn::ThreadPool&);
int64_t first_unusable_scale(const rvv_attn::ScaleScanParams&);
int64_t first_non_finite(const rvv_attn::FiniteScanParams&);
void fp8_dequantize(const rvv_attn::Fp8ConvertParams&, const rvv_attn::ThreadPool&);
void fp8_quantize(const rvv_attn::Fp8ConvertParams&, const rvv_attn::ThreadPool&);
void write_kv_fp8(const rvv_attn::Fp8KvWriteParams&, const rvv_attn::ThreadPool&);

const rvv_attn::KernelTable& kernel_table() {
  static const rvv_attn::KernelTable table{
      RVV_ATTN_STR(RVV_ATTN_VARIANT),
      RVV_ATTN_VLEN,
      &write_kv,
      &decode_attention,
      &extend_blocking,
      &extend_arena_bytes,
      &extend_attention,
      &write_kv_int8,
      &first_unusable_scale,
      &first_non_finite,
      &fp8_dequantize,
      &fp8_quantize,
      &write_kv_fp8,
      static_cast<int64_t>(vec::kBlockN),
  };
  return table;
}

}  // namespace RVV_ATTN_NS
