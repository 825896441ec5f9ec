// Per-variant namespace, as Highway does per target.
//
// CMake compiles every kernel source once per variant with
// RVV_ATTN_VARIANT=<name> (and RVV_ATTN_VLEN=<bits> for RVV variants), so
// the same code lands in rvv_attn::portable, rvv_attn::vlen256, ... and one
// shared library can hold all of them without symbol clashes.
#pragma once

#ifndef RVV_ATTN_VARIANT
#error "RVV_ATTN_VARIANT must be defined by the build (portable, vlen128, ...)"
#endif

#if defined(RVV_ATTN_VLEN)
#if !defined(__riscv_v_fixed_vlen)
#error "RVV variants are built with -mrvv-vector-bits=zvl so that __riscv_v_fixed_vlen is defined"
#endif
static_assert(__riscv_v_fixed_vlen == RVV_ATTN_VLEN, "the variant's VLEN and the compiler's -march zvl value disagree");
#define RVV_ATTN_HAS_RVV 1
#include <riscv_vector.h>
#else
#define RVV_ATTN_VLEN 0
#define RVV_ATTN_HAS_RVV 0
#endif

// Everything in a kernel source goes inside this namespace. Kernel sources
// must not instantiate templates with external linkage from outside it (std
// containers, std::function, ...): the linker keeps one copy of each such
// function for the whole library, and a copy compiled for one VLEN would then
// run in every variant.
#define RVV_ATTN_NS rvv_attn::RVV_ATTN_VARIANT
