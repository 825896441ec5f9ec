// extend_attention_cpu: the torch side. Validates every argument (shapes,
// dtypes, lengths, ranges, every index the kernel will follow), builds the
// query-block work list and the per-worker scratch arena, and calls the
// selected variant's kernel (csrc/kernels/extend.cpp). All checks run before
// the kernel starts, so on error o_extend is untouched.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
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
namespace {

constexpr char kExtendName[] = "rvv_attn.extend_attention_cpu";
// Up to DeepSeek-style MLA's absorbed heads (D = 576 = 512 + 64, Dv = 512).
// The per-worker arena grows with them: at most ~1.5 MB (VLEN 1024's tiles).
constexpr int64_t kMaxHeadDim = 576;
constexpr int64_t kMaxHeadDimV = 512;

// Shapes and dtypes of the ten tensors; returns the element dtype. Without
// ``new_tokens`` (cross attention) k and v are not read, and not checked;
// with ``prefix_skipped`` (SGLang's MLA prefill) the caches are not read,
// and only their ranks and dtypes are checked.
DType check_layout(const char* op, bool quantized, bool new_tokens, bool prefix_skipped, const at::Tensor& q,
                   const at::Tensor& k, const at::Tensor& v, const at::Tensor& o, const at::Tensor& k_buffer,
                   const at::Tensor& v_buffer, const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                   const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens, const at::Tensor& extend_start_loc) {
  using namespace checks;
  rank(op, "q_extend", q, 3, "[T, H, D]");
  if (new_tokens) {
    rank(op, "k_extend", k, 3, "[T, H_kv, D]");
    rank(op, "v_extend", v, 3, "[T, H_kv, Dv]");
  }
  rank(op, "o_extend", o, 3, "[T, H, Dv]");
  rank(op, "k_buffer", k_buffer, 3, "[max_total_tokens, H_kv, D]");
  rank(op, "v_buffer", v_buffer, 3, "[max_total_tokens, H_kv, Dv]");
  rank(op, "extend_seq_lens", extend_seq_lens, 1, "[B]");
  rank(op, "extend_start_loc", extend_start_loc, 1, "[B]");

  const DType dtype = float_dtype(op, "q_extend", q);
  same_dtype(op, "o_extend", o, "q_extend", q);
  if (!quantized) {
    // (The int8 and fp8 operators check their caches and new K/V themselves.)
    not_int8_cache(op, "k_buffer", k_buffer);
    not_int8_cache(op, "v_buffer", v_buffer);
    if (new_tokens) {
      same_dtype(op, "k_extend", k, "q_extend", q);
      same_dtype(op, "v_extend", v, "q_extend", q);
    }
    same_dtype(op, "k_buffer", k_buffer, "q_extend", q);
    same_dtype(op, "v_buffer", v_buffer, "q_extend", q);
  }
  index_tensor(op, "extend_seq_lens", extend_seq_lens);
  index_tensor(op, "extend_start_loc", extend_start_loc);

  const int64_t tokens = q.size(0), heads = q.size(1), head_dim = q.size(2);
  // The new tokens' K/V set H_kv and Dv; without them, the cache does.
  const at::Tensor& kv_ref = new_tokens ? k : k_buffer;
  const char* h_kv = new_tokens ? "k_extend.size(1) (H_kv)" : "k_buffer.size(1) (H_kv)";
  const char* d_v = new_tokens ? "v_extend.size(2) (Dv)" : "v_buffer.size(2) (Dv)";
  const int64_t heads_kv = kv_ref.size(1), head_dim_v = (new_tokens ? v : v_buffer).size(2);
  if (new_tokens) {
    size_is(op, "k_extend", k, 0, tokens, "q_extend.size(0) (T)");
    size_is(op, "v_extend", v, 0, tokens, "q_extend.size(0) (T)");
    size_is(op, "k_extend", k, 2, head_dim, "q_extend.size(2) (D)");
    size_is(op, "v_extend", v, 1, heads_kv, h_kv);
  }
  if (!prefix_skipped) {
    if (new_tokens) {
      size_is(op, "k_buffer", k_buffer, 1, heads_kv, h_kv);
      size_is(op, "v_buffer", v_buffer, 2, head_dim_v, d_v);
    }
    size_is(op, "k_buffer", k_buffer, 2, head_dim, "q_extend.size(2) (D)");
    size_is(op, "v_buffer", v_buffer, 1, heads_kv, h_kv);
  }
  size_is(op, "o_extend", o, 0, tokens, "q_extend.size(0) (T)");
  size_is(op, "o_extend", o, 1, heads, "q_extend.size(1) (H)");
  size_is(op, "o_extend", o, 2, head_dim_v, d_v);
  TORCH_CHECK(heads_kv > 0 && heads % heads_kv == 0, op, ": q_extend has H = ", heads,
              " heads, which is not a multiple of H_kv = ", heads_kv, " (", h_kv, ")");
  TORCH_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim, op, ": head dim D = ", head_dim,
              " (q_extend.size(2)) is outside [1, ", kMaxHeadDim, "]");
  TORCH_CHECK(head_dim_v >= 1 && head_dim_v <= kMaxHeadDimV, op, ": value head dim Dv = ", head_dim_v, " (", d_v,
              ") is outside [1, ", kMaxHeadDimV, "]");

