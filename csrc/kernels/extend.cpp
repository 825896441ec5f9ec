// extend_attention_cpu kernel: causal attention of each sequence's new
// tokens over its cached prefix plus the new tokens themselves.
//
// Work item: (sequence, query head, query block of BLOCK_M rows). Items are
// handed out through one atomic counter, heaviest (last) query blocks first,
// so the causal imbalance between blocks evens out across workers. Each
// worker owns one arena slice (see ArenaLayout) for the whole call.
//
// Per item, flash-attention style with an online softmax:
//   Q tile  qt[D x BLOCK_M]   f32, pre-multiplied by sm_scale, transposed
//           so the multipliers of neighbouring rows are adjacent
//   stage 1 prefix keys, BLOCK_N at a time, gathered through req_to_token
//   stage 2 new tokens, BLOCK_N at a time; the causal limit is applied only
//           to blocks that cross the diagonal
//   per block: K^T tile kt[D x BLOCK_N] (gathered, widened, transposed),
//           score tile s[BLOCK_M x BLOCK_N] = q . kt (D wide-vector FMAs
//           per row, two rows sharing each K^T load), per row: cap, block
//           max, alpha = exp(m_old - m_new), p = exp(s - m_new),
//           l = l*alpha + sum(p); then the V block v[BLOCK_N x Dv] and
//           acc[r] = acc[r]*alpha + sum_j p[j] v[j], two rows' accumulator
//           chunks held in registers so each V load feeds both.
//   finish  o = acc / l, narrowed with round-to-nearest-even.
//
// Where the instructions go (why the blocking is what it is): every FMA of
// both GEMMs takes its multiplier from a scalar register loaded from the
// tile (flw), so what the loops cost per query-key pair is set by how many
// lanes one scalar multiplier feeds (a whole wide vector of keys in Q.K, a
// wide vector of Dv in P.V) and how many rows share each vector load.
//
// int8 KV cache (p.kv_int8): the prefix is read through vec::Int8Traits.
// An fp8 cache (p.kv_fp8) goes the same way through vec::E4m3Codes, its
// static scales applied like an int8 cache's with float new tokens.
// Dynamic scales are gathered per block before its GEMMs and applied once
// per query row: the row's scores times the K scales, its probabilities
// times the V scales (after the softmax sum, which needs the unscaled ones).
// Stage 2 attends the float k_extend/v_extend rows as given (the binding
// has also written them, quantized, to the cache for later steps), so a
// static scale applies to stage 1 only: it is applied like a dynamic one,
// as a constant per-token scale. Only when the new tokens are int8 already
// (p.new_tokens_from_cache) does stage 2 read them from their cache slots;
// then every key is int8 and static scales fold into sm_scale and the final
// 1/l instead.
//
// A row's causal limit is a prefix of the block's keys (keys k0..q_index),
// so masking is a shorter vector length for that row: no mask vector, no
// -inf arithmetic, and a row that sees nothing of a block skips it (its
// scores are not even computed).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/extend_tiling.h"
#include "kernels/kernel_api.h"
#include "kernels/variant.h"
#include "kernels/vec.h"

