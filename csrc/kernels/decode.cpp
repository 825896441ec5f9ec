// Decode attention: split-KV online softmax, then a log-sum-exp merge.
//
// Pass 1, one work item per (sequence, KV head, split): the G = H / H_kv
// query heads sharing the KV head walk the split's tokens in blocks of
// vec::kBlockN (one float32 register group of tokens). The heads run in
// passes of up to kPassHeads, whose accumulators stay in registers, so each
// cache vector loaded serves the whole pass (for G <= 4, the whole group):
//   scores = Q . K     K gathered through req_to_token as 32-bit words, each
//                      holding 2 columns (bf16/f16) or 4 (int8), widened in
//                      registers and fed to every head of the pass;
//   m' = max(m, max scores); p = exp(scores - m'); s = s*e^{m-m'} + sum p
//   acc = acc*e^{m-m'} + P . V   per chunk of Dv, each V row segment read
//                      straight from its cache row once for the pass;
// and the split stores acc/s and m + log s into attn_logits. Every loop
// runs at one vtype (the float32 group): loads and widening included.
// Pass 2, one work item per (sequence, query head): merge the non-empty
// splits weighted by exp(lse_i - max lse) and narrow into output.
//
// Scalar multipliers (q for Q.K, p for P.V) come from token-major or
// column-major scratch tables, so a pass's NH values sit at fixed offsets.
// Summation order is unchanged from a plain loop: each score adds the
// columns in order, each accumulator the tokens in order.
//
// int8 KV cache (p.kv_int8): the same code with the cache read through
// vec::KvWords/Int8Traits (sign extension, then integer -> float32). A
// static K scale is folded into the query's sm_scale and a static V scale
// into the final 1/l; with dynamic scales the block's per-token scales are
// gathered before the block's GEMMs ("pre-gather"), then applied once per
// head and block: the score vector times the K scales, and the
// probabilities times the V scales before P.V (the softmax sum uses the
// unscaled probabilities).
//
// One template over the dtype; vec.h supplies the per-dtype loads/stores
// and the RVV or portable operations, so every variant runs this code.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "kernels/kernel_api.h"
#include "kernels/variant.h"
#include "kernels/vec.h"

namespace RVV_ATTN_NS {
namespace {

using rvv_attn::DecodeParams;
using rvv_attn::DType;
using vec::kBlockN;
using vec::VF;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tokens [begin, end) of split ``s``: equal ceil-sized parts, so trailing
// splits of a short sequence are empty.
inline void split_range(int64_t len, int64_t splits, int64_t s, int64_t* begin, int64_t* end) {
  const int64_t per = (len + splits - 1) / splits;
  *begin = s * per < len ? s * per : len;
  *end = *begin + per < len ? *begin + per : len;
}

inline float* logits_row(const DecodeParams& p, int64_t b, int64_t h, int64_t s) {
  return p.attn_logits + b * p.logits_stride_b + h * p.logits_stride_h + s * p.logits_stride_s;
}

// Heads whose scores (and P.V accumulators) are computed together, sharing
// each K word and V row segment they load: with LMUL-4 registers, 4 score
// vectors + a gathered word + a widened column + 32-bit offsets fill 28 of the
// 32 vector registers. A group of G heads runs in passes of up to 4.
constexpr int64_t kPassHeads = 4;

// Per-worker scratch, carved out of one allocation.
struct Scratch {
  float* q;       // [G][D] query rows * q_scale; the pass of nh heads from g0 as [D][nh] at q + g0 * D
  float* acc;     // [G][Dv] unnormalized output
  float* scores;  // [kPassHeads][kBlockN] the current pass's block scores
  float* probs;   // [G][kBlockN] exp(score - m) of the current block; the pass of nh heads from g0 as [kBlockN][nh] at
                  // probs + g0 * kBlockN
  float* m;       // [G] running max
  float* l;       // [G] running sum
  float* alpha;   // [G] rescale factor of the current block
  int64_t* rows;  // [kBlockN] addresses of the block's V row segments
  int64_t* k_rows;  // [kBlockN] fp8: addresses of the block's K rows (then its V rows, for the NaN slow path)

