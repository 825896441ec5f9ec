#include "ops/overlap.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace rvv_attn::overlap {
namespace {

// A view as a set of byte ranges: element (i_0, ..., i_k) covers
// [base + sum i_j * stride_j, + itemsize). Dimensions of size 1 are dropped,
// stride-0 dimensions are kept apart (they repeat elements), the rest are
// sorted by stride, outermost first.
struct Layout {
  intptr_t base = 0;
  int64_t itemsize = 1;
  std::vector<int64_t> size, stride;  // bytes; outermost first
  bool repeats = false;               // a dimension of size > 1 with stride 0
  bool empty = false;

  // Bytes spanned by one index of dimension k (its inner dimensions).
  int64_t span_from(size_t k) const {
    int64_t s = itemsize;
    for (size_t j = k; j < size.size(); ++j) s += (size[j] - 1) * stride[j];
    return s;
  }
  int64_t span() const { return span_from(0); }
};

Layout layout_of(const at::Tensor& t) {
  Layout l;
  l.itemsize = static_cast<int64_t>(t.element_size());
  l.empty = t.numel() == 0;
  if (l.empty) return l;
  l.base = reinterpret_cast<intptr_t>(t.data_ptr());
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) == 0) {
      l.repeats = true;
      continue;
    }
    dims.emplace_back(t.stride(d) * l.itemsize, t.size(d));
  }
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [s, n] : dims) {
    l.stride.push_back(s);
    l.size.push_back(n);
  }
  return l;
}

// Each dimension's stride covers everything inside it: no two elements share
// a byte. (Sufficient, and true of every layout torch makes without expand
// or as_strided.)
bool nested(const Layout& l) {
  for (size_t k = 0; k < l.size.size(); ++k) {
    if (l.stride[k] < l.span_from(k + 1)) return false;
  }
  return true;
}

// A bounded search: each call spends from ``budget`` and gives up (Unknown)
// when it runs out, so a pathological layout costs a fixed amount of time.
struct Search {
  int64_t budget = 1 << 20;
  bool exhausted = false;
  bool spend() {
    if (--budget < 0) exhausted = true;
    return !exhausted;
  }
};

// Whether an element of ``l`` (dimensions k.., starting at byte ``at``)
// shares a byte with [lo, hi).
bool touches(const Layout& l, size_t k, intptr_t at, intptr_t lo, intptr_t hi, Search& s) {
  if (!s.spend()) return true;
  const int64_t span = l.span_from(k);
  if (at >= hi || at + span <= lo) return false;
  if (k == l.size.size()) return true;  // one element, inside the range
  const int64_t inner = l.span_from(k + 1), st = l.stride[k];
  // Indices i whose block [at + i*st, + inner) reaches into [lo, hi).
  int64_t first = (lo - at - inner) / st;  // may be one too small: harmless
  first = std::max<int64_t>(first, 0);
  const int64_t last = std::min<int64_t>(l.size[k] - 1, (hi - 1 - at) / st);
  for (int64_t i = first; i <= last; ++i) {
    if (touches(l, k + 1, at + i * st, lo, hi, s)) return true;
    if (s.exhausted) return true;
  }
  return false;
}

// Enumerates the contiguous runs of ``l`` (its innermost dense dimensions),
// calling f(lo, hi) until it returns true.
template <typename F>
bool any_run(const Layout& l, Search& s, F&& f) {
  // The longest dense suffix: dimensions whose stride equals the span inside.
  size_t dense = l.size.size();
  while (dense > 0 && l.stride[dense - 1] == l.span_from(dense)) --dense;
  const int64_t run = l.span_from(dense);
  std::vector<int64_t> idx(dense, 0);
  for (;;) {
    intptr_t at = l.base;
    for (size_t j = 0; j < dense; ++j) at += idx[j] * l.stride[j];
    if (f(at, at + run)) return true;
    if (!s.spend()) return true;
    size_t j = dense;
    while (j > 0) {
      --j;
      if (++idx[j] < l.size[j]) break;
      idx[j] = 0;
      if (j == 0) return false;
    }
    if (dense == 0) return false;
  }
}

// Drops the outermost dimension: the layout of one index of it.
Layout inner_of(const Layout& l, intptr_t base) {
  Layout in = l;
  in.base = base;
  in.size.erase(in.size.begin());
  in.stride.erase(in.stride.begin());
  return in;
}

int64_t runs(const Layout& l) {
  int64_t n = 1;
  size_t dense = l.size.size();
  while (dense > 0 && l.stride[dense - 1] == l.span_from(dense)) --dense;
  for (size_t j = 0; j < dense; ++j) n *= l.size[j];
  return n;
}

