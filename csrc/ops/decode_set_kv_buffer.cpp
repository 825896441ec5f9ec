// decode_set_kv_buffer: k_buffer[loc[b]] = key[b], v_buffer[loc[b]] =
// value[b], the KV write of decode_attention_cpu as an operator of its own.
// Into an fp8 cache (float8_e4m3fn) float rows are quantized as SGLang's
// pool does without a scale (torch's conversion, bit for bit).
// Every check (ops/kv_write.h) runs before the first write.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "ops/attention.h"
#include "ops/checks.h"
#include "ops/entry_points.h"
#include "ops/kv_write.h"
#include "ops/overlap.h"

namespace rvv_attn {
namespace {

constexpr char kSetKvBufferName[] = "rvv_attn.decode_set_kv_buffer";

}  // namespace

void ops::decode_set_kv_buffer(const char* op, at::Tensor& k_buffer, at::Tensor& v_buffer, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& loc) {
  const bool fp8 = k_buffer.scalar_type() == at::kFloat8_e4m3fn;
  if (fp8) checks::same_dtype(op, "v_buffer", v_buffer, "k_buffer", k_buffer);
  const PreparedKvWrite prepared = prepare_kv_write(op, k_buffer, v_buffer, key, value, loc, false, fp8);
  overlap::check_writes(op, {{"k_buffer", &k_buffer}, {"v_buffer", &v_buffer}},
                        {{"key", &key}, {"value", &value}, {"loc", &loc}});
  if (fp8) {
    run_fp8_write(Fp8Setup{1.0f, 1.0f}, prepared.params);
  } else {
    run_kv_write(prepared);
  }
}

}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def("decode_set_kv_buffer(Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor key, Tensor value, Tensor loc) -> ()");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("decode_set_kv_buffer", &rvv_attn::entry::decode_set_kv_buffer<rvv_attn::kSetKvBufferName>);
}
