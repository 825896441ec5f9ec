# Cross toolchain: clang-19 for riscv64-linux-gnu against a Debian riscv64
# sysroot that holds the target's PyTorch. One knob: RVV_ATTN_SYSROOT (cache
# variable or environment variable), set by the nox sessions.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)

if(NOT RVV_ATTN_SYSROOT AND DEFINED ENV{RVV_ATTN_SYSROOT})
  set(RVV_ATTN_SYSROOT "$ENV{RVV_ATTN_SYSROOT}")
endif()
if(NOT RVV_ATTN_SYSROOT OR NOT EXISTS "${RVV_ATTN_SYSROOT}/usr/include/torch/library.h")
  message(FATAL_ERROR "RVV_ATTN_SYSROOT ('${RVV_ATTN_SYSROOT}') is not a riscv64 sysroot with PyTorch; "
                      "run `./ci/nox -s setup`, which builds it and prints its path, and pass that path")
endif()
# try_compile projects get the sysroot too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES RVV_ATTN_SYSROOT)

set(CMAKE_SYSROOT "${RVV_ATTN_SYSROOT}")
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_CXX_COMPILER clang++-19)
set(CMAKE_C_COMPILER_TARGET riscv64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET riscv64-linux-gnu)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-fuse-ld=lld")
# Stripping on install (the release wheel) needs a strip that reads riscv64
# ELF; the host's binutils strip only knows its own architecture.
find_program(CMAKE_STRIP NAMES llvm-strip-19 llvm-strip REQUIRED)

# Find the target's libraries and TorchConfig.cmake in the sysroot, never the
# host's; run host programs from the host.
set(CMAKE_FIND_ROOT_PATH "${RVV_ATTN_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
list(APPEND CMAKE_PREFIX_PATH "/usr/lib/riscv64-linux-gnu/cmake")