namespace RVV_ATTN_NS {
namespace {

constexpr int64_t BM = ExtendTiling::block_m;
constexpr int64_t BN = ExtendTiling::block_n;

// ---- scratch arena ---------------------------------------------------------

// Byte offsets of every buffer in one worker's arena slice. arena_layout()
// is the only place sizes are computed: extend_arena_bytes() reports its
// total to the binding, which allocates workers * total once per call.
struct ArenaLayout {
  int64_t q;    // [D x BLOCK_M]      Q tile transposed, f32, pre-scaled: q[d*BM + r]
  int64_t kt;   // [D x BLOCK_N]      K block transposed: kt[d*BN + j] = K[j][d]
  int64_t s;    // [BLOCK_M x BLOCK_N] scores, then probabilities
  int64_t v;    // [BLOCK_N x Dv]     V block, f32
  int64_t acc;  // [BLOCK_M x Dv]     unnormalised output v'
  int64_t m;    // [BLOCK_M]          running max per row
  int64_t l;    // [BLOCK_M]          running sum per row
  int64_t total;
};

constexpr int64_t kAlign = 64;  // cache line; also the binding's allocation alignment

constexpr ArenaLayout arena_layout(int64_t head_dim, int64_t head_dim_v) {
  ArenaLayout a{};
  int64_t off = 0;
  auto take = [&off](int64_t bytes) {
    const int64_t at = off;
    off += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  };
  a.q = take(BM * head_dim * 4);
  a.kt = take(head_dim * BN * 4);
  a.s = take(BM * BN * 4);
  a.v = take(BN * head_dim_v * 4);
  a.acc = take(BM * head_dim_v * 4);
  a.m = take(BM * 4);
  a.l = take(BM * 4);
  a.total = off;
  return a;
}

struct Scratch {
  float* q;
  float* kt;
  float* s;
  float* v;
  float* acc;
  float* m;
  float* l;
};

Scratch carve(void* base, const ArenaLayout& a) {
  char* p = static_cast<char*>(base);
  return Scratch{reinterpret_cast<float*>(p + a.q),   reinterpret_cast<float*>(p + a.kt),
                 reinterpret_cast<float*>(p + a.s),   reinterpret_cast<float*>(p + a.v),
                 reinterpret_cast<float*>(p + a.acc), reinterpret_cast<float*>(p + a.m),
                 reinterpret_cast<float*>(p + a.l)};
}

// ---- where a block's keys come from ------------------------------------------

// Both sources hand out byte offsets of key rows (for the indexed loads that
// build K^T) and row pointers (for the V block).

// Prefix keys: key i of the sequence lives in cache slot map[i]
// (map = req_to_token's row for the sequence; int32 or int64).
template <typename E>
struct PrefixRows {
  const E* k;  // k_buffer at the KV head
  int64_t k_row_bytes;
  const E* v;  // v_buffer at the KV head
  int64_t v_st;
  const void* map;
  bool map_int64;
  vec::VIdx k_offsets(int64_t i0, size_t n) const { return slot_offsets(i0, n, k_row_bytes, 0); }
  // Byte offsets slot(i) * row_bytes + base_bytes for keys i0 .. i0 + n.
  vec::VIdx slot_offsets(int64_t i0, size_t n, int64_t row_bytes, int64_t base_bytes) const {
    const void* m = static_cast<const char*>(map) + i0 * (map_int64 ? 8 : 4);
    return vec::row_offsets(m, map_int64, row_bytes, base_bytes, n);
  }
  const E* v_row(int64_t i) const {
    const int64_t slot = map_int64 ? static_cast<const int64_t*>(map)[i] : static_cast<const int32_t*>(map)[i];
    return v + slot * v_st;
  }
};

// New tokens: key i is row i of the sequence's extend range.
template <typename E>
struct ExtendRows {
  const E* k;  // k_extend at the sequence's first row and the KV head
  int64_t k_row_bytes;
  const E* v;
  int64_t v_st;
  vec::VIdx k_offsets(int64_t i0, size_t n) const { return vec::strided_offsets(k_row_bytes, i0 * k_row_bytes, n); }
  const E* v_row(int64_t i) const { return v + i * v_st; }
};

// ---- row operations on the tiles ---------------------------------------------

// kt[d*BN + j] = K[k0 + j][d] for j < nb: one indexed load per d gathers
// column d of the block's K rows, already transposed and widened to f32, a
// vec::VF of keys (half a key block) at a time.
template <typename Tr, typename Src>
void gather_k_transposed(float* kt, const Src& src, int64_t k0, int64_t nb, int64_t head_dim) {
  for (int64_t j0 = 0; j0 < nb;) {
    const size_t vl = vec::setvl(static_cast<size_t>(nb - j0));
    const vec::VIdx off = src.k_offsets(k0 + j0, vl);
    for (int64_t d = 0; d < head_dim; ++d) vec::store(kt + d * BN + j0, Tr::gather(src.k + d, off, vl), vl);
    j0 += static_cast<int64_t>(vl);
  }
}

// The two vector widths the GEMMs run at: a wide vector (LMUL 8) for full
// key blocks and V chunks, a narrow one (vec::VF, LMUL 4) when what is left
// fits it (a partial block, the last columns of Dv, or Dv = VLEN/8), so a
// short row does not occupy (and count as) a full wide register group.
struct Wide {
  using V = vec::VW;
  static constexpr size_t kLanes = vec::kWideLanes;
  static size_t setvl(size_t n) { return vec::setvl_wide(n); }
  static V load(const float* p, size_t vl) { return vec::load_wide(p, vl); }
  static void store(float* p, const V& x, size_t vl) { vec::store_wide(p, x, vl); }
  static V mul(const V& x, float a, size_t vl) { return vec::mul_wide(x, a, vl); }
  static V fmacc(const V& acc, float a, const V& x, size_t vl) { return vec::fmacc_wide(acc, a, x, vl); }
};
struct Narrow {
  using V = vec::VF;
  static constexpr size_t kLanes = vec::kLanes;
  static size_t setvl(size_t n) { return vec::setvl(n); }
  static V load(const float* p, size_t vl) { return vec::load(p, vl); }
  static void store(float* p, const V& x, size_t vl) { vec::store(p, x, vl); }
  static V mul(const V& x, float a, size_t vl) { return vec::mul(x, a, vl); }
  static V fmacc(const V& acc, float a, const V& x, size_t vl) { return vec::fmacc_ta(acc, a, x, vl); }
};

// Score rows s[i*BN + j] = sum_d qt[d*BM + i] * kt[d*BN + j] for R query
// rows i < R and keys j < vl: the R rows (R <= 3: their accumulators and a
// K^T row fill the register file) share each K^T row load, their
// multipliers are adjacent in the transposed Q tile (one pointer, constant
// offsets), and two d per iteration halve the loop bookkeeping.
template <typename W, int R>
void score_rows(float* s, const float* qt, const float* kt, size_t vl, int64_t head_dim) {
  static_assert(R >= 1 && R <= 3, "three wide accumulators and one K^T row fill the registers");
  const typename W::V first = W::load(kt, vl);
  typename W::V a0 = W::mul(first, qt[0], vl), a1, a2;
  if constexpr (R >= 2) a1 = W::mul(first, qt[1], vl);
  if constexpr (R >= 3) a2 = W::mul(first, qt[2], vl);
  const float* q = qt + BM;
  const float* k = kt + BN;
  int64_t d = 1;
  for (; d + 2 <= head_dim; d += 2, q += 2 * BM, k += 2 * BN) {
    const typename W::V k0 = W::load(k, vl);
    a0 = W::fmacc(a0, q[0], k0, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, q[1], k0, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, q[2], k0, vl);
    const typename W::V k1 = W::load(k + BN, vl);
    a0 = W::fmacc(a0, q[BM], k1, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, q[BM + 1], k1, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, q[BM + 2], k1, vl);
  }
  if (d < head_dim) {
    const typename W::V k0 = W::load(k, vl);
    a0 = W::fmacc(a0, q[0], k0, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, q[1], k0, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, q[2], k0, vl);
  }
  W::store(s, a0, vl);
  if constexpr (R >= 2) W::store(s + BN, a1, vl);
  if constexpr (R >= 3) W::store(s + 2 * BN, a2, vl);
}

// The score tile: rows r < rows, keys j < min(nb, limit + r) (row r's
// causal limit; limit >= nb for a block every row sees in full). A key
// block is one wide vector (vec::VW), so each scalar multiplier feeds
// kWideLanes keys; a row group stops at the keys its last row sees. Only
// those lanes of the score rows are written (the FMAs are tail-agnostic);
// everything after reads no further.
void score_tile(float* s, const float* qt, const float* kt, int64_t rows, int64_t nb, int64_t limit, int64_t head_dim) {
  auto keys = [&](int64_t last_row) { return static_cast<size_t>(limit + last_row < nb ? limit + last_row : nb); };
  int64_t r = 0;
  for (; r + 3 <= rows; r += 3) {
    const size_t n = keys(r + 2);
    if (n <= Narrow::kLanes) {
      score_rows<Narrow, 3>(s + r * BN, qt + r, kt, Narrow::setvl(n), head_dim);
    } else {
      score_rows<Wide, 3>(s + r * BN, qt + r, kt, Wide::setvl(n), head_dim);
    }
  }
  // One or two rows left: narrow or wide as their keys need.
  if (rows - r == 2) {
    const size_t n = keys(r + 1);
    if (n <= Narrow::kLanes) {
      score_rows<Narrow, 2>(s + r * BN, qt + r, kt, Narrow::setvl(n), head_dim);
    } else {
      score_rows<Wide, 2>(s + r * BN, qt + r, kt, Wide::setvl(n), head_dim);
    }
  } else if (rows - r == 1) {
    const size_t n = keys(r);
    if (n <= Narrow::kLanes) {
      score_rows<Narrow, 1>(s + r * BN, qt + r, kt, Narrow::setvl(n), head_dim);
    } else {
      score_rows<Wide, 1>(s + r * BN, qt + r, kt, Wide::setvl(n), head_dim);
    }
  }
}

// One online-softmax step for a row's first ``n`` scores (n >= 1): applies
// the cap, updates the running max *m and sum *l, leaves p = exp(s - m_new)
// in s and returns alpha = exp(m_old - m_new), the factor the row's
// accumulator must be rescaled by. The row (up to a wide vector of keys) is
// handled a vec::VF at a time: a first pass finds the block max (storing
// the capped or scaled scores back), a second takes the exponentials.
// With ``k_sc`` / ``v_sc`` (int8 cache, per-token scales; null when absent),
// the scores are first multiplied by the keys' scales, and the
// probabilities stored in s by the values' scales; the sum l is unscaled.
// With ``shown`` (a tree mask's row; null when absent), the keys whose byte
// is 0 get score -inf after the cap, so probability 0; at least one key of
// the row must be shown.
float online_softmax_step(float* s, int64_t n, float logit_cap, float* m, float* l, const float* k_sc,
                          const float* v_sc, const uint8_t* shown = nullptr) {
  float block_max = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    vec::VF x = vec::load(s + c, vl);
    if (k_sc != nullptr) x = vec::mul(x, vec::load(k_sc + c, vl), vl);
    if (logit_cap > 0) x = vec::softcap(x, logit_cap, vl);
    if (shown != nullptr) x = vec::hide_unshown(x, shown + c, vl);
    if (k_sc != nullptr || logit_cap > 0 || shown != nullptr) vec::store(s + c, x, vl);
    const float chunk_max = vec::reduce_max(x, vl);
    block_max = chunk_max > block_max ? chunk_max : block_max;
    c += static_cast<int64_t>(vl);
  }
  const float m_new = block_max > *m ? block_max : *m;
  // exp(-inf) = 0 on a row's first step: the empty accumulator stays 0.
  const float alpha = vec::exp_scalar(*m - m_new);
  float sum = 0.0f;
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    const vec::VF pv = vec::exp_nonpositive(vec::sub(vec::load(s + c, vl), m_new, vl), vl);  // s <= m_new
    sum += vec::reduce_sum(pv, vl);
    vec::store(s + c, v_sc != nullptr ? vec::mul(pv, vec::load(v_sc + c, vl), vl) : pv, vl);
    c += static_cast<int64_t>(vl);
  }
  *l = *l * alpha + sum;
  *m = m_new;
  return alpha;
}