  const int64_t batch = extend_seq_lens.size(0);
  token_map::check_layout(op, req_to_token, req_pool_indices, "seq_lens", seq_lens, batch);
  size_is(op, "extend_start_loc", extend_start_loc, 0, batch, "extend_seq_lens.size(0) (B)");

  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q_extend", &q},
                         {"k_extend", &k},
                         {"v_extend", &v},
                         {"o_extend", &o},
                         {"k_buffer", &k_buffer},
                         {"v_buffer", &v_buffer}}) {
    if (t->defined()) dense_last_dim(op, name, *t);
  }
  return dtype;
}

// Workers write o_extend rows while others still read their inputs (a query
// block's rows are read by every head's item), so o_extend may overlap none
// of them, nor repeat an element. The int8 operator also writes the new
// tokens' cache rows and, for float rows in dynamic mode, their scales.
void check_extend_overlap(const char* op, const ops::Int8Setup* q8, const ops::CheckedOptions& opts, bool new_tokens,
                          bool new_int8, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& o, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens, const at::Tensor& extend_seq_lens,
                          const at::Tensor& extend_start_loc, const at::Tensor& tree_mask) {
  std::vector<overlap::Arg> written = {{"o_extend", &o}};
  std::vector<overlap::Arg> read = {{"q_extend", &q},
                                    {"k_extend", &k},
                                    {"v_extend", &v},
                                    {"req_to_token", &req_to_token},
                                    {"req_pool_indices", &req_pool_indices},
                                    {"seq_lens", &seq_lens},
                                    {"extend_seq_lens", &extend_seq_lens},
                                    {"extend_start_loc", &extend_start_loc},
                                    {"encoder_lens", &opts.encoder_lens},
                                    {"sinks", &opts.sinks},
                                    {"tree_mask", &tree_mask}};
  if (q8 && new_tokens) {
    written.push_back({"k_buffer", &k_buffer});
    written.push_back({"v_buffer", &v_buffer});
    (q8->k_dyn && !new_int8 ? written : read).push_back({"k_scale_buf", &q8->k_scale_buf});
    (q8->v_dyn && !new_int8 ? written : read).push_back({"v_scale_buf", &q8->v_scale_buf});
  } else {
    read.push_back({"k_buffer", &k_buffer});
    read.push_back({"v_buffer", &v_buffer});
  }
  overlap::check_writes(op, written, read);
}

// Speculative decoding's tree mask (SGLang's custom_mask for a target-verify
// batch on CPU): bool, flat [B * L * L], every sequence extending by the
// same L = max_len_extend draft tokens; new token m of sequence b sees new
// key n iff tree_mask[(b * L + m) * L + n], and its prefix in full. Returns
// it as contiguous bytes (undefined when not given).
at::Tensor checked_tree_mask(const char* op, const ops::AttentionOptions& options, const ops::CheckedOptions& opts,
                             const at::Tensor& ext_t, int64_t max_len_extend) {
  if (!options.tree_mask.has_value() || !options.tree_mask->defined()) return at::Tensor();
  const at::Tensor& mask = *options.tree_mask;
  TORCH_CHECK(mask.scalar_type() == at::kBool, op, ": tree_mask has dtype ", mask.scalar_type(),
              "; it must be bool (SGLang's custom_mask, one byte per draft-token pair)");
  TORCH_CHECK(!opts.cross, op,
              ": tree_mask cannot be used with is_cross_attn=True (cross attention has no draft tokens)");
  TORCH_CHECK(opts.window == 0, op,
              ": tree_mask cannot be used with a sliding window (sliding_window_size = ", options.sliding_window_size,
              ")");
  const int64_t batch = ext_t.numel(), len = max_len_extend;
  const int64_t* ext = ext_t.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(ext[b] == len, op, ": with a tree_mask every sequence extends by max_len_extend = ", len,
                " draft tokens; extend_seq_lens[", b, "] = ", ext[b]);
  }
  TORCH_CHECK(mask.dim() == 1 && mask.numel() == batch * len * len, op, ": tree_mask has shape ",
              checks::shape_of(mask), "; expected [", batch * len * len, "] = B * L * L for B = ", batch,
              " sequences of L = ", len, " draft tokens");
  return mask.contiguous().view(at::kByte);
}

