#include "ops/runtime.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "dispatch/dispatch.h"

namespace rvv_attn::ops {
namespace {

// Why not at::parallel_for: the sysroot's torch is built with OpenMP, and its
// at::parallel_for is an inline template whose `#pragma omp parallel` only
// takes effect in a translation unit compiled with -fopenmp. Clang's OpenMP
// runtime (libomp) is not torch's (libgomp), and two runtimes in one process
// are asking for trouble, so the library is compiled without it, and the
// inlined parallel_for ran every call on the calling thread. Instead the
// chunks go to torch's inter-op pool (at::launch, a real libtorch function),
// sized by torch.set_num_threads like the intra-op work it stands for.

thread_local bool inside_pool_chunk = false;

// Every look-up of the active variant's table by an operator: each kernel
// call, and the queries whose answer depends on the variant (blocking,
// active_variant). Read by the test suite to prove that a test marked
// variant_independent never reached a kernel.
std::atomic<int64_t> g_table_lookups{0};

// One parallel call's shared state. Held by shared_ptr: a launched task that
// starts after the caller has finished every chunk itself must still find it.
struct ParallelCall {
  int64_t n = 0, chunks = 0;
  void* ctx = nullptr;
  void (*body)(void*, int64_t, int64_t) = nullptr;
  std::atomic<int64_t> next_chunk{0};
  std::atomic<int64_t> finished_chunks{0};
  std::mutex mutex;
  std::condition_variable all_finished;

  // Chunk c covers [c * n / chunks, (c + 1) * n / chunks): contiguous, sizes differ by at most one.
  void run_available_chunks() {
    inside_pool_chunk = true;
    int64_t ran = 0;
    for (int64_t c = next_chunk.fetch_add(1); c < chunks; c = next_chunk.fetch_add(1)) {
      body(ctx, c * n / chunks, (c + 1) * n / chunks);
      ++ran;
    }
    inside_pool_chunk = false;
    if (ran > 0 && finished_chunks.fetch_add(ran) + ran == chunks) {
      std::lock_guard<std::mutex> lock(mutex);
      all_finished.notify_all();
    }
  }
};

void run_on_torch_pool(int64_t n, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  if (n <= 0) return;
  const int64_t chunks = parallel_chunks(n);
  if (chunks <= 1) {
    body(ctx, 0, n);
    return;
  }
  auto call = std::make_shared<ParallelCall>();
  call->n = n;
  call->chunks = chunks;
  call->ctx = ctx;
  call->body = body;
  // The caller takes chunks too and never waits for a task that has not
  // started: if the pool is busy (even with callers like this one), the
  // caller simply runs every chunk itself. No deadlock, only less speed.
  for (int64_t helper = 1; helper < chunks; ++helper) {
    at::launch([call] { call->run_available_chunks(); });
  }
  call->run_available_chunks();
  std::unique_lock<std::mutex> lock(call->mutex);
  call->all_finished.wait(lock, [&] { return call->finished_chunks.load() == call->chunks; });
}

const ThreadPool kTorchPool{&run_on_torch_pool};

}  // namespace

int64_t parallel_chunks(int64_t n) {
  // A call from inside a chunk (an operator used by another's worker) runs inline.
  if (inside_pool_chunk) return std::min<int64_t>(n, 1);
  return std::max<int64_t>(0, std::min<int64_t>(n, at::get_num_threads()));
}

int64_t pool_concurrency_probe(double timeout_seconds) {
  // Each chunk waits (up to the timeout) until every chunk has arrived: with
  // a pool that runs chunks at once, all are inside together and the probe
  // returns the chunk count; one that runs them one after another returns 1.
  struct Probe {
    int64_t chunks = 0;
    std::chrono::steady_clock::time_point deadline;
    std::atomic<int64_t> arrived{0}, inside{0}, most_inside{0};
  };
  const int64_t n = at::get_num_threads();
  Probe probe;
  probe.chunks = parallel_chunks(n);
  probe.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(timeout_seconds));
  auto body = [](void* ctx, int64_t, int64_t) {
    auto& p = *static_cast<Probe*>(ctx);
    p.arrived.fetch_add(1);
    const int64_t now = p.inside.fetch_add(1) + 1;
    int64_t seen = p.most_inside.load();
    while (now > seen && !p.most_inside.compare_exchange_weak(seen, now)) {
    }
    while (p.arrived.load() < p.chunks && std::chrono::steady_clock::now() < p.deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    p.inside.fetch_sub(1);
  };
  run_on_torch_pool(n, &probe, body);
  return probe.most_inside.load();
}

const KernelTable& kernels() {
  g_table_lookups.fetch_add(1, std::memory_order_relaxed);
  try {
    return active_table();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

const ThreadPool& torch_pool() { return kTorchPool; }

}  // namespace rvv_attn::ops

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def("kernel_table_lookups() -> int", [] { return rvv_attn::ops::g_table_lookups.load(); });
}