// acc[i] = acc[i] * alpha[i] + sum_{j < n[i]} p[i][j] * v[j] (p[i] = s + i*BN)
// over one chunk of vl <= kWideLanes columns, for R <= 3 rows whose
// accumulator chunks stay in registers across the block's keys: each V
// chunk load feeds the R rows, each scalar probability a wide vector.
// Causal rows differ in n: keys all R rows see go through the group, the
// rest through each row alone.
template <typename W, int R>
void accumulate_rows(float* acc, const float* alpha, const float* p, const int64_t* n, const float* v, int64_t Dv,
                     size_t vl) {
  static_assert(R >= 1 && R <= 3, "three wide accumulators and one V chunk fill the registers");
  typename W::V a0 = W::mul(W::load(acc, vl), alpha[0], vl), a1, a2;
  int64_t all = n[0];
  if constexpr (R >= 2) {
    a1 = W::mul(W::load(acc + Dv, vl), alpha[1], vl);
    all = n[1] < all ? n[1] : all;
  }
  if constexpr (R >= 3) {
    a2 = W::mul(W::load(acc + 2 * Dv, vl), alpha[2], vl);
    all = n[2] < all ? n[2] : all;
  }
  const float* vj = v;
  int64_t j = 0;
  for (; j + 2 <= all; j += 2, vj += 2 * Dv) {
    const typename W::V x0 = W::load(vj, vl);
    a0 = W::fmacc(a0, p[j], x0, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, p[BN + j], x0, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, p[2 * BN + j], x0, vl);
    const typename W::V x1 = W::load(vj + Dv, vl);
    a0 = W::fmacc(a0, p[j + 1], x1, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, p[BN + j + 1], x1, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, p[2 * BN + j + 1], x1, vl);
  }
  if (j < all) {
    const typename W::V x0 = W::load(vj, vl);
    a0 = W::fmacc(a0, p[j], x0, vl);
    if constexpr (R >= 2) a1 = W::fmacc(a1, p[BN + j], x0, vl);
    if constexpr (R >= 3) a2 = W::fmacc(a2, p[2 * BN + j], x0, vl);
  }
  for (int64_t t = all; t < n[0]; ++t) a0 = W::fmacc(a0, p[t], W::load(v + t * Dv, vl), vl);
  W::store(acc, a0, vl);
  if constexpr (R >= 2) {
    for (int64_t t = all; t < n[1]; ++t) a1 = W::fmacc(a1, p[BN + t], W::load(v + t * Dv, vl), vl);
    W::store(acc + Dv, a1, vl);
  }
  if constexpr (R >= 3) {
    for (int64_t t = all; t < n[2]; ++t) a2 = W::fmacc(a2, p[2 * BN + t], W::load(v + t * Dv, vl), vl);
    W::store(acc + 2 * Dv, a2, vl);
  }
}

