// Checks of the trailing attention arguments (see ops/attention_options.h).
#include "ops/attention_options.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "ops/checks.h"

namespace rvv_attn::ops {

CheckedOptions check_options(const char* op, const AttentionOptions& opts, int64_t batch, int64_t heads,
                             const char* query_name, const at::Tensor& query) {
  using namespace checks;
  CheckedOptions out;
  out.cross = opts.is_cross_attn;
  // SGLang passes -1 (or 0) for "no window".
  out.window = opts.sliding_window_size > 0 ? opts.sliding_window_size : 0;
  const bool has_enc = opts.encoder_lens.has_value() && opts.encoder_lens->defined();
  TORCH_CHECK(!out.cross || has_enc, op,
              ": is_cross_attn=True needs encoder_lens (the encoder tokens each sequence attends); got None");
  TORCH_CHECK(!out.cross || out.window == 0, op,
              ": is_cross_attn=True with sliding_window_size = ", opts.sliding_window_size,
              "; a sliding window applies to self attention only (pass -1)");
  if (has_enc) {
    const at::Tensor& enc = *opts.encoder_lens;
    rank(op, "encoder_lens", enc, 1, "[B]");
    index_tensor(op, "encoder_lens", enc);
    size_is(op, "encoder_lens", enc, 0, batch, "the batch size");
    out.encoder_lens = enc.to(at::kLong).contiguous();
    const int64_t* e = out.encoder_lens.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      TORCH_CHECK(e[b] >= 0, op, ": encoder_lens[", b, "] = ", e[b], " is negative");
    }
  }
  if (opts.sinks.has_value() && opts.sinks->defined()) {
    const at::Tensor& sinks = *opts.sinks;
    rank(op, "sinks", sinks, 1, "[H] (one per query head)");
    size_is(op, "sinks", sinks, 0, heads, "the number of query heads H");
    TORCH_CHECK(sinks.scalar_type() == at::kFloat || sinks.scalar_type() == query.scalar_type(), op,
                ": sinks has dtype ", sinks.scalar_type(), "; it must be float32 or ", query_name, "'s dtype (",
                query.scalar_type(), ")");
    out.sinks = sinks.to(at::kFloat).contiguous();
    const float* s = out.sinks.data_ptr<float>();
    for (int64_t h = 0; h < heads; ++h) {
      TORCH_CHECK(std::isfinite(s[h]), op, ": sinks[", h, "] = ", s[h], " is not finite");
    }
  }
  return out;
}

namespace {

// ``len`` columns after the sequence's encoder tokens fit in the map row.
void check_fits(const char* op, const CheckedOptions& opts, int64_t b, const char* len_name, int64_t len,
                int64_t width) {
  if (!opts.encoder_lens.defined()) {
    TORCH_CHECK(len <= width, op, ": ", len_name, "[", b, "] = ", len, " exceeds req_to_token.size(1) = ", width,
                " (max_context_len)");
    return;
  }
  const int64_t enc = opts.encoder_len(b);
  TORCH_CHECK(enc <= width && len <= width - enc, op, ": encoder_lens[", b, "] + ", len_name, "[", b, "] = ", enc,
              " + ", len, " exceeds req_to_token.size(1) = ", width,
              " (a row holds the encoder's tokens, then the decoder's)");
}

void check_encoder_fits(const char* op, const CheckedOptions& opts, int64_t b, int64_t width) {
  TORCH_CHECK(opts.encoder_len(b) <= width, op, ": encoder_lens[", b, "] = ", opts.encoder_len(b),
              " exceeds req_to_token.size(1) = ", width);
}

}  // namespace

KeyColumns decode_key_columns(const char* op, const CheckedOptions& opts, const at::Tensor& seq, int64_t width,
                              int64_t min_len, const char* min_len_reason) {
  const int64_t batch = seq.numel();
  KeyColumns out{at::empty({batch}, at::kLong), at::empty({batch}, at::kLong)};
  const int64_t* len = seq.data_ptr<int64_t>();
  int64_t* first = out.firsts.data_ptr<int64_t>();
  int64_t* count = out.lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(len[b] >= 0, op, ": seq_lens[", b, "] = ", len[b], " is negative");
    if (opts.cross) {
      check_encoder_fits(op, opts, b, width);
      first[b] = 0;
      count[b] = opts.encoder_len(b);
      continue;
    }
    TORCH_CHECK(len[b] >= min_len, op, ": seq_lens[", b, "] = ", len[b], " but ", min_len_reason,
                "; it must be at least ", min_len);
    check_fits(op, opts, b, "seq_lens", len[b], width);
    count[b] = opts.window > 0 && opts.window < len[b] ? opts.window : len[b];
    first[b] = opts.encoder_len(b) + len[b] - count[b];
  }
  return out;
}

KeyColumns extend_key_columns(const char* op, const CheckedOptions& opts, const at::Tensor& seq,
                              const at::Tensor& prefix, int64_t width, bool with_new_tokens, at::Tensor* stage1) {
  const int64_t batch = seq.numel();
  KeyColumns out{at::empty({batch}, at::kLong), at::empty({batch}, at::kLong)};
  *stage1 = at::empty({batch}, at::kLong);
  const int64_t* len = seq.data_ptr<int64_t>();
  const int64_t* pre = prefix.data_ptr<int64_t>();
  int64_t* first = out.firsts.data_ptr<int64_t>();
  int64_t* count = out.lens.data_ptr<int64_t>();
  int64_t* keys = stage1->data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    if (opts.cross) {
      check_encoder_fits(op, opts, b, width);
      first[b] = 0;
      count[b] = keys[b] = opts.encoder_len(b);
      continue;
    }
    if (with_new_tokens) {
      check_fits(op, opts, b, "seq_lens", len[b], width);
    } else {
      check_fits(op, opts, b, "prefix_lens (seq_lens - extend_seq_lens)", pre[b], width);
    }
    // The first new token (position P) sees prefix keys from P - W + 1 on;
    // later ones see less of the prefix, so no query reads a key before it.
    const int64_t skipped = opts.window > 0 && pre[b] > opts.window - 1 ? pre[b] - (opts.window - 1) : 0;
    first[b] = opts.encoder_len(b) + skipped;
    keys[b] = pre[b] - skipped;
    count[b] = (with_new_tokens ? len[b] : pre[b]) - skipped;
  }
  return out;
}

}  // namespace rvv_attn::ops
