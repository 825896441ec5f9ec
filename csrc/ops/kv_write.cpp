#include "ops/kv_write.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "ops/checks.h"
#include "ops/runtime.h"

namespace rvv_attn::ops {
namespace {

// Every slot in ``loc`` is inside both buffers.
void check_slots(const char* op, const at::Tensor& loc, int64_t k_slots, int64_t v_slots) {
  const int64_t* slots = loc.data_ptr<int64_t>();
  const int64_t n = loc.numel();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < k_slots && slots[i] < v_slots, op, ": loc[", i, "] = ", slots[i],
                " is outside the KV cache's token slots [0, ", std::min(k_slots, v_slots), ")");
  }
}

}  // namespace

PreparedKvWrite prepare_kv_write(const char* op, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                                 const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc, bool int8_cache,
                                 bool fp8_cache) {
  using namespace checks;
  rank(op, "k_buffer", k_buffer, 3, "[max_total_tokens, H_kv, D]");
  rank(op, "v_buffer", v_buffer, 3, "[max_total_tokens, H_kv, Dv]");
  rank(op, "key", key, 3, "[B, H_kv, D]");
  rank(op, "value", value, 3, "[B, H_kv, Dv]");
  rank(op, "loc", loc, 1, "[B]");
  DType dtype = DType::Float32;
  if (int8_cache) {
    // The caller checked that k_buffer/v_buffer are int8.
    if (key.scalar_type() != at::kChar) dtype = float_dtype(op, "key", key);
    same_dtype(op, "value", value, "key", key);
  } else if (fp8_cache) {
    dtype = float_dtype(op, "key", key);
    same_dtype(op, "value", value, "key", key);
  } else {
    not_int8_cache(op, "k_buffer", k_buffer);
    not_int8_cache(op, "v_buffer", v_buffer);
    dtype = float_dtype(op, "k_buffer", k_buffer);
    same_dtype(op, "v_buffer", v_buffer, "k_buffer", k_buffer);
    same_dtype(op, "key", key, "k_buffer", k_buffer);
    same_dtype(op, "value", value, "k_buffer", k_buffer);
  }
  index_tensor(op, "loc", loc);
  const int64_t batch = key.size(0), heads_kv = k_buffer.size(1);
  const int64_t head_dim = k_buffer.size(2), head_dim_v = v_buffer.size(2);
  size_is(op, "value", value, 0, batch, "key.size(0) (the batch)");
  size_is(op, "loc", loc, 0, batch, "key.size(0) (the batch)");
  size_is(op, "v_buffer", v_buffer, 1, heads_kv, "k_buffer.size(1) (H_kv)");
  size_is(op, "key", key, 1, heads_kv, "k_buffer.size(1) (H_kv)");
  size_is(op, "value", value, 1, heads_kv, "k_buffer.size(1) (H_kv)");
  size_is(op, "key", key, 2, head_dim, "k_buffer.size(2) (D)");
  size_is(op, "value", value, 2, head_dim_v, "v_buffer.size(2) (Dv)");
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k_buffer", &k_buffer},
                         {"v_buffer", &v_buffer},
                         {"key", &key},
                         {"value", &value}}) {
    dense_last_dim(op, name, *t);
  }
  PreparedKvWrite out{};
  out.loc = loc.to(at::kLong).contiguous();
  check_slots(op, out.loc, k_buffer.size(0), v_buffer.size(0));

  KvWriteParams& p = out.params;
  p.dtype = dtype;
  p.batch = batch;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.key = key.data_ptr();
  p.key_stride_b = key.stride(0);
  p.key_stride_h = key.stride(1);
  p.value = value.data_ptr();
  p.value_stride_b = value.stride(0);
  p.value_stride_h = value.stride(1);
  p.k_buffer = k_buffer.data_ptr();
  p.k_buffer_stride_t = k_buffer.stride(0);
  p.k_buffer_stride_h = k_buffer.stride(1);
  p.v_buffer = v_buffer.data_ptr();
  p.v_buffer_stride_t = v_buffer.stride(0);
  p.v_buffer_stride_h = v_buffer.stride(1);
  p.loc = out.loc.data_ptr<int64_t>();
  p.rows = nullptr;
  keep_last_write_per_slot(out);
  return out;
}

void keep_last_write_per_slot(PreparedKvWrite& prepared) {
  KvWriteParams& p = prepared.params;
  const int64_t n = p.batch;
  if (n < 2) return;
  // Entries grouped by slot, each group in entry order: its last member wins.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  const int64_t* slots = p.loc;
  std::sort(order.begin(), order.end(),
            [slots](int64_t a, int64_t b) { return slots[a] != slots[b] ? slots[a] < slots[b] : a < b; });
  std::vector<int64_t> winners;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i + 1 == order.size() || slots[order[i]] != slots[order[i + 1]]) winners.push_back(order[i]);
  }
  if (static_cast<int64_t>(winners.size()) == n) return;
  // Entry order again, so the cache rows are visited as the batch lists them.
  std::sort(winners.begin(), winners.end());
  const int64_t kept = static_cast<int64_t>(winners.size());
  at::Tensor kept_loc = at::empty({kept}, at::kLong), kept_rows = at::empty({kept}, at::kLong);
  int64_t* loc_out = kept_loc.data_ptr<int64_t>();
  int64_t* rows_out = kept_rows.data_ptr<int64_t>();
  for (int64_t k = 0; k < kept; ++k) {
    const int64_t e = winners[static_cast<size_t>(k)];
    loc_out[k] = slots[e];
    rows_out[k] = p.rows != nullptr ? p.rows[e] : e;
  }
  prepared.loc = kept_loc;
  prepared.rows = kept_rows;
  p.loc = loc_out;
  p.rows = rows_out;
  p.batch = kept;
}

void run_kv_write(const PreparedKvWrite& prepared) {
  if (prepared.params.batch == 0 || prepared.params.heads_kv == 0) return;
  kernels().write_kv(prepared.params, torch_pool());
}

}  // namespace rvv_attn::ops