// Rows first .. rows - 1 of one chunk of columns, three at a time.
template <typename W>
void accumulate_tile_chunk(float* acc, const float* alpha, const float* s, const int64_t* n, int64_t first,
                           int64_t rows, const float* v, int64_t Dv, size_t vl) {
  int64_t r = first;
  for (; r + 3 <= rows; r += 3) accumulate_rows<W, 3>(acc + r * Dv, alpha + r, s + r * BN, n + r, v, Dv, vl);
  if (rows - r == 2) accumulate_rows<W, 2>(acc + r * Dv, alpha + r, s + r * BN, n + r, v, Dv, vl);
  if (rows - r == 1) accumulate_rows<W, 1>(acc + r * Dv, alpha + r, s + r * BN, n + r, v, Dv, vl);
}

// For every row r < rows: acc[r] = acc[r] * alpha[r] + sum_{j < n[r]}
// p[r][j] * v[j] (p[r] = s + r*BN; a row with n[r] = 0 has alpha 1), a
// chunk of kWideLanes columns (the last one narrow if it fits) and three
// rows at a time. Rows that see none
// of the block (the first rows of a block crossing the diagonal) are
// skipped.
void rescale_accumulate_tile(float* acc, const float* alpha, const float* s, const int64_t* n, int64_t rows,
                             const float* v, int64_t head_dim_v) {
  const int64_t Dv = head_dim_v;
  int64_t first = 0;
  while (first < rows && n[first] == 0) ++first;
  for (int64_t c = 0; c < Dv;) {
    const size_t left = static_cast<size_t>(Dv - c);
    if (left <= Narrow::kLanes) {
      accumulate_tile_chunk<Narrow>(acc + c, alpha, s, n, first, rows, v + c, Dv, Narrow::setvl(left));
      break;
    }
    const size_t vl = Wide::setvl(left);
    accumulate_tile_chunk<Wide>(acc + c, alpha, s, n, first, rows, v + c, Dv, vl);
    c += static_cast<int64_t>(vl);
  }
}

