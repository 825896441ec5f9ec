#include "ops/int8_kv.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "ops/checks.h"
#include "ops/runtime.h"

namespace rvv_attn::ops {
namespace {

float check_scale(const char* op, const char* name, const char* buf_name, double v) {
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  const float f = static_cast<float>(v);
  TORCH_CHECK(std::isfinite(f) && f > 0.0f, op, ": ", name, " = ", v,
              " is not a valid scale: give a finite static scale > 0 (as float32), or NaN for per-token scales in ",
              buf_name);
  return f;
}

void check_scale_buffer(const char* op, const char* name, const at::Tensor& t, const char* cache_name,
                        const at::Tensor& cache) {
  using namespace checks;
  rank(op, name, t, 2, "[max_total_tokens, H_kv]");
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must have dtype float32, got ", t.scalar_type());
  const std::string what0 = std::string(cache_name) + ".size(0) (max_total_tokens)";
  const std::string what1 = std::string(cache_name) + ".size(1) (H_kv)";
  size_is(op, name, t, 0, cache.size(0), what0.c_str());
  size_is(op, name, t, 1, cache.size(1), what1.c_str());
}

void check_int8_cache(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kChar, op, ": ", name, " has dtype ", t.scalar_type(),
              "; this operator needs an int8 KV cache (float caches go to the float operator)");
}

}  // namespace

Int8Setup check_int8_args(const char* op, const Int8KvArgs& args, const at::Tensor& k_buffer,
                          const at::Tensor& v_buffer) {
  check_int8_cache(op, "k_buffer", k_buffer);
  check_int8_cache(op, "v_buffer", v_buffer);
  Int8Setup s;
  s.k_scale = check_scale(op, "k_scale", "k_scale_buf", args.k_scale);
  s.v_scale = check_scale(op, "v_scale", "v_scale_buf", args.v_scale);
  s.k_dyn = std::isnan(s.k_scale);
  s.v_dyn = std::isnan(s.v_scale);
  check_scale_buffer(op, "k_scale_buf", args.k_scale_buf, "k_buffer", k_buffer);
  check_scale_buffer(op, "v_scale_buf", args.v_scale_buf, "v_buffer", v_buffer);
  s.k_scale_buf = args.k_scale_buf;
  s.v_scale_buf = args.v_scale_buf;
  return s;
}

bool check_new_kv_dtype(const char* op, const char* key_name, const at::Tensor& key, const char* value_name,
                        const at::Tensor& value, const char* query_name, const at::Tensor& query) {
  checks::same_dtype(op, value_name, value, key_name, key);
  if (key.scalar_type() == at::kChar) return true;
  TORCH_CHECK(key.scalar_type() == query.scalar_type(), op, ": ", key_name, " has dtype ", key.scalar_type(), " but ",
              query_name, " has ", query.scalar_type(), "; new keys/values are int8 or of the query's dtype");
  return false;
}

void check_finite_rows(const char* op, const char* name, const at::Tensor& t, const at::Tensor& rows) {
  // The variant's vector scan (torch's isfinite on riscv64 costs tens of
  // instructions per element, more than the attention itself for a long
  // extend). The layout checks before this one made t's last dimension dense.
  TORCH_INTERNAL_ASSERT(t.dim() == 3 && t.stride(2) == 1, op, ": ", name, " reached the finite check unchecked");
  FiniteScanParams scan{};
  scan.dtype = checks::float_dtype(op, name, t);
  scan.data = t.data_ptr();
  scan.rows = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
  scan.count = rows.defined() ? rows.numel() : t.size(0);
  scan.stride_t = t.stride(0);
  scan.stride_h = t.stride(1);
  scan.heads = t.size(1);
  scan.dim = t.size(2);
  const int64_t first = kernels().first_non_finite(scan);
  if (first < 0) return;
  const int64_t i = first / (scan.heads * scan.dim), h = first / scan.dim % scan.heads, d = first % scan.dim;
  const int64_t row = scan.rows != nullptr ? scan.rows[i] : i;
  TORCH_CHECK(false, op, ": ", name, "[", row, ", ", h, ", ", d, "] = ", t[row][h][d].item<double>(),
              " is not finite; an int8 KV cache can only hold finite values");
}