  static size_t floats(const DecodeParams& p) {
    const size_t g = static_cast<size_t>(p.heads / p.heads_kv);
    const size_t d = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.head_dim_v);
    return g * (d + dv + kBlockN + 3) + kPassHeads * kBlockN;
  }
  bool allocate(const DecodeParams& p) {
    const size_t g = static_cast<size_t>(p.heads / p.heads_kv);
    const size_t d = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.head_dim_v);
    base = static_cast<float*>(std::malloc(floats(p) * sizeof(float) + 2 * kBlockN * sizeof(int64_t)));
    if (base == nullptr) return false;
    rows = reinterpret_cast<int64_t*>(base);  // first, so they are 8-byte aligned
    k_rows = rows + kBlockN;
    q = base + 4 * kBlockN;
    acc = q + g * d;
    scores = acc + g * dv;
    probs = scores + kPassHeads * kBlockN;
    m = probs + g * kBlockN;
    l = m + g;
    alpha = l + g;
    return true;
  }
  void release() { std::free(base); }
  float* base = nullptr;
};

// acc += w[K] * x for head K of a pass, if the pass has it (K < NH).
template <int K, int NH>
inline void fma_head(VF& acc, const float* w, const VF& x, size_t vl) {
  if constexpr (K < NH) acc = vec::fmacc_ta(acc, w[K], x, vl);
}

// s_h += w[h] * x for the NH heads of a pass (NH <= kPassHeads).
template <int NH>
inline void fma_heads(VF& s0, VF& s1, VF& s2, VF& s3, const float* w, VF x, size_t vl) {
  fma_head<0, NH>(s0, w, x, vl);
  fma_head<1, NH>(s1, w, x, vl);
  fma_head<2, NH>(s2, w, x, vl);
  fma_head<3, NH>(s3, w, x, vl);
}

template <int NH>
inline void store_heads(float* out, size_t stride, VF s0, VF s1, VF s2, VF s3, size_t vl) {
  vec::store(out, s0, vl);
  if constexpr (NH > 1) vec::store(out + stride, s1, vl);
  if constexpr (NH > 2) vec::store(out + 2 * stride, s2, vl);
  if constexpr (NH > 3) vec::store(out + 3 * stride, s3, vl);
}

template <DType T, vec::KvKind Kv>
struct Decode {
  using Tr = vec::Traits<T>;
  using Elem = typename Tr::Elem;
  using KvTr = vec::CacheTraits<T, Kv>;  // the cache's elements: Tr, int8 or e4m3 codes
  using KvElem = typename KvTr::Elem;
  using Words = vec::KvWords<T, Kv>;
  static constexpr int64_t kCols = Words::kCols;
  static constexpr bool kQuantized = Kv != vec::KvKind::Float;
  static constexpr bool kFp8 = Kv == vec::KvKind::Fp8;

  // Scores of a block for the NH heads of a pass, over the first
  // words * kCols columns, K read as 32-bit words (4-byte aligned rows):
  // out[h][i] = sum_d q[d][h] * K[token i][d]. q is the pass's [D][NH] table;
  // words >= 1.
  template <int NH, typename Idx>
  static void scores_by_words(const char* k_rows, Idx off, int64_t words, const float* q, size_t n, float* out) {
    if constexpr (vec::kColumnsAhead<T, Kv> && std::is_same_v<Idx, vec::VIdx32>) {
      scores_by_words_ahead<NH>(k_rows, off, words, q, n, out);
    } else {
      VF s0 = vec::zeros(), s1 = vec::zeros(), s2 = vec::zeros(), s3 = vec::zeros();
      // Two words per trip halve the loop bookkeeping (columns stay in order).
      for (const char* pairs_end = k_rows + 8 * (words / 2); k_rows != pairs_end; k_rows += 8, q += 2 * kCols * NH) {
        add_word<NH>(s0, s1, s2, s3, q, vec::gather_words(k_rows, off, n), n);
        add_word<NH>(s0, s1, s2, s3, q + kCols * NH, vec::gather_words(k_rows + 4, off, n), n);
      }
      if (words % 2 != 0) add_word<NH>(s0, s1, s2, s3, q, vec::gather_words(k_rows, off, n), n);
      store_heads<NH>(out, kBlockN, s0, s1, s2, s3, n);
    }
  }