// dst[0:n] = widen(src[0:n]).
template <typename Tr>
void load_row(float* dst, const typename Tr::Elem* src, int64_t n) {
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    vec::store(dst + c, Tr::load(src + c, vl), vl);
    c += static_cast<int64_t>(vl);
  }
}

// dst[i*BM] = widen(src[i]) * scale for i < n: a query row into column
// dst of the transposed Q tile.
template <typename Tr>
void load_row_scaled_transposed(float* dst, const typename Tr::Elem* src, int64_t n, float scale) {
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    vec::store_strided(dst + c * BM, BM * 4, vec::mul(Tr::load(src + c, vl), scale, vl), vl);
    c += static_cast<int64_t>(vl);
  }
}

// dst[0:n] = narrow(src[0:n] * scale), round to nearest even.
template <typename Tr>
void store_row_scaled(typename Tr::Elem* dst, const float* src, int64_t n, float scale) {
  for (int64_t c = 0; c < n;) {
    const size_t vl = vec::setvl(static_cast<size_t>(n - c));
    Tr::store(dst + c, vec::mul(vec::load(src + c, vl), scale, vl), vl);
    c += static_cast<int64_t>(vl);
  }
}

// ---- one work item -------------------------------------------------------------

struct Item {
  const rvv_attn::ExtendParams* p;
  Scratch w;
  int64_t rows;       // query rows in this block (<= BLOCK_M)
  bool k_dyn, v_dyn;  // int8 cache with per-token K / V scales
  int64_t hkv;        // the KV head
  // int8 cache, static scales not folded: applied per block as constants
  // (0: none).
  float k_const, v_const;
  // The tree mask's row of the item's first query (null: no tree mask);
  // row r's at tree_rows + r * p->tree_mask_len.
  const uint8_t* tree_rows;
};