// Per-sequence lengths and extend row ranges. ``ext``, ``seq``, ``start``
// are the contiguous int64 copies of extend_seq_lens, seq_lens and
// extend_start_loc.
void check_extend_ranges(const char* op, const at::Tensor& ext_t, const at::Tensor& seq_t, const at::Tensor& start_t,
                         int64_t tokens, int64_t max_len_extend) {
  const int64_t batch = ext_t.numel();
  const int64_t* ext = ext_t.data_ptr<int64_t>();
  const int64_t* seq = seq_t.data_ptr<int64_t>();
  const int64_t* start = start_t.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (start, b) of the non-empty extends
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(ext[b] >= 0, op, ": extend_seq_lens[", b, "] = ", ext[b], " is negative");
    TORCH_CHECK(seq[b] >= 0, op, ": seq_lens[", b, "] = ", seq[b], " is negative");
    TORCH_CHECK(ext[b] <= seq[b], op, ": extend_seq_lens[", b, "] = ", ext[b], " exceeds seq_lens[", b, "] = ", seq[b],
                " (the new tokens are part of the sequence)");
    TORCH_CHECK(ext[b] <= max_len_extend, op, ": extend_seq_lens[", b, "] = ", ext[b],
                " exceeds max_len_extend = ", max_len_extend);
    // Written so that no sum can overflow: start <= T and ext <= T - start.
    TORCH_CHECK(start[b] >= 0 && start[b] <= tokens && ext[b] <= tokens - start[b], op, ": extend_start_loc[", b,
                "] = ", start[b], " with extend_seq_lens[", b, "] = ", ext[b], " runs outside the T = ", tokens,
                " rows of q_extend");
    if (ext[b] > 0) ranges.emplace_back(start[b], b);
  }
  // Two sequences writing the same o_extend rows would race and clobber.
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const int64_t a = ranges[i - 1].second, b = ranges[i].second;
    TORCH_CHECK(start[a] + ext[a] <= start[b], op, ": the extend rows of sequences ", a, " and ", b,
                " overlap: extend_start_loc[", a, "] = ", start[a], " with extend_seq_lens[", a, "] = ", ext[a],
                " reaches row ", start[a] + ext[a] - 1, ", past extend_start_loc[", b, "] = ", start[b]);
  }
}

}  // namespace

// The query-block work list and the per-worker arena, then the kernel.
void ops::run_extend_kernel(ExtendParams& p) {
  const KernelTable& table = ops::kernels();
  const ExtendBlocking blocking = table.extend_blocking();
  at::Tensor qblock_offsets = at::empty({p.batch + 1}, at::kLong);
  int64_t* offsets = qblock_offsets.data_ptr<int64_t>();
  offsets[0] = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    offsets[b + 1] = offsets[b] + (p.extend_lens[b] + blocking.block_m - 1) / blocking.block_m;
  }
  const int64_t items = offsets[p.batch] * p.heads;
  if (items == 0) return;  // empty batch, no new tokens, or no heads
  const int64_t arena_bytes = table.extend_arena_bytes(p.head_dim, p.head_dim_v);
  // One worker per chunk the pool will run (each owns one arena slice).
  const int64_t workers = std::max<int64_t>(1, ops::parallel_chunks(items));
  // One allocation per call; the kernel never allocates.
  at::Tensor arena = at::empty({workers * arena_bytes}, at::kByte);
  p.qblock_offsets = offsets;
  p.arena = arena.data_ptr();
  p.workers = workers;
  table.extend_attention(p, ops::torch_pool());
}

