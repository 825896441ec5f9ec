// What every operator entry point needs to reach the kernels: the selected
// variant's table and the torch thread pool.
#pragma once

#include "kernels/kernel_api.h"

namespace rvv_attn::ops {

// The active variant; dispatcher errors surface as RuntimeError in Python.
const KernelTable& kernels();

// torch's thread pool behind the kernels' ThreadPool interface: work of n
// items in parallel_chunks(n) contiguous chunks, one per torch thread
// (torch.set_num_threads), run on the caller and torch's inter-op threads.
const ThreadPool& torch_pool();
int64_t parallel_chunks(int64_t n);

// How many of the pool's chunks ran at the same time, with one chunk per
// torch thread, each waiting up to timeout_seconds for the others: the proof
// that the operators really run on several threads.
int64_t pool_concurrency_probe(double timeout_seconds);

}  // namespace rvv_attn::ops