  // scores_by_words software-pipelined for the variants where that helps
  // (vec::kColumnsAhead): each column is widened one column ahead of the
  // FMAs that use it, and the next word is gathered as soon as the current
  // word's last column is out, so on an in-order core no FMA waits on the
  // widening or the gather just before it. Same FMAs in the same order.
  template <int NH>
  static void scores_by_words_ahead(const char* k_rows, vec::VIdx32 off, int64_t words, const float* q, size_t n,
                                    float* out) {
    VF s0 = vec::zeros(), s1 = vec::zeros(), s2 = vec::zeros(), s3 = vec::zeros();
    vec::VWord w = vec::gather_words(k_rows, off, n);
    VF column = Words::template col<0>(w, n);
    const char* const last = k_rows + 4 * (words - 1);
    // Two words per trip halve the loop bookkeeping.
    for (; k_rows + 4 < last; k_rows += 8, q += 2 * kCols * NH) {
      add_word_ahead<NH, true>(s0, s1, s2, s3, q, w, column, k_rows + 4, off, n);
      add_word_ahead<NH, true>(s0, s1, s2, s3, q + kCols * NH, w, column, k_rows + 8, off, n);
    }
    if (k_rows != last) {
      add_word_ahead<NH, true>(s0, s1, s2, s3, q, w, column, k_rows + 4, off, n);
      q += kCols * NH;
    }
    add_word_ahead<NH, false>(s0, s1, s2, s3, q, w, column, nullptr, off, n);
    store_heads<NH>(out, kBlockN, s0, s1, s2, s3, n);
  }

  // The kCols columns of word w into the NH scores, its column 0 already in
  // `column`; if Next, gathers the word at `next` into w and leaves its
  // column 0 in `column`. Always inlined, so w and column are registers
  // before the loop is optimised: otherwise clang-19 keeps column in a stack
  // slot, a store and a reload per word.
  template <int NH, bool Next>
  __attribute__((always_inline)) static inline void add_word_ahead(VF& s0, VF& s1, VF& s2, VF& s3, const float* q,
                                                                   vec::VWord& w, VF& column, const char* next,
                                                                   vec::VIdx32 off, size_t n) {
    float p[kCols * kPassHeads];  // every scalar first, so no FMA waits on its load
    for (int k = 0; k < kCols * NH; ++k) p[k] = q[k];
    if constexpr (kCols == 1) {
      if constexpr (Next) w = vec::gather_words(next, off, n);
      fma_heads<NH>(s0, s1, s2, s3, p, column, n);
      if constexpr (Next) column = Words::template col<0>(w, n);
    } else {
      VF other = Words::template col<1>(w, n);
      if constexpr (kCols == 2 && Next) w = vec::gather_words(next, off, n);
      fma_heads<NH>(s0, s1, s2, s3, p, column, n);
      if constexpr (kCols == 2) {
        if constexpr (Next) column = Words::template col<0>(w, n);
        fma_heads<NH>(s0, s1, s2, s3, p + NH, other, n);
      } else {
        column = Words::template col<2>(w, n);
        fma_heads<NH>(s0, s1, s2, s3, p + NH, other, n);
        other = Words::template col<3>(w, n);
        if constexpr (Next) w = vec::gather_words(next, off, n);
        fma_heads<NH>(s0, s1, s2, s3, p + 2 * NH, column, n);
        if constexpr (Next) column = Words::template col<0>(w, n);
        fma_heads<NH>(s0, s1, s2, s3, p + 3 * NH, other, n);
      }
    }
  }

  // The kCols columns of one gathered word into the NH scores.
  template <int NH>
  static inline void add_word(VF& s0, VF& s1, VF& s2, VF& s3, const float* q, vec::VWord w, size_t n) {
    fma_heads<NH>(s0, s1, s2, s3, q, Words::template col<0>(w, n), n);
    if constexpr (kCols > 1) fma_heads<NH>(s0, s1, s2, s3, q + NH, Words::template col<1>(w, n), n);
    if constexpr (kCols > 2) fma_heads<NH>(s0, s1, s2, s3, q + 2 * NH, Words::template col<2>(w, n), n);
    if constexpr (kCols > 3) fma_heads<NH>(s0, s1, s2, s3, q + 3 * NH, Words::template col<3>(w, n), n);
  }

  // Adds columns [d0, D) one gathered column at a time (a K row not 4-byte
  // aligned, or the columns after the last whole word).
  template <int NH>
  static void scores_by_columns(const KvElem* k_rows, vec::VIdx off, int64_t d0, int64_t d_k, const float* q, size_t n,
                                float* out) {
    VF s0 = vec::load(out, n), s1 = s0, s2 = s0, s3 = s0;
    if constexpr (NH > 1) s1 = vec::load(out + kBlockN, n);
    if constexpr (NH > 2) s2 = vec::load(out + 2 * kBlockN, n);
    if constexpr (NH > 3) s3 = vec::load(out + 3 * kBlockN, n);
    for (int64_t d = d0; d < d_k; ++d) {
      // An fp8 column as the word path reads it: placed, not rebiased.
      if constexpr (kFp8) {
        fma_heads<NH>(s0, s1, s2, s3, q + d * NH, Words::gather(k_rows + d, off, n), n);
      } else {
        fma_heads<NH>(s0, s1, s2, s3, q + d * NH, KvTr::gather(k_rows + d, off, n), n);
      }
    }
    store_heads<NH>(out, kBlockN, s0, s1, s2, s3, n);
  }

