// decode_attention_cpu: schema (argument order as SGLang's CPU kernel),
// validation, the KV write, then the attention kernel.
//
// Every check runs before the KV write, so a rejected call leaves the cache,
// output and attn_logits untouched. The whole KV write (in batch order, the
// last entry for a repeated slot winning) ends before attention reads the
// cache.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernel_api.h"
#include "ops/attention.h"
#include "ops/attention_options.h"
#include "ops/checks.h"
#include "ops/entry_points.h"
#include "ops/int8_kv.h"
#include "ops/kv_write.h"
#include "ops/overlap.h"
#include "ops/runtime.h"
#include "ops/token_map.h"

namespace rvv_attn {
namespace ops {
namespace {

// The call writes output, attn_logits, the cache rows at loc (unless key is
// None) and, for float rows into a dynamic-scale int8 cache, the scale
// buffers; none of them may overlap anything else the call touches.
// (Overlapping reads are harmless: k_scale_buf may be v_scale_buf when
// neither is written.)
void check_decode_overlap(const char* op, const Int8Setup* q8, const CheckedOptions& opts, bool writes, bool mla,
                          bool new_int8, const at::Tensor& query, const at::Tensor& k_buffer,
                          const at::Tensor& v_buffer, const at::Tensor& output, const at::Tensor& key,
                          const at::Tensor& value, const at::Tensor& loc, const at::Tensor& attn_logits,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens) {
  const bool k_scales_written = writes && q8 && q8->k_dyn && !new_int8;
  const bool v_scales_written = writes && q8 && q8->v_dyn && !new_int8;
  const overlap::Arg k_scales{"k_scale_buf", q8 ? &q8->k_scale_buf : nullptr};
  const overlap::Arg v_scales{"v_scale_buf", q8 ? &q8->v_scale_buf : nullptr};
  std::vector<overlap::Arg> written = {{"output", &output}, {"attn_logits", &attn_logits}};
  std::vector<overlap::Arg> read = {{"query", &query},
                                    {"key", &key},
                                    {"value", &value},
                                    {"loc", &loc},
                                    {"req_to_token", &req_to_token},
                                    {"req_pool_indices", &req_pool_indices},
                                    {"seq_lens", &seq_lens},
                                    {"encoder_lens", &opts.encoder_lens},
                                    {"sinks", &opts.sinks}};
  (writes ? written : read).push_back({"k_buffer", &k_buffer});
  // An MLA cache's v_buffer is part of k_buffer (the write covers it).
  if (!mla) (writes ? written : read).push_back({"v_buffer", &v_buffer});
  if (q8) {
    (k_scales_written ? written : read).push_back(k_scales);
    (v_scales_written ? written : read).push_back(v_scales);
  }
  overlap::check_writes(op, written, read);
}

// SGLang's MLA pool hands v_buffer = k_buffer[..., :Dv]: one latent head,
// D = Dv + 64, the same data pointer, row stride and rows. Only that exact
// view is an MLA cache; any other overlap of the two is refused as before.
bool is_mla_view(const at::Tensor& k_buffer, const at::Tensor& v_buffer) {
  return k_buffer.size(1) == 1 && v_buffer.size(1) == 1 && k_buffer.data_ptr() == v_buffer.data_ptr() &&
         k_buffer.size(0) == v_buffer.size(0) && k_buffer.stride(0) == v_buffer.stride(0) &&
         k_buffer.scalar_type() == v_buffer.scalar_type() && k_buffer.size(2) == v_buffer.size(2) + 64 &&
         k_buffer.stride(2) == 1 && v_buffer.stride(2) == 1;
}

}  // namespace

void decode_attention(const char* op, const Int8KvArgs* int8, const Fp8KvArgs* fp8, const at::Tensor& query,
                      at::Tensor& k_buffer, at::Tensor& v_buffer, at::Tensor& output,
                      const std::optional<at::Tensor>& key_arg, const std::optional<at::Tensor>& value_arg,
                      const at::Tensor& loc, at::Tensor& attn_logits, const at::Tensor& req_to_token,
                      const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double sm_scale, double logit_cap,
                      const AttentionOptions& options) {
  using namespace checks;
  rank(op, "query", query, 3, "[B, H, D]");
  rank(op, "output", output, 3, "[B, H, Dv]");
  rank(op, "attn_logits", attn_logits, 4, "[B, H, num_kv_splits, Dv + 1]");
  rank(op, "k_buffer", k_buffer, 3, "[max_total_tokens, H_kv, D]");
  rank(op, "v_buffer", v_buffer, 3, "[max_total_tokens, H_kv, Dv]");
  // key/value None: nothing is written this step (SGLang's cross-attention
  // layers once the encoder's K/V are cached). Only both or neither.
  const bool writes = key_arg.has_value() && key_arg->defined();
  TORCH_CHECK(writes == (value_arg.has_value() && value_arg->defined()), op,
              ": key and value must both be given or both be None; got key ", writes ? "given" : "None", " and value ",
              writes ? "None" : "given");
  // An MLA cache's V is its K rows' first Dv columns: the key row written
  // holds it, and ``value`` is ignored (SGLang passes a view of key, or its
  // un-roped part).
  const bool mla = !int8 && is_mla_view(k_buffer, v_buffer);
  const at::Tensor key = writes ? *key_arg : at::Tensor();
  const at::Tensor value = !writes ? at::Tensor() : mla ? at::Tensor() : *value_arg;
  Int8Setup q8{};
  bool new_int8 = false;
  if (int8) {
    q8 = check_int8_args(op, *int8, k_buffer, v_buffer);
    if (writes) new_int8 = check_new_kv_dtype(op, "key", key, "value", value, "query", query);
  }
  // fp8: new rows are the query's float dtype, quantized as SGLang's pool does.
  const Fp8Setup f8 = fp8 ? check_fp8_args(op, *fp8, k_buffer, v_buffer) : Fp8Setup{};
  if (fp8 && writes) {
    same_dtype(op, "key", key, "query", query);
    if (!mla) same_dtype(op, "value", value, "query", query);
  }
  // Ranks, dtypes and sizes of the KV write's arguments, and every loc slot.
  ops::PreparedKvWrite kv_write{};
  if (writes && mla) {
    // The key row alone; checked as a KV write whose value is key[..., :Dv].
    rank(op, "key", key, 3, "[B, 1, D]");
    size_is(op, "key", key, 2, k_buffer.size(2), "k_buffer.size(2) (D)");
    kv_write = ops::prepare_kv_write(op, k_buffer, v_buffer, key, key.narrow(2, 0, v_buffer.size(2)), loc, false,
                                     fp8 != nullptr);
    kv_write.params.value = nullptr;
  } else if (writes) {
    kv_write = ops::prepare_kv_write(op, k_buffer, v_buffer, key, value, loc, int8 != nullptr, fp8 != nullptr);
  } else {
    rank(op, "loc", loc, 1, "[B]");
    if (!int8 && !fp8) {
      not_int8_cache(op, "k_buffer", k_buffer);
      not_int8_cache(op, "v_buffer", v_buffer);
      same_dtype(op, "v_buffer", v_buffer, "k_buffer", k_buffer);
    }
    size_is(op, "v_buffer", v_buffer, 1, k_buffer.size(1), "k_buffer.size(1) (H_kv)");
    dense_last_dim(op, "k_buffer", k_buffer);
    dense_last_dim(op, "v_buffer", v_buffer);
  }

  const DType dtype = float_dtype(op, "query", query);
  if (!int8 && !fp8) same_dtype(op, "k_buffer", k_buffer, "query", query);
  same_dtype(op, "output", output, "query", query);
  TORCH_CHECK(attn_logits.scalar_type() == at::kFloat, op, ": attn_logits must have dtype float32, got ",
              attn_logits.scalar_type());

  const int64_t batch = query.size(0), heads = query.size(1), head_dim = query.size(2);
  const int64_t heads_kv = k_buffer.size(1), head_dim_v = v_buffer.size(2);
  if (writes) size_is(op, "key", key, 0, batch, "query.size(0) (the batch)");
  size_is(op, "output", output, 0, batch, "query.size(0) (the batch)");
  size_is(op, "output", output, 1, heads, "query.size(1) (H)");
  size_is(op, "query", query, 2, k_buffer.size(2), "k_buffer.size(2) (D)");
  size_is(op, "output", output, 2, head_dim_v, "v_buffer.size(2) (Dv)");
  TORCH_CHECK(heads_kv > 0, op, ": k_buffer.size(1) (H_kv) must be positive, got shape ", shape_of(k_buffer));
  TORCH_CHECK(heads % heads_kv == 0, op, ": query has H = ", heads, " heads, not a multiple of H_kv = ", heads_kv,
              " (k_buffer.size(1)); each KV head must serve the same number of query heads");
  size_is(op, "attn_logits", attn_logits, 0, batch, "query.size(0) (the batch)");
  size_is(op, "attn_logits", attn_logits, 1, heads, "query.size(1) (H)");
  TORCH_CHECK(attn_logits.size(2) >= 1, op, ": attn_logits.size(2) is the number of KV splits and must be >= 1, got ",
              shape_of(attn_logits));
  size_is(op, "attn_logits", attn_logits, 3, head_dim_v + 1, "Dv + 1 (partial output and its log-sum-exp)");
  dense_last_dim(op, "query", query);
  dense_last_dim(op, "output", output);
  dense_last_dim(op, "attn_logits", attn_logits);
  // Checked as the float the kernels use: 1e300 is finite only as a double.
  TORCH_CHECK(std::isfinite(static_cast<float>(sm_scale)), op, ": sm_scale must be finite, got ", sm_scale);
  checks::logit_cap(op, logit_cap);

  token_map::check_layout(op, req_to_token, req_pool_indices, "seq_lens", seq_lens, batch);
  const CheckedOptions opts = check_options(op, options, batch, heads, "query", query);
  // The map columns each sequence attends (encoder offset, window, cross
  // attention applied), then every entry in them.
  const KeyColumns columns =
      decode_key_columns(op, opts, seq_lens.to(at::kLong).contiguous(), req_to_token.size(1), writes ? 1 : 0,
                         "every sequence includes the token written at loc this step");
  const token_map::CheckedTokenMaps maps = token_map::check_ranges(
      op, req_to_token, req_pool_indices, columns.firsts, columns.lens, std::min(k_buffer.size(0), v_buffer.size(0)));

  if (int8) {
    if (writes && !new_int8) {
      check_finite_rows(op, "key", key, at::Tensor());
      check_finite_rows(op, "value", value, at::Tensor());
    }
    // Slots whose scale this call computes (float rows, dynamic mode) are
    // not read from the buffer; every other dynamic scale read is checked.
    std::vector<bool> fresh_k(static_cast<size_t>(k_buffer.size(0)), false);
    std::vector<bool> fresh_v(static_cast<size_t>(v_buffer.size(0)), false);
    if (writes && !new_int8) {
      // params lists each written slot once (its last entry).
      for (int64_t e = 0; e < kv_write.params.batch; ++e) {
        fresh_k[static_cast<size_t>(kv_write.params.loc[e])] = q8.k_dyn;
        fresh_v[static_cast<size_t>(kv_write.params.loc[e])] = q8.v_dyn;
      }
    }
    check_read_scales(op, q8, maps, fresh_k, fresh_v);
  }

  check_decode_overlap(op, int8 ? &q8 : nullptr, opts, writes, mla, new_int8, query, k_buffer, v_buffer, output, key,
                       value, loc, attn_logits, req_to_token, req_pool_indices, seq_lens);

  if (batch == 0) return;
  if (writes && int8) {
    run_int8_write(q8, kv_write.params, new_int8);
  } else if (writes && fp8) {
    run_fp8_write(f8, kv_write.params);
  } else if (writes) {
    ops::run_kv_write(kv_write);
  }
  if (heads == 0) return;

  DecodeParams p{};
  p.dtype = dtype;
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.num_splits = attn_logits.size(2);
  p.query = query.data_ptr();
  p.query_stride_b = query.stride(0);
  p.query_stride_h = query.stride(1);
  p.k_buffer = k_buffer.data_ptr();
  p.k_stride_t = k_buffer.stride(0);
  p.k_stride_h = k_buffer.stride(1);
  p.v_buffer = v_buffer.data_ptr();
  p.v_stride_t = v_buffer.stride(0);
  p.v_stride_h = v_buffer.stride(1);
  p.output = output.data_ptr();
  p.output_stride_b = output.stride(0);
  p.output_stride_h = output.stride(1);
  p.attn_logits = attn_logits.data_ptr<float>();
  p.logits_stride_b = attn_logits.stride(0);
  p.logits_stride_h = attn_logits.stride(1);
  p.logits_stride_s = attn_logits.stride(2);
  maps.fill(p);
  p.kv_lens = maps.lengths();
  p.sm_scale = static_cast<float>(sm_scale);
  p.logit_cap = static_cast<float>(logit_cap);
  p.sinks = opts.sinks_data();
  if (int8) set_int8_params(p, q8);
  if (fp8) set_fp8_params(p, f8);
  TORCH_CHECK(ops::kernels().decode_attention(p, ops::torch_pool()), op,
              ": a worker could not allocate its scratch memory; output is incomplete");
}

}  // namespace ops

namespace {

constexpr char kDecodeName[] = "rvv_attn.decode_attention_cpu";

// Tokens per KV block of the active variant's decode (and int8 decode)
// kernel: lets tests aim at each variant's own block boundaries.
int64_t decode_attention_blocking() { return ops::kernels().decode_block_tokens; }

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def("decode_attention_blocking() -> int", &rvv_attn::decode_attention_blocking);
  m.def(
      "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor(c!) output, "
      "Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
      "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, " RVV_ATTN_OPTION_ARGS ") -> ()");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("decode_attention_cpu", &rvv_attn::entry::decode_attention_cpu<rvv_attn::kDecodeName>);
}
