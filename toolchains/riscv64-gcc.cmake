# Cross toolchain: a riscv64 GCC (14 or later) against the same Debian riscv64
# sysroot as riscv64-clang19.cmake. Two knobs, each a cache or environment
# variable: RVV_ATTN_SYSROOT, and RVV_ATTN_CROSS_GXX, the compiler command (a
# host riscv64-linux-gnu-g++-N, or the script `./ci/nox -s test-gcc` writes to
# run one from its cached root; docs/gcc.md).

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)

foreach(_knob RVV_ATTN_SYSROOT RVV_ATTN_CROSS_GXX)
  if(NOT ${_knob} AND DEFINED ENV{${_knob}})
    set(${_knob} "$ENV{${_knob}}")
  endif()
endforeach()
if(NOT RVV_ATTN_SYSROOT OR NOT EXISTS "${RVV_ATTN_SYSROOT}/usr/include/torch/library.h")
  message(FATAL_ERROR "RVV_ATTN_SYSROOT ('${RVV_ATTN_SYSROOT}') is not a riscv64 sysroot with PyTorch; "
                      "run `./ci/nox -s setup`, which builds it and prints its path, and pass that path")
endif()
if(NOT RVV_ATTN_CROSS_GXX)
  message(FATAL_ERROR "RVV_ATTN_CROSS_GXX is not set: give the riscv64 g++ to use, e.g. "
                      "riscv64-linux-gnu-g++-14 (or run `./ci/nox -s test-gcc`, which sets it)")
endif()
# try_compile projects get both too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES RVV_ATTN_SYSROOT RVV_ATTN_CROSS_GXX)

set(CMAKE_SYSROOT "${RVV_ATTN_SYSROOT}")
set(CMAKE_CXX_COMPILER "${RVV_ATTN_CROSS_GXX}")
# GCC links with its own riscv64 binutils; stripping on install needs a strip
# that reads riscv64 ELF, which LLVM's does.
find_program(CMAKE_STRIP NAMES llvm-strip-19 llvm-strip riscv64-linux-gnu-strip REQUIRED)

set(CMAKE_FIND_ROOT_PATH "${RVV_ATTN_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
list(APPEND CMAKE_PREFIX_PATH "/usr/lib/riscv64-linux-gnu/cmake")
