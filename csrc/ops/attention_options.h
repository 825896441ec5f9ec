// The four trailing arguments SGLang main passes to every attention
// operator (is_cross_attn, sliding_window_size, encoder_lens, sinks): their
// checks, shared by decode, extend and their int8 forms.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

// The options in an operator schema, after the operator's own arguments.
// Their defaults keep the 13-argument calls of older SGLang working.
#define RVV_ATTN_OPTION_ARGS \
  "bool is_cross_attn=False, int sliding_window_size=-1, Tensor? encoder_lens=None, Tensor? sinks=None"
// Extend's options add speculative decoding's tree mask and whether the new
// tokens attend each other causally (SGLang 0.5.23's last two arguments).
#define RVV_ATTN_EXTEND_OPTION_ARGS RVV_ATTN_OPTION_ARGS ", Tensor? tree_mask=None, bool is_causal=True"

namespace rvv_attn::ops {

struct AttentionOptions {
  bool is_cross_attn = false;
  int64_t sliding_window_size = -1;
  std::optional<at::Tensor> encoder_lens;
  std::optional<at::Tensor> sinks;
  // Extend only (decode takes neither).
  std::optional<at::Tensor> tree_mask;
  bool is_causal = true;
};

// Checked options, in the form the kernels take them.
struct CheckedOptions {
  bool cross = false;
  int64_t window = 0;       // keys visible to a query, its own included; 0: no window
  at::Tensor encoder_lens;  // int64 [B], contiguous, values >= 0; undefined when not given
  at::Tensor sinks;         // float32 [H], contiguous, finite; undefined when not given

  // Sequence b's encoder length (0 without encoder_lens).
  int64_t encoder_len(int64_t b) const { return encoder_lens.defined() ? encoder_lens.data_ptr<int64_t>()[b] : 0; }
  const float* sinks_data() const { return sinks.defined() ? sinks.data_ptr<float>() : nullptr; }
};

// Cross attention needs encoder_lens and no window; encoder_lens is [B]
// int32/int64 >= 0; sinks is [H], float32 or the query's dtype, finite.
// Reads no tensor but encoder_lens and sinks.
CheckedOptions check_options(const char* op, const AttentionOptions& opts, int64_t batch, int64_t heads,
                             const char* query_name, const at::Tensor& query);

}  // namespace rvv_attn::ops

namespace rvv_attn::ops {

// The map columns each sequence's keys come from, contract applied:
// sequence b reads columns [firsts[b], firsts[b] + lens[b]) of its pool row.
// Both int64 [B], contiguous, bounded by req_to_token's width.
struct KeyColumns {
  at::Tensor firsts, lens;
};

// Decode: self attention reads the last min(L, W) of the sequence's L =
// seq_lens[b] tokens (all L without a window), after its encoder_lens[b]
// encoder tokens; cross attention reads the encoder_lens[b] encoder tokens.
// ``seq`` is seq_lens as int64, ``min_len`` (with its reason) the least L
// self attention accepts.
KeyColumns decode_key_columns(const char* op, const CheckedOptions& opts, const at::Tensor& seq, int64_t width,
                              int64_t min_len, const char* min_len_reason);

// Extend: stage 1 (the cached keys) reads the prefix P = seq_lens[b] -
// extend_seq_lens[b] after the encoder tokens, from the first key any new
// token's window reaches (P - W + 1), or with cross attention the encoder
// tokens. ``stage1`` gets the number of stage-1 keys per sequence; the
// columns returned also cover the new tokens' entries when
// ``with_new_tokens`` (the int8 operator writes them to the cache).
KeyColumns extend_key_columns(const char* op, const CheckedOptions& opts, const at::Tensor& seq,
                              const at::Tensor& prefix, int64_t width, bool with_new_tokens, at::Tensor* stage1);

}  // namespace rvv_attn::ops