void ops::extend_attention(const char* op, const ops::Int8KvArgs* int8, const ops::Fp8KvArgs* fp8,
                           const at::Tensor& q_extend, const std::optional<at::Tensor>& k_extend_arg,
                           const std::optional<at::Tensor>& v_extend_arg, at::Tensor& o_extend,
                           const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                           const at::Tensor& extend_seq_lens, const at::Tensor& extend_start_loc,
                           int64_t max_len_extend, double sm_scale, double logit_cap,
                           const ops::AttentionOptions& options) {
  // Cross attention attends the encoder's cached tokens only: k_extend and
  // v_extend are ignored (SGLang passes them, or None).
  const bool new_tokens = !options.is_cross_attn;
  const bool k_given = k_extend_arg.has_value() && k_extend_arg->defined();
  const bool v_given = v_extend_arg.has_value() && v_extend_arg->defined();
  TORCH_CHECK(!new_tokens || (k_given && v_given), op,
              ": k_extend and v_extend are required unless is_cross_attn=True; got ",
              k_given ? "k_extend" : "no k_extend", " and ", v_given ? "v_extend" : "no v_extend");
  const at::Tensor k_extend = new_tokens ? *k_extend_arg : at::Tensor();
  const at::Tensor v_extend = new_tokens ? *v_extend_arg : at::Tensor();
  // SGLang's MLA prefill without a prefix: the caches hold one latent head,
  // k_extend/v_extend the full heads; only the new tokens are attended, so
  // every prefix must be 0 (checked below).
  const bool prefix_skipped =
      !int8 && !fp8 && new_tokens && k_extend.dim() == 3 && k_buffer.dim() == 3 && k_buffer.size(1) != k_extend.size(1);
  ops::Int8Setup q8{};
  bool new_int8 = false;
  if (int8) {
    checks::rank(op, "k_buffer", k_buffer, 3, "[max_total_tokens, H_kv, D]");
    checks::rank(op, "v_buffer", v_buffer, 3, "[max_total_tokens, H_kv, Dv]");
    checks::rank(op, "q_extend", q_extend, 3, "[T, H, D]");
    q8 = ops::check_int8_args(op, *int8, k_buffer, v_buffer);
    if (new_tokens) {
      new_int8 = ops::check_new_kv_dtype(op, "k_extend", k_extend, "v_extend", v_extend, "q_extend", q_extend);
    }
  }
  // fp8: the new tokens are the query's float dtype, attended as given
  // (SGLang's pool has written them to the cache before the call).
  ops::Fp8Setup f8{};
  if (fp8) {
    checks::rank(op, "q_extend", q_extend, 3, "[T, H, D]");
    f8 = ops::check_fp8_args(op, *fp8, k_buffer, v_buffer);
    if (new_tokens) {
      checks::same_dtype(op, "k_extend", k_extend, "q_extend", q_extend);
      checks::same_dtype(op, "v_extend", v_extend, "q_extend", q_extend);
    }
  }
  const DType dtype = check_layout(op, int8 != nullptr || fp8 != nullptr, new_tokens, prefix_skipped, q_extend,
                                   k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token, req_pool_indices,
                                   seq_lens, extend_seq_lens, extend_start_loc);
  TORCH_CHECK(std::isfinite(sm_scale) && std::isfinite(static_cast<float>(sm_scale)), op, ": sm_scale = ", sm_scale,
              " is not a finite float32");
  checks::logit_cap(op, logit_cap);
  TORCH_CHECK(max_len_extend >= 0, op, ": max_len_extend = ", max_len_extend, " is negative");
  const ops::CheckedOptions opts =
      ops::check_options(op, options, extend_seq_lens.size(0), q_extend.size(1), "q_extend", q_extend);
  const at::Tensor tree_mask_arg = options.tree_mask.value_or(at::Tensor());
  check_extend_overlap(op, int8 ? &q8 : nullptr, opts, new_tokens, new_int8, q_extend, k_extend, v_extend, o_extend,
                       k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                       tree_mask_arg);
  TORCH_CHECK(options.is_causal || opts.window == 0, op,
              ": is_causal=False cannot be used with a sliding window (sliding_window_size = ",
              options.sliding_window_size, "): the window is defined over causal positions");

  // int64 copies (int32 is widened) of the per-sequence lengths and offsets.
  const at::Tensor ext = extend_seq_lens.to(at::kLong).contiguous();
  const at::Tensor seq = seq_lens.to(at::kLong).contiguous();
  const at::Tensor start = extend_start_loc.to(at::kLong).contiguous();
  const int64_t tokens = q_extend.size(0), batch = seq.numel();
  check_extend_ranges(op, ext, seq, start, tokens, max_len_extend);
  const at::Tensor tree_mask = checked_tree_mask(op, options, opts, ext, max_len_extend);
  at::Tensor prefix = at::empty({batch}, at::kLong);  // seq_lens - extend_seq_lens, >= 0 by now
  for (int64_t b = 0; b < batch; ++b) {
    prefix.data_ptr<int64_t>()[b] = seq.data_ptr<int64_t>()[b] - ext.data_ptr<int64_t>()[b];
    TORCH_CHECK(!prefix_skipped || prefix.data_ptr<int64_t>()[b] == 0, op, ": k_buffer has ", k_buffer.size(1),
                " KV head(s) but k_extend has ", k_extend.size(1),
                " (MLA prefill, where only the new tokens are attended), so every prefix must be 0; sequence ", b,
                " has seq_lens - extend_seq_lens = ", prefix.data_ptr<int64_t>()[b]);
  }
  // The float kernel reads the map only for the prefix tokens its queries
  // see (or, in cross attention, the encoder's): those pool rows and slots
  // are checked (entries for the new tokens are not read). The int8
  // operator also writes the new tokens to their slots
  // req_to_token[row, enc + prefix + i] (and, when they are int8 already,
  // reads them back from there): those entries are checked too. Two new
  // tokens may name one slot: the writes go in batch order (sequence by
  // sequence, each one's tokens in order) and the later token's codes and
  // dynamic scale stay, as in decode.
  at::Tensor stage1;  // keys per sequence in the kernel's stage 1
  const ops::KeyColumns columns =
      ops::extend_key_columns(op, opts, seq, prefix, req_to_token.size(1), int8 != nullptr && new_tokens, &stage1);
  const token_map::CheckedTokenMaps maps = token_map::check_ranges(
      op, req_to_token, req_pool_indices, columns.firsts, columns.lens, std::min(k_buffer.size(0), v_buffer.size(0)));
  at::Tensor write_rows, write_slots;  // int8: row of k_extend/v_extend -> cache slot
  if (int8 && new_tokens) {
    int64_t n = 0;
    for (int64_t b = 0; b < batch; ++b) n += ext.data_ptr<int64_t>()[b];
    write_rows = at::empty({n}, at::kLong);
    write_slots = at::empty({n}, at::kLong);
    int64_t* rows = write_rows.data_ptr<int64_t>();
    int64_t* slots = write_slots.data_ptr<int64_t>();
    const token_map::MapView map = maps.map();
    int64_t i = 0;
    for (int64_t b = 0; b < batch; ++b) {
      // The new tokens' columns follow the keys of stage 1.
      const int64_t pre = maps.first_columns()[b] + stage1.data_ptr<int64_t>()[b], row = maps.pool_indices()[b];
      for (int64_t j = 0; j < ext.data_ptr<int64_t>()[b]; ++j, ++i) {
        rows[i] = start.data_ptr<int64_t>()[b] + j;
        slots[i] = map.at(row, pre + j);
      }
    }
    if (!new_int8) {
      ops::check_finite_rows(op, "k_extend", k_extend, write_rows);
      ops::check_finite_rows(op, "v_extend", v_extend, write_rows);
    }
    std::vector<bool> fresh_k(static_cast<size_t>(k_buffer.size(0)), false);
    std::vector<bool> fresh_v(static_cast<size_t>(v_buffer.size(0)), false);
    if (!new_int8) {
      for (int64_t k = 0; k < n; ++k) {
        fresh_k[static_cast<size_t>(slots[k])] = q8.k_dyn;
        fresh_v[static_cast<size_t>(slots[k])] = q8.v_dyn;
      }
    }
    ops::check_read_scales(op, q8, maps, fresh_k, fresh_v);

    // Everything is checked: write the new tokens into the cache.
    ops::PreparedKvWrite write{};
    KvWriteParams& kv = write.params;
    kv.dtype = dtype;
    kv.batch = n;
    kv.heads_kv = k_extend.size(1);
    kv.head_dim = k_extend.size(2);
    kv.head_dim_v = v_extend.size(2);
    kv.key = k_extend.data_ptr();
    kv.key_stride_b = k_extend.stride(0);
    kv.key_stride_h = k_extend.stride(1);
    kv.value = v_extend.data_ptr();
    kv.value_stride_b = v_extend.stride(0);
    kv.value_stride_h = v_extend.stride(1);
    kv.k_buffer = const_cast<void*>(k_buffer.data_ptr());
    kv.k_buffer_stride_t = k_buffer.stride(0);
    kv.k_buffer_stride_h = k_buffer.stride(1);
    kv.v_buffer = const_cast<void*>(v_buffer.data_ptr());
    kv.v_buffer_stride_t = v_buffer.stride(0);
    kv.v_buffer_stride_h = v_buffer.stride(1);
    kv.loc = slots;
    kv.rows = rows;
    write.loc = write_slots;
    write.rows = write_rows;
    ops::keep_last_write_per_slot(write);
    ops::run_int8_write(q8, kv, new_int8);
  } else if (int8) {
    const std::vector<bool> none_fresh_k(static_cast<size_t>(k_buffer.size(0)), false);
    const std::vector<bool> none_fresh_v(static_cast<size_t>(v_buffer.size(0)), false);
    ops::check_read_scales(op, q8, maps, none_fresh_k, none_fresh_v);
  }

  const int64_t heads = q_extend.size(1);
  const int64_t head_dim = q_extend.size(2), head_dim_v = (new_tokens ? v_extend : v_buffer).size(2);
  ExtendParams p{};
  p.dtype = dtype;
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = new_tokens ? k_extend.size(1) : k_buffer.size(1);
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.sm_scale = static_cast<float>(sm_scale);
  p.logit_cap = static_cast<float>(logit_cap);
  p.q = q_extend.data_ptr();
  p.q_stride_t = q_extend.stride(0);
  p.q_stride_h = q_extend.stride(1);
  if (new_tokens) {
    p.k = k_extend.data_ptr();
    p.k_stride_t = k_extend.stride(0);
    p.k_stride_h = k_extend.stride(1);
    p.v = v_extend.data_ptr();
    p.v_stride_t = v_extend.stride(0);
    p.v_stride_h = v_extend.stride(1);
  }
  p.o = o_extend.data_ptr();
  p.o_stride_t = o_extend.stride(0);
  p.o_stride_h = o_extend.stride(1);
  p.k_buffer = k_buffer.data_ptr();
  p.k_buffer_stride_t = k_buffer.stride(0);
  p.k_buffer_stride_h = k_buffer.stride(1);
  p.v_buffer = v_buffer.data_ptr();
  p.v_buffer_stride_t = v_buffer.stride(0);
  p.v_buffer_stride_h = v_buffer.stride(1);
  maps.fill(p);
  p.prefix_lens = stage1.data_ptr<int64_t>();
  p.window = opts.window;
  p.cross = opts.cross;
  p.sinks = opts.sinks_data();
  p.extend_lens = ext.data_ptr<int64_t>();
  p.extend_start = start.data_ptr<int64_t>();
  p.new_key_start = p.extend_start;
  p.new_key_lens = p.extend_lens;
  p.causal = options.is_causal;
  p.tree_mask = tree_mask.defined() ? tree_mask.data_ptr<uint8_t>() : nullptr;
  p.tree_mask_len = tree_mask.defined() ? max_len_extend : 0;
  if (int8) {
    ops::set_int8_params(p, q8);
    // Float new tokens are attended as given; int8 ones are the cache's values.
    p.new_tokens_from_cache = new_tokens && new_int8;
  }
  if (fp8) {
    ops::set_fp8_params(p, f8);
    p.new_tokens_scaled = fp8->new_tokens_scaled;
  }
  ops::run_extend_kernel(p);
}

namespace {

// [BLOCK_M, BLOCK_N, arena bytes per worker] of the active variant for the
// given head dims: lets tests aim at each variant's own tile boundaries.
std::vector<int64_t> extend_attention_blocking(int64_t head_dim, int64_t head_dim_v) {
  TORCH_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim && head_dim_v >= 1 && head_dim_v <= kMaxHeadDimV,
              "rvv_attn.extend_attention_blocking: head dims must be in [1, ", kMaxHeadDim, "] and [1, ", kMaxHeadDimV,
              "], got ", head_dim, " and ", head_dim_v);
  const KernelTable& table = ops::kernels();
  const ExtendBlocking b = table.extend_blocking();
  return {b.block_m, b.block_n, table.extend_arena_bytes(head_dim, head_dim_v)};
}

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def(
      "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
      "Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float "
      "logit_cap, " RVV_ATTN_EXTEND_OPTION_ARGS ") -> ()");
  m.def("extend_attention_blocking(int head_dim, int head_dim_v) -> int[]", &rvv_attn::extend_attention_blocking);
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("extend_attention_cpu", &rvv_attn::entry::extend_attention_cpu<rvv_attn::kExtendName>);
}
