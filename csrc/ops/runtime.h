// What every operator entry point needs to reach the kernels: the selected
// variant's table and the torch thread pool.
#pragma once

#include "kernel_api.h"

namespace rvv_attn::ops {

// The active variant; dispatcher errors surface as RuntimeError in Python.
const KernelTable& kernels();

// at::parallel_for behind the kernels' ThreadPool interface.
const ThreadPool& torch_pool();

}  // namespace rvv_attn::ops