void check_read_scales(const char* op, const Int8Setup& s, const token_map::CheckedTokenMaps& maps,
                       const std::vector<bool>& fresh_k, const std::vector<bool>& fresh_v) {
  if (!s.k_dyn && !s.v_dyn) return;
  const token_map::MapView map = maps.map();
  const int64_t batch = maps.lens.numel();
  const int64_t* rows = maps.pool_indices();
  const int64_t* lens = maps.lengths();
  const int64_t* firsts = maps.first_columns();
  struct Side {
    bool dyn;
    const char* buf;
    const char* scale;
    const at::Tensor* t;
    const std::vector<bool>* fresh;
  } sides[2] = {{s.k_dyn, "k_scale_buf", "k_scale", &s.k_scale_buf, &fresh_k},
                {s.v_dyn, "v_scale_buf", "v_scale", &s.v_scale_buf, &fresh_v}};
  for (const Side& side : sides) {
    if (!side.dyn) continue;
    const float* data = side.t->data_ptr<float>();
    const int64_t st = side.t->stride(0), sh = side.t->stride(1), heads = side.t->size(1);
    for (int64_t b = 0; b < batch; ++b) {
      // The kernel scans the sequence's slots for the first unusable scale;
      // a hit on a slot this call writes is skipped and the scan resumes
      // after it, so fresh slots (NaN until written) cost one extra call each.
      for (int64_t i = 0; i < lens[b];) {
        const ScaleScanParams scan{map.row_ptr(rows[b], firsts[b] + i), map.is_int64, lens[b] - i, data, st, sh, heads};
        i += kernels().first_unusable_scale(scan);
        if (i == lens[b]) break;
        const int64_t slot = map.at(rows[b], firsts[b] + i);  // in range: checked by token_map
        if ((*side.fresh)[static_cast<size_t>(slot)]) {
          ++i;
          continue;
        }
        for (int64_t h = 0; h < heads; ++h) {
          const float v = data[slot * st + h * sh];
          TORCH_CHECK(std::isfinite(v) && v > 0.0f, op, ": ", side.buf, "[", slot, ", ", h, "] = ", v,
                      " is not a finite scale > 0, but dynamic mode (", side.scale, " = nan) reads it for slot ", slot,
                      ", KV head ", h, " (req_to_token[", rows[b], ", ", firsts[b] + i, "], sequence ", b, ")");
        }
        TORCH_CHECK(false, op, ": internal error: the scale scan of ", side.buf, " stopped at slot ", slot,
                    " but every head's scale is usable");
      }
    }
  }
}

Int8Scales kernel_scales(const Int8Setup& s) {
  Int8Scales k{};
  k.k_scale_buf = s.k_scale_buf.data_ptr<float>();
  k.k_scale_stride_t = s.k_scale_buf.stride(0);
  k.k_scale_stride_h = s.k_scale_buf.stride(1);
  k.v_scale_buf = s.v_scale_buf.data_ptr<float>();
  k.v_scale_stride_t = s.v_scale_buf.stride(0);
  k.v_scale_stride_h = s.v_scale_buf.stride(1);
  k.k_scale = s.k_scale;
  k.v_scale = s.v_scale;
  return k;
}

void run_int8_write(const Int8Setup& s, const KvWriteParams& kv, bool src_int8) {
  if (kv.batch == 0 || kv.heads_kv == 0) return;
  KvQuantWriteParams p{};
  p.kv = kv;
  p.src_int8 = src_int8;
  p.scales = kernel_scales(s);
  kernels().write_kv_int8(p, torch_pool());
}

}  // namespace rvv_attn::ops