// Attend the item's rows to keys [k0, k0 + nb) of ``src``. ``diag`` < 0 for a
// block every row sees in full; otherwise row r may see keys up to index
// diag + r (stage 2: diag = the first row's index among the new tokens).
// With a sliding window, row r sees keys from index low + r on (keys before
// it get probability 0; a row that sees none of the block skips it).
// Tr: the traits of the source's elements (the cache's for an int8 cache).
// kQ8: the source is an int8 cache (PrefixRows), so dynamic scales apply.
// kWindowed: a sliding window is set. A compile-time flag so that the
// per-row window bookkeeping costs nothing in the common, unwindowed call.
// ``tree``: the block is of new tokens and the item has a tree mask.
template <typename Tr, bool kQ8, bool kWindowed, typename Src>
void attend_block(const Item& it, const Src& src, int64_t k0, int64_t nb, int64_t diag, int64_t low,
                  bool tree = false) {
  const rvv_attn::ExtendParams& p = *it.p;
  const Scratch& w = it.w;
  const int64_t Dv = p.head_dim_v;
  gather_k_transposed<Tr>(w.kt, src, k0, nb, p.head_dim);
  // Pre-gather the block's per-token scales before its GEMMs.
  float k_scales[BN], v_scales[BN];
  const float* k_sc = nullptr;
  const float* v_sc = nullptr;
  if constexpr (kQ8) {
    for (int64_t j0 = 0; j0 < nb;) {
      const size_t vl = vec::setvl(static_cast<size_t>(nb - j0));
      using F32 = vec::Traits<rvv_attn::DType::Float32>;
      if (it.k_dyn) {
        vec::store(k_scales + j0,
                   F32::gather(p.scales.k_scale_buf,
                               src.slot_offsets(k0 + j0, vl, p.scales.k_scale_stride_t * 4,
                                                it.hkv * p.scales.k_scale_stride_h * 4),
                               vl),
                   vl);
      } else if (it.k_const > 0.0f) {
        vec::store(k_scales + j0, vec::splat(it.k_const, vl), vl);
      }
      if (it.v_dyn) {
        vec::store(v_scales + j0,
                   F32::gather(p.scales.v_scale_buf,
                               src.slot_offsets(k0 + j0, vl, p.scales.v_scale_stride_t * 4,
                                                it.hkv * p.scales.v_scale_stride_h * 4),
                               vl),
                   vl);
      } else if (it.v_const > 0.0f) {
        vec::store(v_scales + j0, vec::splat(it.v_const, vl), vl);
      }
      j0 += static_cast<int64_t>(vl);
    }
    if (it.k_dyn || it.k_const > 0.0f) k_sc = k_scales;
    if (it.v_dyn || it.v_const > 0.0f) v_sc = v_scales;
  }
  // Rows before first_row see none of a block that crosses the diagonal
  // (it lies in their future): their scores are never needed.
  // Row r sees keys j < limit + r of the block (all nb when limit >= nb).
  const int64_t first_row = diag >= 0 && k0 > diag ? k0 - diag : 0;
  const int64_t limit = diag >= 0 ? diag - k0 + 1 : nb;
  score_tile(w.s + first_row * BN, w.q + first_row, w.kt, it.rows - first_row, nb, limit + first_row, p.head_dim);
  for (int64_t j = 0; j < nb; ++j) load_row<Tr>(w.v + j * Dv, src.v_row(k0 + j), Dv);
  float alpha[BM];
  int64_t seen[BM];  // keys of the block each row sees
  for (int64_t r = 0; r < it.rows; ++r) {
    int64_t n = nb;
    if (diag >= 0) {
      const int64_t last = diag + r - k0;  // the row's last visible key, relative to k0
      n = last < 0 ? 0 : (last + 1 < nb ? last + 1 : nb);
    }
    // With a window, the row's first visible key (relative to k0): the
    // keys before it get probability 0 and stay out of the softmax step.
    int64_t first = 0;
    if constexpr (kWindowed) {
      if (low + r > k0) {
        first = low + r - k0;
        if (first >= n) {
          n = 0;
        } else {
          vec::fill_zero(w.s + r * BN, first);
        }
      }
    }
    // The tree mask's bytes of this row for the block's keys; a row the
    // mask shows none of them sees nothing of the block.
    const uint8_t* shown = tree ? it.tree_rows + r * p.tree_mask_len + k0 : nullptr;
    if (shown != nullptr && std::none_of(shown, shown + n, [](uint8_t b) { return b != 0; })) n = 0;
    seen[r] = n;
    // A row that sees nothing of the block (all of it in the row's future,
    // or before its window, or hidden by the tree mask) keeps its state:
    // alpha 1 and no keys.
    if (n == 0) {
      alpha[r] = 1.0f;
    } else if (shown != nullptr) {
      alpha[r] = online_softmax_step(w.s + r * BN, n, p.logit_cap, &w.m[r], &w.l[r], k_sc, v_sc, shown);
    } else if constexpr (kWindowed) {
      alpha[r] =
          online_softmax_step(w.s + r * BN + first, n - first, p.logit_cap, &w.m[r], &w.l[r],
                              k_sc != nullptr ? k_sc + first : nullptr, v_sc != nullptr ? v_sc + first : nullptr);
    } else {
      alpha[r] = online_softmax_step(w.s + r * BN, n, p.logit_cap, &w.m[r], &w.l[r], k_sc, v_sc);
    }
  }
  rescale_accumulate_tile(w.acc, alpha, w.s, seen, it.rows, w.v, Dv);
}

// Stage 2 of an item whose first query row is new token m0: new tokens
// 0 .. m0 + rows - 1 (the last row's own index), causally; with a window
// W, from m0 - W + 1 on (the first row's oldest visible key: no row of the
// item sees an older one, so those blocks are not visited at all).
// Without ``causal`` (dense attention), every row sees all ``new_keys``;
// causally, the keys past the last row's own index are never visited.
// With a tree mask, every row visits every new key and the mask decides.
template <typename Tr, bool kQ8, bool kWindowed, typename Src>
void attend_new_tokens(const Item& it, const Src& src, int64_t m0, int64_t new_keys) {
  const bool tree = it.tree_rows != nullptr;
  const bool causal = it.p->causal && !tree;
  const int64_t keys = causal && m0 + it.rows < new_keys ? m0 + it.rows : new_keys;
  const int64_t low = m0 - it.p->window + 1;
  for (int64_t k0 = kWindowed && low > 0 ? low : 0; k0 < keys; k0 += BN) {
    const int64_t nb = keys - k0 < BN ? keys - k0 : BN;
    // Only a block holding a key past the first row's own index needs the
    // causal limit; the blocks before it are seen in full by every row.
    attend_block<Tr, kQ8, kWindowed>(it, src, k0, nb, causal && k0 + nb - 1 > m0 ? m0 : -1, low, tree);
  }
}

// Stage 1: prefix keys from ``low`` on (all of them without a window).
template <typename Tr, bool kQ8, bool kWindowed, typename Src>
void attend_prefix(const Item& it, const Src& src, int64_t prefix, int64_t low) {
  for (int64_t k0 = kWindowed && low > 0 ? low : 0; k0 < prefix; k0 += BN) {
    attend_block<Tr, kQ8, kWindowed>(it, src, k0, prefix - k0 < BN ? prefix - k0 : BN, -1, low);
  }
}

