// The operators' C++ entry points, one template per operator over the name
// its errors carry: torch.ops.rvv_attn registers them as "rvv_attn.<op>",
// rvv_attn.sglang as "sgl_kernel.<op>" (csrc/ops/sglang_names.cpp). The
// signatures are the schemas' argument lists.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ops/attention.h"
#include "ops/attention_options.h"
#include "ops/fp8_kv.h"
#include "ops/int8_kv.h"

namespace rvv_attn::entry {

using OptTensor = std::optional<at::Tensor>;

template <const char* Op>
void decode_attention_cpu(const at::Tensor& query, at::Tensor& k_buffer, at::Tensor& v_buffer, at::Tensor& output,
                          const OptTensor& key, const OptTensor& value, const at::Tensor& loc, at::Tensor& attn_logits,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, double sm_scale, double logit_cap, bool is_cross_attn,
                          int64_t sliding_window_size, const OptTensor& encoder_lens, const OptTensor& sinks) {
  ops::decode_attention(Op, nullptr, nullptr, query, k_buffer, v_buffer, output, key, value, loc, attn_logits,
                        req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

template <const char* Op>
void extend_attention_cpu(const at::Tensor& q_extend, const OptTensor& k_extend, const OptTensor& v_extend,
                          at::Tensor& o_extend, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                          const at::Tensor& extend_start_loc, int64_t max_len_extend, double sm_scale, double logit_cap,
                          bool is_cross_attn, int64_t sliding_window_size, const OptTensor& encoder_lens,
                          const OptTensor& sinks, const OptTensor& tree_mask, bool is_causal) {
  ops::extend_attention(Op, nullptr, nullptr, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token,
                        req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend, sm_scale,
                        logit_cap, {is_cross_attn, sliding_window_size, encoder_lens, sinks, tree_mask, is_causal});
}

template <const char* Op>
void decode_attention_int8_cpu(const at::Tensor& query, at::Tensor& k_buffer, at::Tensor& v_buffer, at::Tensor& output,
                               const OptTensor& key, const OptTensor& value, const at::Tensor& loc,
                               at::Tensor& attn_logits, const at::Tensor& req_to_token,
                               const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double sm_scale,
                               double logit_cap, at::Tensor& k_scale_buf, at::Tensor& v_scale_buf, double k_scale,
                               double v_scale, bool is_cross_attn, int64_t sliding_window_size,
                               const OptTensor& encoder_lens, const OptTensor& sinks) {
  const ops::Int8KvArgs int8{k_scale_buf, v_scale_buf, k_scale, v_scale};
  ops::decode_attention(Op, &int8, nullptr, query, k_buffer, v_buffer, output, key, value, loc, attn_logits,
                        req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

// Unlike the float operator, this one writes the new tokens into the cache.
template <const char* Op>
void extend_attention_int8_cpu(const at::Tensor& q_extend, const OptTensor& k_extend, const OptTensor& v_extend,
                               at::Tensor& o_extend, at::Tensor& k_buffer, at::Tensor& v_buffer,
                               const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                               const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                               const at::Tensor& extend_start_loc, int64_t max_len_extend, double sm_scale,
                               double logit_cap, at::Tensor& k_scale_buf, at::Tensor& v_scale_buf, double k_scale,
                               double v_scale, bool is_cross_attn, int64_t sliding_window_size,
                               const OptTensor& encoder_lens, const OptTensor& sinks, const OptTensor& tree_mask,
                               bool is_causal) {
  const ops::Int8KvArgs int8{k_scale_buf, v_scale_buf, k_scale, v_scale};
  ops::extend_attention(Op, &int8, nullptr, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token,
                        req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend, sm_scale,
                        logit_cap, {is_cross_attn, sliding_window_size, encoder_lens, sinks, tree_mask, is_causal});
}

template <const char* Op>
void decode_attention_fp8_cpu(const at::Tensor& query, at::Tensor& k_buffer, at::Tensor& v_buffer, at::Tensor& output,
                              const OptTensor& key, const OptTensor& value, const at::Tensor& loc,
                              at::Tensor& attn_logits, const at::Tensor& req_to_token,
                              const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double sm_scale,
                              double logit_cap, double k_scale, double v_scale, bool is_cross_attn,
                              int64_t sliding_window_size, const OptTensor& encoder_lens, const OptTensor& sinks) {
  const ops::Fp8KvArgs fp8{k_scale, v_scale};
  ops::decode_attention(Op, nullptr, &fp8, query, k_buffer, v_buffer, output, key, value, loc, attn_logits,
                        req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

// Reads the cache only, as the float operator: SGLang's fp8 pool has
// written the new tokens before the call.
template <const char* Op>
void extend_attention_fp8_cpu(const at::Tensor& q_extend, const OptTensor& k_extend, const OptTensor& v_extend,
                              at::Tensor& o_extend, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                              const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                              const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                              const at::Tensor& extend_start_loc, int64_t max_len_extend, double sm_scale,
                              double logit_cap, double k_scale, double v_scale, bool is_cross_attn,
                              int64_t sliding_window_size, const OptTensor& encoder_lens, const OptTensor& sinks,
                              const OptTensor& tree_mask, bool is_causal) {
  const ops::Fp8KvArgs fp8{k_scale, v_scale};
  ops::extend_attention(Op, nullptr, &fp8, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token,
                        req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend, sm_scale,
                        logit_cap, {is_cross_attn, sliding_window_size, encoder_lens, sinks, tree_mask, is_causal});
}

// SGLang 0.5.23's scales, given for every cache: an fp8 cache's (as
// Fp8KvArgs), or, for a float cache, checked and not used.
inline std::optional<ops::Fp8KvArgs> sglang_kv_scales(const char* op, const at::Tensor& k_buffer, double key_scale,
                                                      double value_scale, bool new_tokens_scaled) {
  if (ops::is_fp8_cache(k_buffer)) {
    return ops::Fp8KvArgs{key_scale, value_scale, "key_scale", "value_scale", new_tokens_scaled};
  }
  ops::checked_fp8_scale(op, "key_scale", key_scale);
  ops::checked_fp8_scale(op, "value_scale", value_scale);
  return std::nullopt;
}

// SGLang 0.5.23's forms (the sgl_kernel overloads ``.kv_scales``): the
// cache's scales come right after v_buffer as Python floats, for every
// cache (SGLang passes the layer's k_scale_float, or 1.0, whatever the
// cache; a float cache holds its values as they are: sglang_kv_scales).
template <const char* Op>
void decode_attention_cpu_kv_scales(const at::Tensor& query, at::Tensor& k_buffer, at::Tensor& v_buffer,
                                    double key_scale, double value_scale, at::Tensor& output, const OptTensor& key,
                                    const OptTensor& value, const at::Tensor& loc, at::Tensor& attn_logits,
                                    const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                    const at::Tensor& seq_lens, double sm_scale, double logit_cap, bool is_cross_attn,
                                    int64_t sliding_window_size, const OptTensor& encoder_lens,
                                    const OptTensor& sinks) {
  const std::optional<ops::Fp8KvArgs> fp8 = sglang_kv_scales(Op, k_buffer, key_scale, value_scale, false);
  ops::decode_attention(Op, nullptr, fp8 ? &*fp8 : nullptr, query, k_buffer, v_buffer, output, key, value, loc,
                        attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks});
}

// With an fp8 cache the new tokens are taken in the cache's units (SGLang
// 0.5.23's backend has divided them by the scales in place, writing the
// cache): the scales apply to them as to the prefix.
template <const char* Op>
void extend_attention_cpu_kv_scales(const at::Tensor& q_extend, const OptTensor& k_extend, const OptTensor& v_extend,
                                    at::Tensor& o_extend, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                                    double key_scale, double value_scale, const at::Tensor& req_to_token,
                                    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                    const at::Tensor& extend_seq_lens, const at::Tensor& extend_start_loc,
                                    int64_t max_len_extend, double sm_scale, double logit_cap, bool is_cross_attn,
                                    int64_t sliding_window_size, const OptTensor& encoder_lens, const OptTensor& sinks,
                                    const OptTensor& tree_mask, bool is_causal) {
  const std::optional<ops::Fp8KvArgs> fp8 = sglang_kv_scales(Op, k_buffer, key_scale, value_scale, true);
  ops::extend_attention(Op, nullptr, fp8 ? &*fp8 : nullptr, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer,
                        req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend,
                        sm_scale, logit_cap,
                        {is_cross_attn, sliding_window_size, encoder_lens, sinks, tree_mask, is_causal});
}

template <const char* Op>
at::Tensor flash_attn_varlen_func(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, bool causal) {
  return ops::flash_attn_varlen(Op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal);
}

template <const char* Op>
void decode_set_kv_buffer(at::Tensor& k_buffer, at::Tensor& v_buffer, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& loc) {
  ops::decode_set_kv_buffer(Op, k_buffer, v_buffer, key, value, loc);
}

template <const char* Op>
void store_cache_cpu(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                     const at::Tensor& indices, std::optional<int64_t> row_dim) {
  ops::store_cache(Op, k, v, k_cache, v_cache, indices, row_dim);
}

}  // namespace rvv_attn::entry
