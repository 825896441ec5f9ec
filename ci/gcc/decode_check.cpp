// The decode kernel alone, built by any riscv64 C++ compiler, checked against
// a float64 reference: the quickest way to see whether a compiler builds
// csrc/kernels/decode.cpp right at one VLEN and optimisation level.
//
// No torch, no threads: the kernel's own source is included as it is and run
// through a one-worker pool. Build it like one RVV variant (the flags of
// cmake/RvvVariants.cmake), statically, and run it under qemu-riscv64 at the
// same VLEN:
//   g++ -std=c++17 -O2 -fPIC -DNDEBUG -static -march=rv64gcv_zvl256b -mabi=lp64d
//       -mrvv-vector-bits=zvl -DRVV_ATTN_VARIANT=vlen256 -DRVV_ATTN_VLEN=256
//       -I csrc ci/gcc/decode_check.cpp -o decode_check
//   qemu-riscv64 -cpu rv64,v=true,vlen=256,elen=64,vext_spec=v1.0 ./decode_check
// One line per dtype ("ok f32 ..." or "WRONG f16 ..."); the exit status is
// the number of wrong cases (capped at 100). `./ci/nox -s gcc-check` runs it
// for every compiler, level and VLEN (docs/gcc.md).
//
// The cases are what the GCC 14 fault needs: sequences of one token, of one
// KV block (kBlockN tokens) and around it, and of several blocks, with GQA,
// MHA, one KV head for six query heads, and a split sequence.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/decode.cpp"

namespace {

using rvv_attn::DecodeParams;
using rvv_attn::DType;
namespace kernel = rvv_attn::RVV_ATTN_VARIANT;

void one_worker(int64_t n, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  if (n > 0) body(ctx, 0, n);
}

// xorshift64: the same inputs on every compiler, in [-1, 1).
uint64_t state = 0x2545f4914f6cdd1dull;
float next_value() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return static_cast<float>(state >> 40) / 8388608.0f - 1.0f;
}

// Values of one dtype: the raw storage the kernel reads and the float each
// stored value means, which the reference uses.
struct Values {
  DType dtype;
  std::vector<float> exact;
  std::vector<uint16_t> half;  // bf16 or f16 bits

  Values(DType t, size_t n, bool random) : dtype(t), exact(n, 0.0f), half(n, 0) {
    for (size_t i = 0; i < n; ++i) {
      if (!random) continue;
      const float x = next_value();
      if (t == DType::Float32) {
        exact[i] = x;
      } else {
        half[i] = t == DType::BFloat16 ? kernel::vec::f32_to_bf16(x) : kernel::vec::f32_to_f16(x);
        exact[i] = at(i);
      }
    }
  }
  void* data() { return dtype == DType::Float32 ? static_cast<void*>(exact.data()) : half.data(); }
  double at(size_t i) const {
    if (dtype == DType::Float32) return exact[i];
    return dtype == DType::BFloat16 ? kernel::vec::bf16_to_f32(half[i]) : kernel::vec::f16_to_f32(half[i]);
  }
};

struct Shape {
  int64_t heads, heads_kv, head_dim, splits;
};