  // acc_h = acc_h * alpha_h + sum_i probs[i][h] * V[token i][c : c + vl) for
  // the NH heads of a pass; rows[i] addresses V[token i][c]. acc is the
  // pass's first head's chunk, probs its [kBlockN][NH] table, alpha starts
  // at its first head. Each head adds the tokens in order.
  template <int NH>
  static void accumulate_pv(const int64_t* rows, const float* probs, size_t n, float* acc, int64_t d_v,
                            const float* alpha, size_t vl) {
    VF a0 = vec::mul(vec::load(acc, vl), alpha[0], vl), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (NH > 1) a1 = vec::mul(vec::load(acc + d_v, vl), alpha[1], vl);
    if constexpr (NH > 2) a2 = vec::mul(vec::load(acc + 2 * d_v, vl), alpha[2], vl);
    if constexpr (NH > 3) a3 = vec::mul(vec::load(acc + 3 * d_v, vl), alpha[3], vl);
    size_t i = 0;
    if constexpr (vec::kStagedWidening) {
      i = accumulate_pv_staged<NH>(rows, probs, n, a0, a1, a2, a3, vl);
      probs += i * NH;
    }
    // Two tokens per trip halve the loop bookkeeping.
    for (; i + 2 <= n; i += 2, probs += 2 * NH) {
      const VF v = Words::load(row_ptr(rows[i]), vl);
      const VF v_next = Words::load(row_ptr(rows[i + 1]), vl);
      fma_heads<NH>(a0, a1, a2, a3, probs, v, vl);
      fma_heads<NH>(a0, a1, a2, a3, probs + NH, v_next, vl);
    }
    if (i < n) fma_heads<NH>(a0, a1, a2, a3, probs, Words::load(row_ptr(rows[i]), vl), vl);
    store_heads<NH>(acc, static_cast<size_t>(d_v), a0, a1, a2, a3, vl);
  }

  // accumulate_pv's loop software-pipelined over pairs of tokens, for the
  // variants where that helps (vec::kStagedWidening): while the FMAs of
  // tokens i and i + 1 run, the rows of tokens i + 2 and i + 3 are fetched
  // and widened, each widening step placed between FMAs. An in-order core
  // stalls an FMA that waits on a widening issued just before it, and this
  // order keeps the FMA unit busy instead, with the same vector
  // instructions (the bookkeeping adds 1.6% at VLEN 256).
  // Returns how many tokens it added: all but at most one (none if n < 2).
  template <int NH>
  static size_t accumulate_pv_staged(const int64_t* rows, const float* probs, size_t n, VF& a0, VF& a1, VF& a2, VF& a3,
                                     size_t vl) {
    if (n < 2) return 0;
    VF v0 = Words::load(row_ptr(rows[0]), vl), v1 = Words::load(row_ptr(rows[1]), vl);
    size_t i = 0;
    for (; i + 4 <= n; i += 2, probs += 2 * NH) {
      // Every scalar operand first, so no FMA waits on its load.
      const KvElem* row0 = row_ptr(rows[i + 2]);
      const KvElem* row1 = row_ptr(rows[i + 3]);
      float p[2 * kPassHeads];
      for (int k = 0; k < 2 * NH; ++k) p[k] = probs[k];
      const typename Words::Raw next0 = Words::fetch(row0, vl);
      fma_head<0, NH>(a0, p, v0, vl);
      const typename Words::Raw next1 = Words::fetch(row1, vl);
      fma_head<1, NH>(a1, p, v0, vl);
      const typename Words::Half half0 = Words::widen_first(next0, vl);
      fma_head<2, NH>(a2, p, v0, vl);
      fma_head<3, NH>(a3, p, v0, vl);
      v0 = Words::widen_last(half0, vl);
      fma_head<0, NH>(a0, p + NH, v1, vl);
      const typename Words::Half half1 = Words::widen_first(next1, vl);
      fma_head<1, NH>(a1, p + NH, v1, vl);
      fma_head<2, NH>(a2, p + NH, v1, vl);
      fma_head<3, NH>(a3, p + NH, v1, vl);
      v1 = Words::widen_last(half1, vl);
    }
    fma_heads<NH>(a0, a1, a2, a3, probs, v0, vl);
    fma_heads<NH>(a0, a1, a2, a3, probs + NH, v1, vl);
    return i + 2;
  }

