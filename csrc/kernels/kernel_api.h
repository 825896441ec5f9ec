// The narrow interface between the torch binding and the kernels.
//
// Kernel translation units include this header, <riscv_vector.h> and the
// standard library only: no torch headers, so each per-VLEN compile takes
// seconds, not the best part of a minute (ci/tests/test_csrc_layout.py
// checks it). The torch-facing layer (csrc/ops/) validates every input and
// hands the kernels raw pointers, element strides and a thread pool.
#pragma once

#include <cstdint>

namespace rvv_attn {

// Element type of query/key/value/output tensors. Bytes: raw 1-byte
// elements that are only copied (an fp8 cache stored as uint8, which
// store_cache_cpu writes); no attention kernel takes it.
enum class DType : int32_t { Float32 = 0, BFloat16 = 1, Float16 = 2, Bytes = 3 };

inline int dtype_bytes(DType t) { return t == DType::Float32 ? 4 : t == DType::Bytes ? 1 : 2; }

// The torch thread pool, passed in so kernels need no torch header.
// ``run(n, ctx, body)`` calls ``body(ctx, begin, end)`` over a partition of
// [0, n); ``body`` must not throw.
struct ThreadPool {
  void (*run)(int64_t n, void* ctx, void (*body)(void* ctx, int64_t begin, int64_t end));
};

// decode_set_kv_buffer: for each of the ``batch`` entries b,
// k_buffer[loc[b], h, :] = key[r, h, :] with r = rows[b] (r = b when
// ``rows`` is null), and V alike unless ``value`` is null (an MLA cache,
// whose V is a view of the K rows). All strides are in elements; the last
// dimension of every tensor is dense. ``loc`` has been checked: every slot is
// in range and none repeats, so entries may be written in any order and on
// any thread. (A call whose slots repeat reaches the kernel with only each
// slot's last entry: ops/kv_write.h, keep_last_write_per_slot.)
struct KvWriteParams {
  DType dtype;
  int64_t batch, heads_kv, head_dim, head_dim_v;
  const void* key;
  int64_t key_stride_b, key_stride_h;
  const void* value;
  int64_t value_stride_b, value_stride_h;
  void* k_buffer;
  int64_t k_buffer_stride_t, k_buffer_stride_h;
  void* v_buffer;
  int64_t v_buffer_stride_t, v_buffer_stride_h;
  const int64_t* loc;
  const int64_t* rows;
};

// The scales of an int8 KV cache, shared by the decode, extend and KV-write
// parameters. A static scale (k_scale finite, > 0) applies to every token
// and the buffer is not touched; k_scale = NaN (dynamic) means one scale per
// (slot, KV head) in k_scale_buf [max_total_tokens, H_kv] (strides in
// elements), each read checked finite and > 0 by the binding, each written
// by the KV write. Likewise V.
struct Int8Scales {
  float* k_scale_buf;
  int64_t k_scale_stride_t, k_scale_stride_h;
  float* v_scale_buf;
  int64_t v_scale_stride_t, v_scale_stride_h;
  float k_scale, v_scale;
};

// decode_attention_cpu after its KV write: one new query token per sequence
// attends over a run of its cached tokens. All strides are in elements; the
// last dimension of every tensor is dense. Every index (pool rows, lengths,
// map entries) has been checked.
//
// Sequence b attends the kv_lens[b] keys in map columns
// [kv_first[b], kv_first[b] + kv_lens[b]) of its pool row: the binding has
// folded the encoder offset, the sliding window and cross attention into
// that range. kv_lens[b] may be 0 (cross attention over no encoder token):
// the output is then zeros.
struct DecodeParams {
  DType dtype;  // of query, k/v buffers and output
  int64_t batch, heads, heads_kv, head_dim, head_dim_v;
  int64_t num_splits;  // attn_logits.size(2)
  const void* query;
  int64_t query_stride_b, query_stride_h;
  const void* k_buffer;
  int64_t k_stride_t, k_stride_h;
  const void* v_buffer;
  int64_t v_stride_t, v_stride_h;
  void* output;
  int64_t output_stride_b, output_stride_h;
  // [B, H, num_splits, Dv + 1] float32 scratch: a split's normalized partial
  // output, then its log-sum-exp (-inf for an empty split).
  float* attn_logits;
  int64_t logits_stride_b, logits_stride_h, logits_stride_s;
  const void* req_to_token;  // int64 if req_to_token_is_int64, else int32
  bool req_to_token_is_int64;
  int64_t req_to_token_stride;  // between rows
  const int64_t* req_pool_indices;
  const int64_t* kv_first;  // [B] map column of the first attended key
  const int64_t* kv_lens;   // [B] keys attended
  float sm_scale;
  float logit_cap;  // 0: no soft cap
  // Attention sinks, [H] float32 (null: none): exp(sinks[h] - m) joins the
  // softmax denominator of head h, unscaled and uncapped.
  const float* sinks;
  // int8 KV cache (the *_int8_cpu operators): k_buffer/v_buffer hold
  // int8, scaled as ``scales`` says; all zero/false otherwise.
  bool kv_int8;
  // float8_e4m3fn KV cache (the *_fp8_cpu operators): k_buffer/v_buffer
  // hold e4m3 codes, value = e4m3 * scales.k_scale (v_scale), both static
  // (finite, > 0; the scale buffers null). A NaN code reads as NaN.
  bool kv_fp8;
  Int8Scales scales;
};

// ---- extend attention (prefill / chunked prefill) --------------------------
// Everything here has been validated by csrc/ops/extend_attention.cpp: every
// length, start row, pool row and cache slot is in range, extend ranges do not
// overlap, and the arena holds ``workers`` slices of extend_arena_bytes().
struct ExtendParams {
  DType dtype;
  int64_t batch, heads, heads_kv, head_dim, head_dim_v;
  float sm_scale;   // finite
  float logit_cap;  // >= 0; 0 disables the soft cap
  // [T, H, D] / [T, H_kv, D] / [T, H_kv, Dv] / [T, H, Dv]; element strides.
  const void* q;
  int64_t q_stride_t, q_stride_h;
  const void* k;
  int64_t k_stride_t, k_stride_h;
  const void* v;
  int64_t v_stride_t, v_stride_h;
  void* o;
  int64_t o_stride_t, o_stride_h;
  // [max_total_tokens, H_kv, D/Dv] cache, read only.
  const void* k_buffer;
  int64_t k_buffer_stride_t, k_buffer_stride_h;
  const void* v_buffer;
  int64_t v_buffer_stride_t, v_buffer_stride_h;
  // req_to_token is int32 or int64, [pool rows, context], row stride in elements.
  const void* req_to_token;
  bool req_to_token_is_int64;
  int64_t req_to_token_stride;
  const int64_t* req_pool_indices;  // [B]
  // Stage 1 (the cached keys) of sequence b reads prefix_lens[b] keys from
  // map columns [kv_first[b], kv_first[b] + prefix_lens[b]): its prefix
  // (seq_lens - extend_seq_lens; after the encoder offset, and without the
  // keys no query row's window reaches), or with ``cross`` its encoder
  // tokens. Stage 2 attends the new tokens causally, unless ``cross``.
  const int64_t* kv_first;      // [B]
  const int64_t* prefix_lens;   // [B]
  const int64_t* extend_lens;   // [B] query rows
  const int64_t* extend_start;  // [B] first query (and output) row
  // Stage 2's keys: rows [new_key_start[b], new_key_start[b] + new_key_lens[b])
  // of k/v. Extend: its own new tokens (extend_start, extend_lens). Dense
  // varlen attention (flash_attn_varlen_func) has separate key sequences.
  const int64_t* new_key_start;  // [B]
  const int64_t* new_key_lens;   // [B]
  // Stage 2's mask: query row m sees new keys 0..m (top-left aligned), or
  // all of them when false.
  bool causal;
  // Speculative decoding's tree mask (null: none), replacing ``causal``:
  // every sequence has tree_mask_len new tokens, and new token m of
  // sequence b sees new key n iff tree_mask[(b * len + m) * len + n] != 0
  // (its prefix in full). No window, no cross attention with it.
  const uint8_t* tree_mask;
  int64_t tree_mask_len;
  // Sliding window (0: off): new token m sees the keys whose decoder
  // position lies in [p - window + 1, p], p its own position; stage-1 key i
  // sits at position i - prefix_lens[b] relative to the first new token.
  int64_t window;
  bool cross;  // cross attention: stage 1 only, no causal mask, no window
  // Attention sinks, [H] float32 (null: none), as in DecodeParams.
  const float* sinks;
  // Query-block work list: sequence b owns query blocks
  // [qblock_offsets[b], qblock_offsets[b+1]); with BLOCK_M from extend_blocking().
  const int64_t* qblock_offsets;  // [B + 1]
  // Scratch: ``workers`` slices of extend_arena_bytes(head_dim, head_dim_v)
  // bytes each, 64-byte aligned; worker w owns slice w for the whole call.
  void* arena;
  int64_t workers;
  // int8 KV cache (extend_attention_int8_cpu): the prefix is int8 with
  // ``scales``; the new tokens have already been written (quantized) to the
  // cache. Stage 2 reads them from k/v, the float values as given, unless
  // new_tokens_from_cache (k/v were int8 themselves): then from their cache
  // slots req_to_token[row, prefix + i], with the cache's scales.
  // All zero/false for a float cache.
  bool kv_int8;
  bool new_tokens_from_cache;
  // float8_e4m3fn KV cache: the prefix holds e4m3 codes with static scales
  // (as in DecodeParams); the new tokens are float, read from k/v, as given
  // or, with new_tokens_scaled, in the cache's units (the scales apply to
  // them too: SGLang 0.5.23 divides them by the scales before the call).
  bool kv_fp8;
  bool new_tokens_scaled;
  Int8Scales scales;
};

// The score-tile shape of a variant (see csrc/kernels/extend_tiling.h).
struct ExtendBlocking {
  int64_t block_m;  // query rows per tile
  int64_t block_n;  // keys per tile
};

// The int8 KV-cache write: entry i copies row kv.rows[i] (or i when
// kv.rows is null) of key/value into cache slot kv.loc[i], quantizing
// when key/value are float. kv.k_buffer/kv.v_buffer hold int8; kv.dtype is
// the float dtype of key/value unless src_int8 (then they are int8 and are
// copied as they are). Scales as in Int8Scales: static (> 0) quantizes
// with that scale and leaves the scale buffer alone; NaN (dynamic) computes
// max|x| / 127 per row (1.0 for an all-zero row), quantizes with it and
// stores it at [slot, head] unless src_int8. Quantization: x / scale in
// float32, clamped to [-127, 127], rounded to nearest, ties to even.
// Slots are distinct and in range; float inputs are finite (checked).
struct KvQuantWriteParams {
  KvWriteParams kv;
  bool src_int8;
  Int8Scales scales;
};

// The float8_e4m3fn KV-cache write: entry i quantizes row kv.rows[i] (or
// i) of key/value (kv.dtype, float) into slot kv.loc[i] of kv.k_buffer /
// kv.v_buffer (e4m3 codes) as SGLang's fp8 pool does: x / k_scale (v_scale)
// rounded to kv.dtype, then torch's conversion (``saturate``: see
// Fp8ConvertParams). Slots are distinct and in range; scales finite, > 0.
struct Fp8KvWriteParams {
  KvWriteParams kv;
  float k_scale, v_scale;
  bool saturate;
};

// A run of map entries whose dynamic int8 scales the attention will read:
// slots[0 .. count) (int32 or int64, already range-checked) index rows of
// scale_buf; each row has ``heads`` scales at stride_h (strides in
// elements).
struct ScaleScanParams {
  const void* slots;
  bool slots_int64;
  int64_t count;
  const float* scale_buf;
  int64_t stride_t, stride_h, heads;
};

// Rows of float new keys or values about to be quantized into an int8
// cache: row rows[i] (row i when rows is null) for i < count, each with
// ``heads`` vectors of ``dim`` contiguous elements of ``dtype`` at strides
// stride_t, stride_h (in elements).
struct FiniteScanParams {
  DType dtype;
  const void* data;
  const int64_t* rows;
  int64_t count;
  int64_t stride_t, stride_h, heads, dim;
};

// The float8_e4m3fn conversion operators, over ``count`` contiguous
// elements (src and dst do not overlap):
// dequantize: dst (dtype) = e4m3(src) * scale in float32, narrowed to dtype
//   with round-to-nearest-even;
// quantize: dst = e4m3(x / scale), as SGLang's fp8 pool quantizes: x / scale
//   computed in float32 and rounded to src's dtype (the pool divides in
//   place), then torch's conversion, whose overflow saturates to +-448 or
//   gives NaN as ``saturate`` says (vec.h, f32_to_e4m3).
// scale is finite and > 0 (checked by the binding).
struct Fp8ConvertParams {
  DType dtype;  // of the float side
  int64_t count;
  const void* src;
  void* dst;
  float scale;
  bool saturate;
};

// One compiled variant: the portable build or an RVV build for one VLEN.
struct KernelTable {
  const char* name;  // "portable", "vlen256", ...
  int vlen;          // VLEN in bits the code is only valid at; 0 for portable
  void (*write_kv)(const KvWriteParams&, const ThreadPool&);
  // Returns false if a worker could not allocate its scratch memory (the
  // outputs are then incomplete); true otherwise.
  bool (*decode_attention)(const DecodeParams&, const ThreadPool&);
  // extend attention: tile shape, per-worker scratch size, the kernel.
  ExtendBlocking (*extend_blocking)();
  int64_t (*extend_arena_bytes)(int64_t head_dim, int64_t head_dim_v);
  void (*extend_attention)(const ExtendParams&, const ThreadPool&);
  void (*write_kv_int8)(const KvQuantWriteParams&, const ThreadPool&);
  // Index of the first entry of the run with a scale (any head) that is not
  // finite and > 0 (NaN included); ``count`` when every scale is usable.
  int64_t (*first_unusable_scale)(const ScaleScanParams&);
  // Position (i * heads + h) * dim + d of the first element (in that order)
  // that is not finite (inf or NaN); -1 when every element is finite.
  int64_t (*first_non_finite)(const FiniteScanParams&);
  void (*fp8_dequantize)(const Fp8ConvertParams&, const ThreadPool&);
  void (*fp8_quantize)(const Fp8ConvertParams&, const ThreadPool&);
  void (*write_kv_fp8)(const Fp8KvWriteParams&, const ThreadPool&);
  // Tokens per decode KV block (one online-softmax step): tests aim at it.
  int64_t decode_block_tokens;
};

}  // namespace rvv_attn