template <rvv_attn::DType DT, vec::KvKind Kv>
void run_item(const rvv_attn::ExtendParams& p, const Scratch& w, int64_t b, int64_t h, int64_t qb) {
  using Tr = vec::Traits<DT>;
  using E = typename Tr::Elem;
  using KvTr = vec::CacheTraits<DT, Kv>;         // the cache's elements: Tr, int8 or e4m3 codes (exact)
  constexpr bool Q8 = Kv != vec::KvKind::Float;  // a quantized cache: its scales apply
  using KvE = typename KvTr::Elem;
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const int64_t ext = p.extend_lens[b], prefix = p.prefix_lens[b];
  const int64_t m0 = qb * BM;
  const int64_t rows = ext - m0 < BM ? ext - m0 : BM;
  const int64_t hkv = h / (p.heads / p.heads_kv);
  const int64_t start = p.extend_start[b];
  const int64_t row0 = start + m0;  // first query's row in q_extend / o_extend
  const int64_t elem = static_cast<int64_t>(sizeof(E)), kv_elem = static_cast<int64_t>(sizeof(KvE));
  // Quantized cache: dynamic (NaN, int8) scales are per token; static ones
  // fold into the query's scale and the output's 1/l when they apply to
  // every key (all of them int8, or fp8 new tokens in the cache's units),
  // and are applied to the prefix alone when the new tokens are float.
  const bool all_int8 = Q8 && p.new_tokens_from_cache;
  const bool scales_everywhere = all_int8 || (Q8 && p.new_tokens_scaled);
  const vec::ScaleFold fold =
      scales_everywhere ? vec::fold_scales<true>(p.scales, p.sm_scale) : vec::fold_scales<false>(p.scales, p.sm_scale);
  const bool k_dyn = Q8 && p.scales.k_scale != p.scales.k_scale;
  const bool v_dyn = Q8 && p.scales.v_scale != p.scales.v_scale;
  const float q_scale = fold.q_scale, out_scale = fold.out_scale;
  const float k_const = Q8 && !scales_everywhere && !k_dyn ? p.scales.k_scale : 0.0f;
  const float v_const = Q8 && !scales_everywhere && !v_dyn ? p.scales.v_scale : 0.0f;

  // Scores come out of the tile already scaled; the cap, if any, is applied
  // per row by vec::softcap (cap * tanh(s / cap)).
  const E* q = static_cast<const E*>(p.q) + row0 * p.q_stride_t + h * p.q_stride_h;
  for (int64_t r = 0; r < rows; ++r) {
    load_row_scaled_transposed<Tr>(w.q + r, q + r * p.q_stride_t, D, q_scale);
    w.m[r] = -std::numeric_limits<float>::infinity();
    w.l[r] = 0.f;
    vec::fill_zero(w.acc + r * Dv, Dv);
  }
  const uint8_t* tree_rows =
      p.tree_mask != nullptr ? p.tree_mask + (b * p.tree_mask_len + m0) * p.tree_mask_len : nullptr;
  const Item it{&p, w, rows, k_dyn, v_dyn, hkv, k_const, v_const, tree_rows};

  // Stage 1: the cached prefix, all of it visible to every row.
  const PrefixRows<KvE> pre{
      static_cast<const KvE*>(p.k_buffer) + hkv * p.k_buffer_stride_h,
      p.k_buffer_stride_t * kv_elem,
      static_cast<const KvE*>(p.v_buffer) + hkv * p.v_buffer_stride_h,
      p.v_buffer_stride_t,
      static_cast<const char*>(p.req_to_token) +
          (p.req_pool_indices[b] * p.req_to_token_stride + p.kv_first[b]) * (p.req_to_token_is_int64 ? 8 : 4),
      p.req_to_token_is_int64};
  // With a window W, row r (position prefix + m0 + r) sees prefix keys from
  // prefix + m0 + r - W + 1 on; the blocks before the first row's limit are
  // skipped.
  const bool windowed = p.window > 0;
  const int64_t low = prefix + m0 - p.window + 1;
  if (windowed) {
    attend_prefix<KvTr, Q8, true>(it, pre, prefix, low);
  } else {
    attend_prefix<KvTr, Q8, false>(it, pre, prefix, low);
  }

  // Stage 2: new tokens 0 .. m0 + rows - 1 (the last row's own index):
  // from k_extend/v_extend, or, when they were int8, from their cache slots.
  // Cross attention has no stage 2: its keys are the encoder's alone.
  if (!p.cross && all_int8) {
    PrefixRows<KvE> cached = pre;
    cached.map = static_cast<const char*>(pre.map) + prefix * (p.req_to_token_is_int64 ? 8 : 4);
    if (windowed) {
      attend_new_tokens<KvTr, Q8, true>(it, cached, m0, p.new_key_lens[b]);
    } else {
      attend_new_tokens<KvTr, Q8, false>(it, cached, m0, p.new_key_lens[b]);
    }
  } else if (!p.cross) {
    const int64_t key0 = p.new_key_start[b];
    const ExtendRows<E> nw{static_cast<const E*>(p.k) + key0 * p.k_stride_t + hkv * p.k_stride_h, p.k_stride_t * elem,
                           static_cast<const E*>(p.v) + key0 * p.v_stride_t + hkv * p.v_stride_h, p.v_stride_t};
    if (windowed) {
      attend_new_tokens<Tr, false, true>(it, nw, m0, p.new_key_lens[b]);
    } else {
      attend_new_tokens<Tr, false, false>(it, nw, m0, p.new_key_lens[b]);
    }
  }

  // A row that saw a key has l >= 1 (its max contributes exp(0)); one that
  // saw none (cross attention over no encoder token) has l = 0 and a zero
  // accumulator, and gets zeros. A sink adds exp(sink - m) to l.
  // Without cross attention, a window or a tree mask, every row sees all
  // prefix keys and at least new key 0, so with any key at all and no sinks the plain loop
  // needs neither test (they cost ~10 instructions per row).
  E* o = static_cast<E*>(p.o) + row0 * p.o_stride_t + h * p.o_stride_h;
  if (!p.cross && !windowed && p.sinks == nullptr && p.tree_mask == nullptr && prefix + p.new_key_lens[b] > 0) {
    for (int64_t r = 0; r < rows; ++r) {
      store_row_scaled<Tr>(o + r * p.o_stride_t, w.acc + r * Dv, Dv, out_scale / w.l[r]);
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool any = w.l[r] > 0.0f;
    const float l = p.sinks != nullptr && any ? w.l[r] + vec::exp_scalar(p.sinks[h] - w.m[r]) : w.l[r];
    store_row_scaled<Tr>(o + r * p.o_stride_t, w.acc + r * Dv, Dv, any ? out_scale / l : 0.0f);
  }
}

template <rvv_attn::DType DT, vec::KvKind Kv>
void run_typed(const rvv_attn::ExtendParams& p, const rvv_attn::ThreadPool& pool) {
  struct Ctx {
    const rvv_attn::ExtendParams* p;
    ArenaLayout layout;
    int64_t items;
    int64_t next;  // shared work counter (atomic builtins: no std::atomic in kernel TUs)
  } ctx{&p, arena_layout(p.head_dim, p.head_dim_v), p.qblock_offsets[p.batch] * p.heads, 0};

  auto body = [](void* c, int64_t begin, int64_t end) {
    Ctx& x = *static_cast<Ctx*>(c);
    const rvv_attn::ExtendParams& q = *x.p;
    for (int64_t worker = begin; worker < end; ++worker) {
      const Scratch w = carve(static_cast<char*>(q.arena) + worker * x.layout.total, x.layout);
      for (;;) {
        const int64_t n = __atomic_fetch_add(&x.next, 1, __ATOMIC_RELAXED);
        if (n >= x.items) break;
        // Reverse order: later query blocks (more keys) start first.
        const int64_t item = x.items - 1 - n;
        const int64_t block = item / q.heads, h = item % q.heads;
        // The sequence owning flat query block ``block``:
        // offsets[lo] <= block < offsets[hi], narrowed by bisection.
        int64_t lo = 0, hi = q.batch;
        while (hi - lo > 1) {
          const int64_t mid = (lo + hi) / 2;
          (q.qblock_offsets[mid] <= block ? lo : hi) = mid;
        }
        run_item<DT, Kv>(q, w, lo, h, block - q.qblock_offsets[lo]);
      }
    }
  };
  pool.run(p.workers, &ctx, body);
}

}  // namespace

rvv_attn::ExtendBlocking extend_blocking() { return {BM, BN}; }

int64_t extend_arena_bytes(int64_t head_dim, int64_t head_dim_v) { return arena_layout(head_dim, head_dim_v).total; }

namespace {
template <rvv_attn::DType DT>
void run_cache_kind(const rvv_attn::ExtendParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.kv_int8) return run_typed<DT, vec::KvKind::Int8>(p, pool);
  if (p.kv_fp8) return run_typed<DT, vec::KvKind::Fp8>(p, pool);
  run_typed<DT, vec::KvKind::Float>(p, pool);
}
}  // namespace

void extend_attention(const rvv_attn::ExtendParams& p, const rvv_attn::ThreadPool& pool) {
  switch (p.dtype) {
    case rvv_attn::DType::Float32: return run_cache_kind<rvv_attn::DType::Float32>(p, pool);
    case rvv_attn::DType::BFloat16: return run_cache_kind<rvv_attn::DType::BFloat16>(p, pool);
    case rvv_attn::DType::Float16: return run_cache_kind<rvv_attn::DType::Float16>(p, pool);
    case rvv_attn::DType::Bytes: return;  // copied only, never attended (the binding refuses it)
  }
}

}  // namespace RVV_ATTN_NS
