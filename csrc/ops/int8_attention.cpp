// decode_attention_int8_cpu and extend_attention_int8_cpu: the float
// operators' arguments plus the int8 KV cache's scales (see ops/int8_kv.h
// for the two scale modes). The bodies are the float operators' (see
// ops/attention.h), so every check of the float operators applies too;
// everything is checked before the first write.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "ops/attention.h"
#include "ops/int8_kv.h"

namespace rvv_attn {
namespace {

void decode_attention_int8_cpu(const at::Tensor& query, at::Tensor& k_buffer, at::Tensor& v_buffer,
                               at::Tensor& output, const std::optional<at::Tensor>& key,
                               const std::optional<at::Tensor>& value,
                               const at::Tensor& loc, at::Tensor& attn_logits, const at::Tensor& req_to_token,
                               const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double sm_scale,
                               double logit_cap, at::Tensor& k_scale_buf, at::Tensor& v_scale_buf, double k_scale,
                               double v_scale, bool is_cross_attn, int64_t sliding_window_size,
                               const std::optional<at::Tensor>& encoder_lens, const std::optional<at::Tensor>& sinks) {
  const ops::Int8KvArgs int8{k_scale_buf, v_scale_buf, k_scale, v_scale};
  ops::decode_attention("rvv_attn.decode_attention_int8_cpu", &int8, query, k_buffer, v_buffer, output, key, value,
                        loc, attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

void extend_attention_int8_cpu(const at::Tensor& q_extend, const std::optional<at::Tensor>& k_extend,
                               const std::optional<at::Tensor>& v_extend,
                               // Unlike the float operator, this one writes the new tokens into the cache.
                               at::Tensor& o_extend, at::Tensor& k_buffer, at::Tensor& v_buffer,
                               const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                               const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                               const at::Tensor& extend_start_loc, int64_t max_len_extend, double sm_scale,
                               double logit_cap, at::Tensor& k_scale_buf, at::Tensor& v_scale_buf, double k_scale,
                               double v_scale, bool is_cross_attn, int64_t sliding_window_size,
                               const std::optional<at::Tensor>& encoder_lens, const std::optional<at::Tensor>& sinks) {
  const ops::Int8KvArgs int8{k_scale_buf, v_scale_buf, k_scale, v_scale};
  ops::extend_attention("rvv_attn.extend_attention_int8_cpu", &int8, q_extend, k_extend, v_extend, o_extend,
                        k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                        extend_start_loc, max_len_extend, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def(
      "decode_attention_int8_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor(c!) output, "
      "Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
      "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
      "Tensor(e!) k_scale_buf, Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_OPTION_ARGS
      ") -> ()");
  m.def(
      "extend_attention_int8_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
      "Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
      "Tensor(e!) k_scale_buf, Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_OPTION_ARGS
      ") -> ()");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("decode_attention_int8_cpu", &rvv_attn::decode_attention_int8_cpu);
  m.impl("extend_attention_int8_cpu", &rvv_attn::extend_attention_int8_cpu);
}