// Largest |kernel - reference| over the output of two sequences (the second
// 3 tokens shorter, read from another pool row through a shuffled token map).
double worst_error(DType dtype, const Shape& shape, int64_t len) {
  const int64_t batch = 2, H = shape.heads, Hkv = shape.heads_kv, D = shape.head_dim, S = shape.splits;
  const int64_t slots = batch * len + 5, cols = len + 2;
  Values q(dtype, batch * H * D, true), k(dtype, slots * Hkv * D, true), v(dtype, slots * Hkv * D, true);
  Values out(dtype, batch * H * D, false);
  std::vector<float> logits(batch * H * S * (D + 1), 0.0f);
  std::vector<int64_t> order(slots);
  for (int64_t i = 0; i < slots; ++i) order[i] = i;
  for (int64_t i = slots - 1; i > 0; --i) std::swap(order[i], order[static_cast<int64_t>(state++ % (i + 1))]);
  std::vector<int32_t> token_map(batch * cols, 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < len; ++t) token_map[b * cols + 1 + t] = static_cast<int32_t>(order[b * len + t]);
  const std::vector<int64_t> pool_rows = {1, 0}, first = {1, 1}, lens = {len, len > 3 ? len - 3 : len};

  DecodeParams p{};
  p.dtype = dtype;
  p.batch = batch, p.heads = H, p.heads_kv = Hkv, p.head_dim = D, p.head_dim_v = D, p.num_splits = S;
  p.query = q.data(), p.query_stride_b = H * D, p.query_stride_h = D;
  p.k_buffer = k.data(), p.k_stride_t = Hkv * D, p.k_stride_h = D;
  p.v_buffer = v.data(), p.v_stride_t = Hkv * D, p.v_stride_h = D;
  p.output = out.data(), p.output_stride_b = H * D, p.output_stride_h = D;
  p.attn_logits = logits.data();
  p.logits_stride_s = D + 1, p.logits_stride_h = S * (D + 1), p.logits_stride_b = H * S * (D + 1);
  p.req_to_token = token_map.data(), p.req_to_token_stride = cols;
  p.req_pool_indices = pool_rows.data(), p.kv_first = first.data(), p.kv_lens = lens.data();
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
  const rvv_attn::ThreadPool pool{one_worker};
  if (!kernel::decode_attention(p, pool)) return INFINITY;

  double worst = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    // Sequence b reads pool row pool_rows[b] of the token map, as the kernel does.
    const int32_t* row = token_map.data() + pool_rows[b] * cols + first[b];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      std::vector<double> weight(lens[b]);
      double top = -INFINITY, total = 0.0;
      for (int64_t t = 0; t < lens[b]; ++t) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += q.at((b * H + h) * D + d) * k.at((row[t] * Hkv + hk) * D + d);
        weight[t] = dot * p.sm_scale;
        top = std::max(top, weight[t]);
      }
      for (double& w : weight) total += (w = std::exp(w - top));
      for (int64_t d = 0; d < D; ++d) {
        double expected = 0.0;
        for (int64_t t = 0; t < lens[b]; ++t) expected += weight[t] * v.at((row[t] * Hkv + hk) * D + d);
        const double got = out.at((b * H + h) * D + d);
        const double error = std::fabs(got - expected / total);
        if (!(error <= worst)) worst = std::isnan(error) ? INFINITY : error;
      }
    }
  }
  return worst;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash (the GCC 14 fault's other face) keeps the lines so far
  const int64_t n = static_cast<int64_t>(kernel::vec::kBlockN);
  const Shape shapes[] = {{4, 4, 64, 1}, {8, 2, 128, 1}, {6, 1, 64, 2}, {2, 2, 128, 1}};
  const int64_t lengths[] = {1, n - 1, n, n + 1, 2 * n + 3, 4 * n + 5};
  struct Kind {
    DType dtype;
    const char* name;
    double tolerance;  // a few rounding steps of the output dtype (outputs are at most 1 in size)
  };
  const Kind kinds[] = {{DType::Float32, "f32", 1e-5}, {DType::BFloat16, "bf16", 1.6e-2}, {DType::Float16, "f16", 2e-3}};
  int wrong_total = 0;
  for (const Kind& kind : kinds) {
    int cases = 0, wrong = 0;
    double worst = 0.0;
    for (const Shape& shape : shapes)
      for (int64_t len : lengths) {
        const double error = worst_error(kind.dtype, shape, len);
        ++cases;
        worst = std::max(worst, error);
        if (!(error <= kind.tolerance)) {
          ++wrong;
          std::printf("  wrong: %s H=%lld H_kv=%lld D=%lld splits=%lld len=%lld error %.3g\n", kind.name,
                      static_cast<long long>(shape.heads), static_cast<long long>(shape.heads_kv),
                      static_cast<long long>(shape.head_dim), static_cast<long long>(shape.splits),
                      static_cast<long long>(len), error);
        }
      }
    std::printf("%s %s vlen=%d block=%lld cases=%d wrong=%d worst=%.3g\n", wrong ? "WRONG" : "ok", kind.name,
                RVV_ATTN_VLEN, static_cast<long long>(n), cases, wrong, worst);
    wrong_total += wrong;
  }
  return std::min(wrong_total, 100);
}