bool overlaps(const Layout& a, const Layout& b, Search& s) {
  if (!s.spend()) return true;
  if (a.base >= b.base + b.span() || b.base >= a.base + a.span()) return false;
  // Two pools of the same period (e.g. the K and V halves of a fused cache,
  // [N, 2, ...]): compare one period of each at the relative offsets that can
  // meet, instead of walking every row.
  if (!a.size.empty() && !b.size.empty() && a.stride[0] == b.stride[0] && a.span_from(1) <= a.stride[0] &&
      b.span_from(1) <= b.stride[0] && runs(a) > 64 && runs(b) > 64) {
    const int64_t period = a.stride[0];
    const intptr_t delta = b.base - a.base;
    // Index j of b meets index i of a only when |delta + (j - i) * period| < period.
    const int64_t d0 = -delta / period;
    for (int64_t d = d0 - 1; d <= d0 + 1; ++d) {
      // Some i with 0 <= i < a.size[0] and 0 <= i + d < b.size[0]?
      const int64_t i_lo = std::max<int64_t>(0, -d), i_hi = std::min<int64_t>(a.size[0], b.size[0] - d);
      if (i_lo >= i_hi) continue;
      if (overlaps(inner_of(a, a.base), inner_of(b, b.base + d * period), s)) return true;
    }
    return false;
  }
  // Otherwise walk the runs of the view with fewer of them.
  const bool a_small = runs(a) <= runs(b);
  const Layout& walk = a_small ? a : b;
  const Layout& probe = a_small ? b : a;
  return any_run(walk, s, [&](intptr_t lo, intptr_t hi) { return touches(probe, 0, probe.base, lo, hi, s); });
}

const char* verdict_words(Verdict v) { return v == Verdict::Yes ? "shares memory with" : "may share memory with"; }

}  // namespace

Verdict internal(const at::Tensor& t) {
  const at::MemOverlap fast = at::has_internal_overlap(t);
  if (fast == at::MemOverlap::No) return Verdict::No;
  if (fast == at::MemOverlap::Yes) return Verdict::Yes;
  const Layout l = layout_of(t);
  if (l.empty) return Verdict::No;
  if (l.repeats) return Verdict::Yes;
  if (nested(l)) return Verdict::No;
  // Interleaved strides: compare every element's bytes with its neighbours'.
  if (t.numel() > (1 << 22)) return Verdict::Unknown;
  std::vector<intptr_t> starts;
  starts.reserve(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(l.size.size(), 0);
  for (;;) {
    intptr_t at = l.base;
    for (size_t j = 0; j < idx.size(); ++j) at += idx[j] * l.stride[j];
    starts.push_back(at);
    size_t j = idx.size();
    while (j > 0 && ++idx[j - 1] == l.size[j - 1]) idx[--j] = 0;
    if (j == 0) break;
  }
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] - starts[i - 1] < l.itemsize) return Verdict::Yes;
  }
  return Verdict::No;
}

Verdict between(const at::Tensor& a, const at::Tensor& b) {
  const Layout la = layout_of(a), lb = layout_of(b);
  if (la.empty || lb.empty) return Verdict::No;
  Search s;
  const bool hit = overlaps(la, lb, s);
  if (s.exhausted) return Verdict::Unknown;
  return hit ? Verdict::Yes : Verdict::No;
}

void check_writes(const char* op, const std::vector<Arg>& written, const std::vector<Arg>& read) {
  // An absent optional argument (null or undefined) overlaps nothing.
  auto absent = [](const Arg& a) { return a.tensor == nullptr || !a.tensor->defined(); };
  for (auto w = written.begin(); w != written.end(); ++w) {
    if (absent(*w)) continue;
    const at::Tensor& t = *w->tensor;
    const Verdict self = internal(t);
    TORCH_CHECK(self == Verdict::No, op, ": ", w->name, " has overlapping elements (shape ", t.sizes(), ", strides ",
                t.strides(), ")", self == Verdict::Unknown ? " or strides too irregular to check" : "",
                "; a written tensor needs one memory location per element (e.g. not an expand()ed view): pass a "
                "tensor from torch.empty/zeros or a slice of one");
    auto against = [&](const Arg& other) {
      if (absent(other)) return;
      const at::Tensor& u = *other.tensor;
      const Verdict v = between(t, u);
      TORCH_CHECK(v == Verdict::No, op, ": ", w->name, " ", verdict_words(v), " ", other.name, " (", w->name, " shape ",
                  t.sizes(), " strides ", t.strides(), ", ", other.name, " shape ", u.sizes(), " strides ", u.strides(),
                  "); the operator writes ", w->name,
                  " while it still reads the other, so the two must not overlap: pass separate tensors");
    };
    for (auto o = w + 1; o != written.end(); ++o) against(*o);
    for (const Arg& r : read) against(r);
  }
}

}  // namespace rvv_attn::overlap
