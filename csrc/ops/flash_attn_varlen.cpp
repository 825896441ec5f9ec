// flash_attn_varlen_func: dense variable-length attention without a cache,
// as SGLang's vision encoders call it. Sequence b's queries are rows
// [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, its keys and values rows
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v; scale 1/sqrt(D); query
// heads share KV heads by grouping (GQA). causal: query i sees keys 0..i of
// its sequence (top-left aligned, as SDPA's is_causal).
//
// It runs the extend kernel with no cached prefix: the keys are stage 2's
// "new tokens", read from their own rows, causally or not.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <utility>

#include "kernels/kernel_api.h"
#include "ops/attention.h"
#include "ops/checks.h"
#include "ops/entry_points.h"

namespace rvv_attn {

namespace {

constexpr int64_t kMaxHeadDim = 576;
constexpr int64_t kMaxHeadDimV = 512;

// cu_seqlens: int32 [B + 1], 0 first, non-decreasing, the last <= rows;
// each length <= max_len. Returns (starts, lengths) as int64 [B].
std::pair<at::Tensor, at::Tensor> check_cu_seqlens(const char* op, const char* name, const at::Tensor& cu,
                                                   int64_t batch, int64_t rows, const char* rows_name,
                                                   const char* max_name, int64_t max_len) {
  const at::Tensor c = cu.to(at::kLong).contiguous();
  const int64_t* v = c.data_ptr<int64_t>();
  TORCH_CHECK(v[0] == 0, op, ": ", name, "[0] = ", v[0], "; it must be 0 (sequence 0 starts at row 0)");
  at::Tensor starts = at::empty({batch}, at::kLong), lens = at::empty({batch}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(v[b + 1] >= v[b], op, ": ", name, " must not decrease, but ", name, "[", b + 1, "] = ", v[b + 1], " < ",
                name, "[", b, "] = ", v[b]);
    TORCH_CHECK(v[b + 1] <= rows, op, ": ", name, "[", b + 1, "] = ", v[b + 1], " runs past the ", rows, " rows of ",
                rows_name);
    TORCH_CHECK(v[b + 1] - v[b] <= max_len, op, ": sequence ", b, " has ", v[b + 1] - v[b], " rows (", name, "[", b + 1,
                "] - ", name, "[", b, "]), more than ", max_name, " = ", max_len);
    starts.data_ptr<int64_t>()[b] = v[b];
    lens.data_ptr<int64_t>()[b] = v[b + 1] - v[b];
  }
  return {starts, lens};
}

}  // namespace

at::Tensor ops::flash_attn_varlen(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, bool causal) {
  using namespace checks;
  rank(op, "q", q, 3, "[Tq, H, D]");
  rank(op, "k", k, 3, "[Tk, H_kv, D]");
  rank(op, "v", v, 3, "[Tk, H_kv, Dv]");
  rank(op, "cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]");
  rank(op, "cu_seqlens_k", cu_seqlens_k, 1, "[B + 1]");
  const DType dtype = float_dtype(op, "q", q);
  same_dtype(op, "k", k, "q", q);
  same_dtype(op, "v", v, "q", q);
  index_dtype(op, "cu_seqlens_q", cu_seqlens_q, {at::kInt});
  index_dtype(op, "cu_seqlens_k", cu_seqlens_k, {at::kInt});
  TORCH_CHECK(cu_seqlens_q.size(0) >= 1, op, ": cu_seqlens_q is empty; it holds B + 1 offsets");
  size_is(op, "cu_seqlens_k", cu_seqlens_k, 0, cu_seqlens_q.size(0), "cu_seqlens_q.size(0) (B + 1)");
  const int64_t heads = q.size(1), head_dim = q.size(2), heads_kv = k.size(1), head_dim_v = v.size(2);
  size_is(op, "k", k, 2, head_dim, "q.size(2) (D)");
  size_is(op, "v", v, 0, k.size(0), "k.size(0) (Tk)");
  size_is(op, "v", v, 1, heads_kv, "k.size(1) (H_kv)");
  TORCH_CHECK(heads_kv > 0 && heads % heads_kv == 0, op, ": q has H = ", heads,
              " heads, which is not a multiple of H_kv = ", heads_kv, " (k.size(1))");
  TORCH_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim, op, ": head dim D = ", head_dim, " (q.size(2)) is outside [1, ",
              kMaxHeadDim, "]");
  TORCH_CHECK(head_dim_v >= 1 && head_dim_v <= kMaxHeadDimV, op, ": value head dim Dv = ", head_dim_v,
              " (v.size(2)) is outside [1, ", kMaxHeadDimV, "]");
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, op, ": max_seqlen_q = ", max_seqlen_q,
              " and max_seqlen_k = ", max_seqlen_k, " must not be negative");
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    dense_last_dim(op, name, *t);
  }
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  const auto [q_start, q_len] =
      check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, batch, q.size(0), "q", "max_seqlen_q", max_seqlen_q);
  const auto [k_start, k_len] =
      check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, batch, k.size(0), "k", "max_seqlen_k", max_seqlen_k);

  // Rows no sequence covers stay zero (never uninitialised memory).
  at::Tensor out = at::zeros({q.size(0), heads, head_dim_v}, q.options());
  if (batch == 0 || heads == 0) return out;

  // No cached prefix: the map is never read, but the kernel takes one.
  const at::Tensor zeros = at::zeros({batch}, at::kLong);
  const at::Tensor no_map = at::zeros({1, 1}, at::kInt);
  ExtendParams p{};
  p.dtype = dtype;
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.q = q.data_ptr();
  p.q_stride_t = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k = k.data_ptr();
  p.k_stride_t = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.v = v.data_ptr();
  p.v_stride_t = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.o = out.data_ptr();
  p.o_stride_t = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.k_buffer = k.data_ptr();
  p.v_buffer = v.data_ptr();
  p.req_to_token = no_map.data_ptr();
  p.req_pool_indices = zeros.data_ptr<int64_t>();
  p.kv_first = zeros.data_ptr<int64_t>();
  p.prefix_lens = zeros.data_ptr<int64_t>();
  p.extend_lens = q_len.data_ptr<int64_t>();
  p.extend_start = q_start.data_ptr<int64_t>();
  p.new_key_start = k_start.data_ptr<int64_t>();
  p.new_key_lens = k_len.data_ptr<int64_t>();
  p.causal = causal;
  ops::run_extend_kernel(p);
  return out;
}

namespace {

constexpr char kVarlenName[] = "rvv_attn.flash_attn_varlen_func";

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def(
      "flash_attn_varlen_func(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, bool causal) -> Tensor");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("flash_attn_varlen_func", &rvv_attn::entry::flash_attn_varlen_func<rvv_attn::kVarlenName>);
}