  static const KvElem* row_ptr(int64_t address) {
    return reinterpret_cast<const KvElem*>(static_cast<uintptr_t>(address));
  }

  template <typename Idx>
  static void pass_scores(int64_t nh, const char* k_rows, Idx off, int64_t words, const float* q, size_t n,
                          float* out) {
    switch (nh) {
      case 1: return scores_by_words<1>(k_rows, off, words, q, n, out);
      case 2: return scores_by_words<2>(k_rows, off, words, q, n, out);
      case 3: return scores_by_words<3>(k_rows, off, words, q, n, out);
      default: return scores_by_words<4>(k_rows, off, words, q, n, out);
    }
  }
  static void pass_scores_tail(int64_t nh, const KvElem* k_rows, vec::VIdx off, int64_t d0, int64_t d_k, const float* q,
                               size_t n, float* out) {
    switch (nh) {
      case 1: return scores_by_columns<1>(k_rows, off, d0, d_k, q, n, out);
      case 2: return scores_by_columns<2>(k_rows, off, d0, d_k, q, n, out);
      case 3: return scores_by_columns<3>(k_rows, off, d0, d_k, q, n, out);
      default: return scores_by_columns<4>(k_rows, off, d0, d_k, q, n, out);
    }
  }
  static void pass_pv(int64_t nh, const int64_t* rows, const float* probs, size_t n, float* acc, int64_t d_v,
                      const float* alpha, size_t vl) {
    switch (nh) {
      case 1: return accumulate_pv<1>(rows, probs, n, acc, d_v, alpha, vl);
      case 2: return accumulate_pv<2>(rows, probs, n, acc, d_v, alpha, vl);
      case 3: return accumulate_pv<3>(rows, probs, n, acc, d_v, alpha, vl);
      default: return accumulate_pv<4>(rows, probs, n, acc, d_v, alpha, vl);
    }
  }

  // The fp8 rebias (vec.h, e4m3_placed) folded into the query table of
  // ``count`` entries: all of 2^120 when the largest magnitude is below 2^7
  // (every entry stays finite, and each product with a placed code is the
  // unfolded product times an exact power of two, so the scores are the
  // same bit for bit), otherwise as much as keeps the largest entry below
  // 2^127. Returns the factor left over for the scores.
  static float fold_e4m3_rebias(float* table, int64_t count) {
    float top = 0.0f;
    for (int64_t c = 0; c < count;) {
      const size_t vl = vec::setvl(static_cast<size_t>(count - c));
      top = std::fmax(top, vec::reduce_max(vec::abs(vec::load(table + c, vl), vl), vl));
      c += static_cast<int64_t>(vl);
    }
    int shift = 120;
    // An infinite or NaN entry makes its scores inf or NaN whatever the fold.
    if (top >= 0x1p7f && top <= std::numeric_limits<float>::max()) {
      shift = 126 - (static_cast<int>(vec::f32_bits(top) >> 23) - 127);
    }
    const float table_factor = vec::bits_f32(static_cast<uint32_t>(shift + 127) << 23);
    for (int64_t c = 0; c < count;) {
      const size_t vl = vec::setvl(static_cast<size_t>(count - c));
      vec::store(table + c, vec::mul(vec::load(table + c, vl), table_factor, vl), vl);
      c += static_cast<int64_t>(vl);
    }
    return vec::bits_f32(static_cast<uint32_t>(120 - shift + 127) << 23);
  }

