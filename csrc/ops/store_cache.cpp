// store_cache_cpu: SGLang main's KV-pool write. Token i's K and V rows go to
// cache slot indices[i]: k_cache[indices[i]] = k[i], v_cache[indices[i]] =
// v[i]. The elements are only copied, so besides bfloat16, float16 and
// float32 it takes uint8 (SGLang stores an fp8 cache as bytes). Every index
// is checked before the first byte is written; tokens naming one slot are
// written in order, so the last of them stays (as torch's indexed assignment
// k_cache[indices] = k leaves it on CPU).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "kernels/kernel_api.h"
#include "ops/attention.h"
#include "ops/checks.h"
#include "ops/entry_points.h"
#include "ops/kv_write.h"
#include "ops/overlap.h"
#include "ops/runtime.h"

namespace rvv_attn {
namespace {

constexpr char kStoreCacheName[] = "rvv_attn.store_cache_cpu";

DType copy_dtype(const char* op, const at::Tensor& t) {
  if (t.scalar_type() == at::kByte) return DType::Bytes;
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, op,
              ": k has dtype ", t.scalar_type(),
              "; supported are bfloat16, float16, float32 and uint8 (an fp8 cache "
              "stored as bytes)");
  return checks::float_dtype(op, "k", t);
}

}  // namespace

void ops::store_cache(const char* op, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                      at::Tensor& v_cache, const at::Tensor& indices, std::optional<int64_t> row_dim) {
  using namespace checks;
  rank(op, "k", k, 3, "[T, H, D]");
  rank(op, "v", v, 3, "[T, H, Dv]");
  rank(op, "k_cache", k_cache, 3, "[max_total_tokens, H, D]");
  rank(op, "v_cache", v_cache, 3, "[max_total_tokens, H, Dv]");
  rank(op, "indices", indices, 1, "[T]");
  const DType dtype = copy_dtype(op, k);
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"v", &v}, {"k_cache", &k_cache}, {"v_cache", &v_cache}}) {
    same_dtype(op, name, *t, "k", k);
  }
  index_tensor(op, "indices", indices);
  const int64_t tokens = k.size(0), heads = k.size(1);
  size_is(op, "v", v, 0, tokens, "k.size(0) (T)");
  size_is(op, "indices", indices, 0, tokens, "k.size(0) (T)");
  size_is(op, "v", v, 1, heads, "k.size(1) (H)");
  size_is(op, "k_cache", k_cache, 1, heads, "k.size(1) (H)");
  size_is(op, "v_cache", v_cache, 1, heads, "k.size(1) (H)");
  size_is(op, "k_cache", k_cache, 2, k.size(2), "k.size(2) (D)");
  size_is(op, "v_cache", v_cache, 2, v.size(2), "v.size(2) (Dv)");
  if (row_dim.has_value()) {
    TORCH_CHECK(*row_dim == heads * k.size(2), op, ": row_dim = ", *row_dim, " but k's rows hold H * D = ", heads,
                " * ", k.size(2), " = ", heads * k.size(2), " elements");
  }
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"k", &k}, {"v", &v}, {"k_cache", &k_cache}, {"v_cache", &v_cache}}) {
    dense_last_dim(op, name, *t);
  }
  const at::Tensor slots = indices.to(at::kLong).contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t k_slots = k_cache.size(0), v_slots = v_cache.size(0);
  for (int64_t i = 0; i < tokens; ++i) {
    TORCH_CHECK(slot[i] >= 0 && slot[i] < k_slots && slot[i] < v_slots, op, ": indices[", i, "] = ", slot[i],
                " is outside the caches' token slots [0, ", std::min(k_slots, v_slots), ")");
  }
  overlap::check_writes(op, {{"k_cache", &k_cache}, {"v_cache", &v_cache}},
                        {{"k", &k}, {"v", &v}, {"indices", &indices}});
  if (tokens == 0 || heads == 0) return;

  ops::PreparedKvWrite w{};
  w.loc = slots;
  KvWriteParams& p = w.params;
  p.dtype = dtype;
  p.batch = tokens;
  p.heads_kv = heads;
  p.head_dim = k.size(2);
  p.head_dim_v = v.size(2);
  p.key = k.data_ptr();
  p.key_stride_b = k.stride(0);
  p.key_stride_h = k.stride(1);
  p.value = v.data_ptr();
  p.value_stride_b = v.stride(0);
  p.value_stride_h = v.stride(1);
  p.k_buffer = k_cache.data_ptr();
  p.k_buffer_stride_t = k_cache.stride(0);
  p.k_buffer_stride_h = k_cache.stride(1);
  p.v_buffer = v_cache.data_ptr();
  p.v_buffer_stride_t = v_cache.stride(0);
  p.v_buffer_stride_h = v_cache.stride(1);
  p.loc = slot;
  p.rows = nullptr;
  ops::keep_last_write_per_slot(w);
  ops::run_kv_write(w);
}

}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def(
      "store_cache_cpu(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, "
      "int? row_dim=None) -> ()");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("store_cache_cpu", &rvv_attn::entry::store_cache_cpu<rvv_attn::kStoreCacheName>);
}
