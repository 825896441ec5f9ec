// The attention operators' bodies, shared by the float operators and their
// int8 and fp8 KV-cache twins (csrc/ops/int8_attention.cpp,
// csrc/ops/fp8_attention.cpp). ``int8`` and ``fp8`` are null for the float
// operators; otherwise (one of them) k_buffer/v_buffer are int8 or fp8 and
// the call uses the scale arguments (see ops/int8_kv.h, ops/fp8_kv.h). ``options`` are SGLang
// main's trailing arguments (see ops/attention_options.h). ``op`` prefixes
// every error.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "kernels/kernel_api.h"
#include "ops/attention_options.h"
#include "ops/fp8_kv.h"
#include "ops/int8_kv.h"

namespace rvv_attn::ops {

void decode_attention(const char* op, const Int8KvArgs* int8, const Fp8KvArgs* fp8, const at::Tensor& query,
                      at::Tensor& k_buffer, at::Tensor& v_buffer, at::Tensor& output,
                      const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
                      const at::Tensor& loc, at::Tensor& attn_logits, const at::Tensor& req_to_token,
                      const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double sm_scale, double logit_cap,
                      const AttentionOptions& options);

// k_extend/v_extend may be None only with options.is_cross_attn (they are
// not read then).
void extend_attention(const char* op, const Int8KvArgs* int8, const Fp8KvArgs* fp8, const at::Tensor& q_extend,
                      const std::optional<at::Tensor>& k_extend, const std::optional<at::Tensor>& v_extend,
                      at::Tensor& o_extend, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                      const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                      const at::Tensor& extend_seq_lens, const at::Tensor& extend_start_loc, int64_t max_len_extend,
                      double sm_scale, double logit_cap, const AttentionOptions& options);

// Builds the query-block work list and the per-worker arena for ``p``
// (everything else filled in and checked), then runs the extend kernel.
void run_extend_kernel(ExtendParams& p);

// flash_attn_varlen_func's body (csrc/ops/flash_attn_varlen.cpp).
at::Tensor flash_attn_varlen(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, bool causal);

// decode_set_kv_buffer's body (csrc/ops/decode_set_kv_buffer.cpp).
void decode_set_kv_buffer(const char* op, at::Tensor& k_buffer, at::Tensor& v_buffer, const at::Tensor& key,
                          const at::Tensor& value, const at::Tensor& loc);

// store_cache_cpu's body (csrc/ops/store_cache.cpp), shared with its
// sgl_kernel name.
void store_cache(const char* op, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                 const at::Tensor& indices, std::optional<int64_t> row_dim);

}  // namespace rvv_attn::ops
