// Validation of the paged-KV token maps shared by decode and extend.
//
// A batch reaches its KV rows in two hops: sequence b uses row
// req_pool_indices[b] of req_to_token, whose first ``len[b]`` entries are
// cache slots. Every one of those indices is read by the kernels without
// bounds checks, so all of them are checked here, before anything is
// written; each failure names the tensor, the position and the value.
//
// Torch side only (the kernels get the raw pointers from a CheckedTokenMaps).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "ops/checks.h"

namespace rvv_attn::token_map {

// req_to_token read through either index dtype.
struct MapView {
  const void* data;
  bool is_int64;
  int64_t row_stride;  // elements; the column stride is 1

  // Pointer to entry (row, col), for kernels that load a run of slots.
  const void* row_ptr(int64_t row, int64_t col = 0) const {
    const int64_t off = row * row_stride + col;
    return is_int64 ? static_cast<const void*>(static_cast<const int64_t*>(data) + off)
                    : static_cast<const void*>(static_cast<const int32_t*>(data) + off);
  }
  int64_t at(int64_t row, int64_t col) const {
    const int64_t off = row * row_stride + col;
    return is_int64 ? static_cast<const int64_t*>(data)[off] : static_cast<const int32_t*>(data)[off];
  }
};

// Tensors the kernels may read without further checks. Holds the (possibly
// copied) tensors so their data outlive the kernel call.
// Sequence b reads the map entries in columns [firsts[b], firsts[b] + lens[b])
// of row req_pool_indices[b].
struct CheckedTokenMaps {
  at::Tensor req_to_token;      // 2-D, int32 or int64, last dimension dense
  at::Tensor req_pool_indices;  // 1-D int64, contiguous (a copy if given as int32)
  at::Tensor firsts;            // 1-D int64, contiguous
  at::Tensor lens;              // 1-D int64, contiguous (a copy if given as int32)
  MapView map() const {
    return MapView{req_to_token.data_ptr(), req_to_token.scalar_type() == at::kLong, req_to_token.stride(0)};
  }
  const int64_t* pool_indices() const { return req_pool_indices.data_ptr<int64_t>(); }
  const int64_t* first_columns() const { return firsts.data_ptr<int64_t>(); }
  const int64_t* lengths() const { return lens.data_ptr<int64_t>(); }

  // The fields every paged operator's parameter struct (DecodeParams,
  // ExtendParams) takes from the checked maps.
  template <typename Params>
  void fill(Params& p) const {
    const MapView view = map();
    p.req_to_token = view.data;
    p.req_to_token_is_int64 = view.is_int64;
    p.req_to_token_stride = view.row_stride;
    p.req_pool_indices = pool_indices();
    p.kv_first = first_columns();
  }
};

// Every map entry the kernels will read, for column ranges the caller has
// already bounded (0 <= firsts[b], lens[b] >= 0, firsts[b] + lens[b] <=
// req_to_token.size(1)): pool rows in range and each entry a valid slot.
// ``firsts`` and ``lens`` are contiguous int64 [B] tensors.
inline CheckedTokenMaps check_ranges(const char* op, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                     const at::Tensor& firsts, const at::Tensor& lens, int64_t num_slots) {
  CheckedTokenMaps out;
  out.req_to_token =
      req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1 ? req_to_token : req_to_token.contiguous();
  out.req_pool_indices = req_pool_indices.to(at::kLong).contiguous();
  out.firsts = firsts;
  out.lens = lens;
  const int64_t max_reqs = req_to_token.size(0);
  const int64_t* rows = out.pool_indices();
  const int64_t* first = out.first_columns();
  const int64_t* len = out.lengths();
  const MapView map = out.map();
  for (int64_t b = 0; b < lens.numel(); ++b) {
    TORCH_CHECK(rows[b] >= 0 && rows[b] < max_reqs, op, ": req_pool_indices[", b, "] = ", rows[b],
                " is outside req_to_token's rows [0, ", max_reqs, ")");
    for (int64_t t = first[b]; t < first[b] + len[b]; ++t) {
      const int64_t slot = map.at(rows[b], t);
      TORCH_CHECK(slot >= 0 && slot < num_slots, op, ": req_to_token[", rows[b], ", ", t, "] = ", slot,
                  " is outside the KV cache's token slots [0, ", num_slots, ") (sequence ", b, ", column ", t, ")");
    }
  }
  return out;
}

// Ranks and dtypes only (cheap; no element is read). ``lens_name`` is the
// argument holding per-sequence lengths ("seq_lens" for decode).
inline void check_layout(const char* op, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                         const char* lens_name, const at::Tensor& lens, int64_t batch) {
  using namespace checks;
  rank(op, "req_to_token", req_to_token, 2, "[max_reqs, max_context_len]");
  rank(op, "req_pool_indices", req_pool_indices, 1, "[B]");
  rank(op, lens_name, lens, 1, "[B]");
  index_dtype(op, "req_to_token", req_to_token, {at::kInt, at::kLong});
  index_tensor(op, "req_pool_indices", req_pool_indices);
  index_tensor(op, lens_name, lens);
  size_is(op, "req_pool_indices", req_pool_indices, 0, batch, "the batch size");
  size_is(op, lens_name, lens, 0, batch, "the batch size");
}

// Checks every index the kernels will read:
//  * req_pool_indices[b] in [0, max_reqs);
//  * min_len <= lens[b] <= max_context_len (min_len is 1 for decode: the
//    sequence includes the token written this step);
//  * req_to_token[req_pool_indices[b], t] in [0, num_slots) for t < lens[b].
// Call check_layout first.
inline CheckedTokenMaps check_values(const char* op, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                                     const char* lens_name, const at::Tensor& lens, int64_t num_slots, int64_t min_len,
                                     const char* min_len_reason) {
  CheckedTokenMaps out;
  out.req_to_token =
      req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1 ? req_to_token : req_to_token.contiguous();
  // Widened to int64 before any check, so every bound holds for either width.
  out.req_pool_indices = req_pool_indices.to(at::kLong).contiguous();
  out.lens = lens.to(at::kLong).contiguous();
  out.firsts = at::zeros_like(out.lens);
  const int64_t max_reqs = req_to_token.size(0), max_context = req_to_token.size(1);
  const int64_t batch = out.lens.numel();
  const int64_t* rows = out.pool_indices();
  const int64_t* len = out.lengths();
  const MapView map = out.map();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(rows[b] >= 0 && rows[b] < max_reqs, op, ": req_pool_indices[", b, "] = ", rows[b],
                " is outside req_to_token's rows [0, ", max_reqs, ")");
    TORCH_CHECK(len[b] >= 0, op, ": ", lens_name, "[", b, "] = ", len[b], " is negative");
    TORCH_CHECK(len[b] >= min_len, op, ": ", lens_name, "[", b, "] = ", len[b], " but ", min_len_reason,
                "; it must be at least ", min_len);
    TORCH_CHECK(len[b] <= max_context, op, ": ", lens_name, "[", b, "] = ", len[b],
                " exceeds req_to_token.size(1) = ", max_context, " (max_context_len)");
    for (int64_t t = 0; t < len[b]; ++t) {
      const int64_t slot = map.at(rows[b], t);
      TORCH_CHECK(slot >= 0 && slot < num_slots, op, ": req_to_token[", rows[b], ", ", t, "] = ", slot,
                  " is outside the KV cache's token slots [0, ", num_slots, ") (sequence ", b, ", token ", t, ")");
    }
  }
  return out;
}

}  // namespace rvv_attn::token_map
