#include "ops/runtime.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <exception>

#include "dispatch.h"

namespace rvv_attn::ops {
namespace {

void run_on_torch_pool(int64_t n, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  at::parallel_for(0, n, /*grain_size=*/1, [&](int64_t begin, int64_t end) { body(ctx, begin, end); });
}

const ThreadPool kTorchPool{&run_on_torch_pool};

}  // namespace

const KernelTable& kernels() {
  try {
    return active_table();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

const ThreadPool& torch_pool() { return kTorchPool; }

}  // namespace rvv_attn::ops
