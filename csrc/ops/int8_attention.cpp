// decode_attention_int8_cpu and extend_attention_int8_cpu: the float
// operators' arguments plus the int8 KV cache's scales (see ops/int8_kv.h
// for the two scale modes). The bodies are the float operators' (see
// ops/attention.h), so every check of the float operators applies too;
// everything is checked before the first write.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "ops/attention_options.h"
#include "ops/entry_points.h"

namespace rvv_attn {
namespace {

constexpr char kDecodeInt8Name[] = "rvv_attn.decode_attention_int8_cpu";
constexpr char kExtendInt8Name[] = "rvv_attn.extend_attention_int8_cpu";

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def(
      "decode_attention_int8_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor(c!) output, "
      "Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
      "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
      "Tensor(e!) k_scale_buf, Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_OPTION_ARGS ") -> ()");
  m.def(
      "extend_attention_int8_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
      "Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
      "Tensor(e!) k_scale_buf, Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_EXTEND_OPTION_ARGS
      ") -> ()");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("decode_attention_int8_cpu", &rvv_attn::entry::decode_attention_int8_cpu<rvv_attn::kDecodeInt8Name>);
  m.impl("extend_attention_int8_cpu", &rvv_attn::entry::extend_attention_int8_cpu<rvv_attn::kExtendInt8Name>);
}