  // The slow path of an fp8 block with a NaN code (rare: the scan found
  // one). A K row with a NaN code makes the token's score NaN for every
  // head of the pass (sc.k_rows: the block's K row addresses).
  static void mark_nan_scores(Scratch& sc, int64_t d_k, int64_t nh, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const auto* row = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(sc.k_rows[i]));
      if (!std::any_of(row, row + d_k, vec::e4m3_is_nan)) continue;
      for (int64_t h = 0; h < nh; ++h) sc.scores[h * kBlockN + i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  // A V row's NaN code makes its column of every head's accumulator NaN,
  // whatever the token's probability (sc.k_rows: the V rows' addresses by now).
  static void mark_nan_columns(Scratch& sc, int64_t group, int64_t d_v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const auto* row = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(sc.k_rows[i]));
      for (int64_t c = 0; c < d_v; ++c) {
        if (!vec::e4m3_is_nan(row[c])) continue;
        for (int64_t g = 0; g < group; ++g) sc.acc[g * d_v + c] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }

  // Pass 1 for work item (b, kv head hk, split s).
  static void split(const DecodeParams& p, Scratch& sc, int64_t item) {
    const int64_t splits = p.num_splits;
    const int64_t b = item / (p.heads_kv * splits), hk = (item / splits) % p.heads_kv, s = item % splits;
    const int64_t group = p.heads / p.heads_kv, h0 = hk * group;
    const int64_t d_k = p.head_dim, d_v = p.head_dim_v;
    int64_t begin, end;
    split_range(p.kv_lens[b], splits, s, &begin, &end);

    if (begin >= end) {
      // log(0): the merge skips it; zeros keep the buffer free of garbage.
      for (int64_t g = 0; g < group; ++g) {
        float* out = logits_row(p, b, h0 + g, s);
        vec::fill_zero(out, d_v);
        out[d_v] = kNegInf;
      }
      return;
    }

    // Dynamic (NaN) scales are per token; static ones fold into q and 1/l.
    const vec::ScaleFold fold = vec::fold_scales<kQuantized>(p.scales, p.sm_scale);
    const bool k_dyn = fold.k_dynamic, v_dyn = fold.v_dynamic;
    const float q_scale = fold.q_scale, out_scale = fold.out_scale;
    for (int64_t g = 0; g < group; ++g) {
      const Elem* q = static_cast<const Elem*>(p.query) + b * p.query_stride_b + (h0 + g) * p.query_stride_h;
      const int64_t g0 = g / kPassHeads * kPassHeads, nh = std::min(kPassHeads, group - g0);
      float* q_t = sc.q + g0 * d_k + (g - g0);  // column d of head g at q_t[d * nh]
      for (int64_t c = 0; c < d_k;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_k - c));
        vec::store_strided(q_t + c * nh, nh * 4, vec::mul(Tr::load(q + c, vl), q_scale, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      sc.m[g] = kNegInf;
      sc.l[g] = 0.0f;
    }
    vec::fill_zero(sc.acc, group * d_v);
    // fp8: the cache is read placed (2^-120 of its values); 2^120 goes into
    // the query table (what it cannot take, into the scores) and into the
    // probabilities that multiply V.
    const float score_rebias = kFp8 ? fold_e4m3_rebias(sc.q, group * d_k) : 1.0f;

    const int64_t esz = static_cast<int64_t>(sizeof(KvElem));
    const bool map64 = p.req_to_token_is_int64;
    // The map entry of the split's key 0 is column kv_first[b] of the pool row.
    const char* map_row = static_cast<const char*>(p.req_to_token) +
                          (p.req_pool_indices[b] * p.req_to_token_stride + p.kv_first[b]) * (map64 ? 8 : 4);
    const char* k_rows = static_cast<const char*>(p.k_buffer) + hk * p.k_stride_h * esz;
    const char* v_rows = static_cast<const char*>(p.v_buffer) + hk * p.v_stride_h * esz;
    // K as 32-bit words needs every row 4-byte aligned; otherwise all columns go one by one.
    const bool aligned = reinterpret_cast<uintptr_t>(k_rows) % 4 == 0 && (p.k_stride_t * esz) % 4 == 0;
    const int64_t words = aligned ? d_k / kCols : 0;

    for (int64_t t0 = begin; t0 < end; t0 += static_cast<int64_t>(kBlockN)) {
      // The loop steps by kBlockN, so the block must be exactly min(end - t0, kBlockN) tokens. Asking for
      // more than VLMAX is not enough: for VLMAX < AVL < 2 * VLMAX, RVV 1.0 lets a CPU return any vl from
      // ceil(AVL / 2) up, and the tokens past it would be skipped.
      const size_t n = vec::setvl(static_cast<size_t>(std::min(end - t0, static_cast<int64_t>(kBlockN))));
      const void* slots = map_row + t0 * (map64 ? 8 : 4);

      // V row segments' addresses, for P.V below (and for the NaN scan).
      vec::store_offsets(sc.rows,
                         vec::row_offsets(slots, map64, p.v_stride_t * esz,
                                          static_cast<int64_t>(reinterpret_cast<uintptr_t>(v_rows)), n),
                         n);
      // fp8: the placed codes read NaN as a finite number, so each block's
      // rows are scanned for NaN codes first; a block that has one takes
      // the slow path below (score NaN for a K row with one, NaN output
      // columns for a V row's), as attention over the dequantized cache
      // would give.
      bool block_nan = false;
      if constexpr (kFp8) {
        vec::store_offsets(sc.k_rows,
                           vec::row_offsets(slots, map64, p.k_stride_t * esz,
                                            static_cast<int64_t>(reinterpret_cast<uintptr_t>(k_rows)), n),
                           n);
        block_nan = vec::any_e4m3_nan(sc.k_rows, d_k, sc.rows, d_v, n);
      }

      // Pre-gather the block's per-token scales (dynamic mode).
      VF k_scales = vec::zeros(), v_scales = vec::zeros();
      if (k_dyn) {
        k_scales = vec::Traits<DType::Float32>::gather(
            p.scales.k_scale_buf,
            vec::row_offsets(slots, map64, p.scales.k_scale_stride_t * 4, hk * p.scales.k_scale_stride_h * 4, n), n);
      }
      if (v_dyn) {
        v_scales = vec::Traits<DType::Float32>::gather(
            p.scales.v_scale_buf,
            vec::row_offsets(slots, map64, p.scales.v_scale_stride_t * 4, hk * p.scales.v_scale_stride_h * 4, n), n);
      }

      // Scores of each pass of heads (each K word gathered once per pass),
      // then the online-softmax update head by head.
      for (int64_t g0 = 0; g0 < group; g0 += kPassHeads) {
        const int64_t nh = std::min(kPassHeads, group - g0);
        const float* q = sc.q + g0 * d_k;
        const vec::VIdx k_off = vec::row_offsets(slots, map64, p.k_stride_t * esz, 0, n);
        if (words > 0) {
          if (vec::fits_u32(k_off, n)) {
            pass_scores(nh, k_rows, vec::narrow_offsets(k_off, n), words, q, n, sc.scores);
          } else {
            pass_scores(nh, k_rows, k_off, words, q, n, sc.scores);
          }
        } else {
          for (int64_t h = 0; h < nh; ++h) vec::store(sc.scores + h * kBlockN, vec::zeros(), n);
        }
        if (words * kCols < d_k) {
          pass_scores_tail(nh, reinterpret_cast<const KvElem*>(k_rows),
                           vec::row_offsets(slots, map64, p.k_stride_t * esz, 0, n), words * kCols, d_k, q, n,
                           sc.scores);
        }
        if (block_nan) mark_nan_scores(sc, d_k, nh, n);
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t g = g0 + h;
          VF score = vec::load(sc.scores + h * kBlockN, n);
          if (score_rebias != 1.0f) score = vec::mul(score, score_rebias, n);
          if (k_dyn) score = vec::mul(score, k_scales, n);
          if (p.logit_cap > 0.0f) score = vec::softcap(score, p.logit_cap, n);
          const float m_old = sc.m[g];
          const float block_max = vec::reduce_max(score, n);
          const float m_new = block_max > m_old ? block_max : m_old;
          const VF prob = vec::exp_nonpositive(vec::sub(score, m_new, n), n);  // score <= m_new, or NaN
          // m_old = -inf on the first block: nothing accumulated yet to rescale.
          const float alpha = m_old == kNegInf ? 0.0f : vec::exp_scalar(m_old - m_new);
          sc.l[g] = sc.l[g] * alpha + vec::reduce_sum(prob, n);
          sc.m[g] = m_new;
          sc.alpha[g] = alpha;
          const VF weight = v_dyn ? vec::mul(prob, v_scales, n) : kFp8 ? vec::mul(prob, vec::kE4m3Rebias, n) : prob;
          vec::store_strided(sc.probs + g0 * kBlockN + h, nh * 4, weight, n);
        }
      }

      // acc = acc * alpha + P . V, V read straight from the cache rows: per
      // chunk of Dv the block's row addresses (computed for the first chunk,
      // then moved on by the chunk's width), then each pass of heads.
      if (block_nan) std::copy(sc.rows, sc.rows + n, sc.k_rows);  // the V rows, kept for mark_nan_columns
      for (int64_t c = 0, rows_at = 0; c < d_v;) {                // rows_at: the column sc.rows addresses
        const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
        if (c != rows_at) {
          vec::add_to_offsets(sc.rows, (c - rows_at) * esz, n);
          rows_at = c;
        }
        for (int64_t g0 = 0; g0 < group; g0 += kPassHeads) {
          pass_pv(std::min(kPassHeads, group - g0), sc.rows, sc.probs + g0 * kBlockN, n, sc.acc + g0 * d_v + c, d_v,
                  sc.alpha + g0, vl);
        }
        c += static_cast<int64_t>(vl);
      }
      if (block_nan) mark_nan_columns(sc, group, d_v, n);
    }

    for (int64_t g = 0; g < group; ++g) {
      float* out = logits_row(p, b, h0 + g, s);
      const float inv = out_scale / sc.l[g];
      for (int64_t c = 0; c < d_v;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
        vec::store(out + c, vec::mul(vec::load(sc.acc + g * d_v + c, vl), inv, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      out[d_v] = sc.m[g] + std::log(sc.l[g]);
    }
  }

  // Pass 2 for work item (b, query head h). With a sink, exp(sink - M)
  // joins the denominator (M: the larger of the splits' max LSE and the
  // sink, so neither side overflows); a sequence with no key gives zeros.
  static void merge(const DecodeParams& p, int64_t item) {
    const int64_t b = item / p.heads, h = item % p.heads, d_v = p.head_dim_v;
    const int64_t len = p.kv_lens[b];
    float lse_max = kNegInf;
    for (int64_t s = 0; s < p.num_splits; ++s) {
      int64_t begin, end;
      split_range(len, p.num_splits, s, &begin, &end);
      if (begin < end) lse_max = std::fmax(lse_max, logits_row(p, b, h, s)[d_v]);
    }
    const bool sink = p.sinks != nullptr;
    const float top = sink ? std::fmax(lse_max, p.sinks[h]) : lse_max;
    float weight_sum = sink ? vec::exp_scalar(p.sinks[h] - top) : 0.0f;
    for (int64_t s = 0; s < p.num_splits; ++s) {
      int64_t begin, end;
      split_range(len, p.num_splits, s, &begin, &end);
      if (begin < end) weight_sum += vec::exp_scalar(logits_row(p, b, h, s)[d_v] - top);
    }
    // len = 0 (no key): nothing to weigh; zeros rather than 0/0.
    const float inv = len > 0 ? 1.0f / weight_sum : 0.0f;
    Elem* out = static_cast<Elem*>(p.output) + b * p.output_stride_b + h * p.output_stride_h;
    for (int64_t c = 0; c < d_v;) {
      const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
      VF a = vec::zeros();
      for (int64_t s = 0; s < p.num_splits; ++s) {
        int64_t begin, end;
        split_range(len, p.num_splits, s, &begin, &end);
        if (begin >= end) continue;
        const float* row = logits_row(p, b, h, s);
        a = vec::fmacc(a, vec::exp_scalar(row[d_v] - top), vec::load(row + c, vl), vl);
      }
      Tr::store(out + c, vec::mul(a, inv, vl), vl);
      c += static_cast<int64_t>(vl);
    }
  }

  struct Ctx {
    const DecodeParams* p;
    int failed;  // set (atomically) by a worker whose scratch allocation failed
  };

  static bool run(const DecodeParams& p, const rvv_attn::ThreadPool& pool) {
    Ctx ctx{&p, 0};
    pool.run(p.batch * p.heads_kv * p.num_splits, &ctx, [](void* c, int64_t begin, int64_t end) {
      Ctx& x = *static_cast<Ctx*>(c);
      Scratch sc;
      if (!sc.allocate(*x.p)) {
        __atomic_store_n(&x.failed, 1, __ATOMIC_RELAXED);
        return;
      }
      for (int64_t i = begin; i < end; ++i) split(*x.p, sc, i);
      sc.release();
    });
    if (ctx.failed) return false;
    pool.run(p.batch * p.heads, &ctx, [](void* c, int64_t begin, int64_t end) {
      const Ctx& x = *static_cast<Ctx*>(c);
      for (int64_t i = begin; i < end; ++i) merge(*x.p, i);
    });
    return true;
  }
};

template <DType T>
bool run_cache_kind(const DecodeParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.kv_int8) return Decode<T, vec::KvKind::Int8>::run(p, pool);
  if (p.kv_fp8) return Decode<T, vec::KvKind::Fp8>::run(p, pool);
  return Decode<T, vec::KvKind::Float>::run(p, pool);
}

}  // namespace

bool decode_attention(const rvv_attn::DecodeParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.batch == 0 || p.heads == 0) return true;
  switch (p.dtype) {
    case DType::Float32: return run_cache_kind<DType::Float32>(p, pool);
    case DType::BFloat16: return run_cache_kind<DType::BFloat16>(p, pool);
    case DType::Float16: return run_cache_kind<DType::Float16>(p, pool);
    case DType::Bytes: break;  // copied only, never attended (the binding refuses it)
  }
  return true;
}

}  // namespace RVV_ATTN_NS
