/* A known-bad RVV reduction and its fix, for proving the agnostic-policy lane.
 *
 * Both sum n floats by accumulating into a vector across strip-mined
 * iterations and reducing over all VLMAX lanes at the end. On the last, short
 * iteration (vl < VLMAX) the lanes past vl are "tail" lanes:
 *  - sum_tail_agnostic uses the default (tail-agnostic) vfadd, so after it
 *    those lanes may hold anything. QEMU's default leaves them undisturbed, so
 *    the earlier partial sums survive and the bug is hidden; with
 *    rvv_ta_all_1s=on they become all ones (a NaN) and the sum is NaN.
 *  - sum_tail_undisturbed uses vfadd..._tu, which keeps them: correct under
 *    every policy, as on real hardware.
 * Prints both sums and the exact one (small integers: float sums are exact).
 */
#include <riscv_vector.h>
#include <stdio.h>

static float sum_tail_agnostic(const float *x, size_t n) {
  size_t vlmax = __riscv_vsetvlmax_e32m1();
  vfloat32m1_t acc = __riscv_vfmv_v_f_f32m1(0.0f, vlmax);
  for (size_t vl; n > 0; n -= vl, x += vl) {
    vl = __riscv_vsetvl_e32m1(n);
    acc = __riscv_vfadd_vv_f32m1(acc, __riscv_vle32_v_f32m1(x, vl), vl);
  }
  vfloat32m1_t zero = __riscv_vfmv_s_f_f32m1(0.0f, 1);
  return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m1_f32m1(acc, zero, vlmax));
}

static float sum_tail_undisturbed(const float *x, size_t n) {
  size_t vlmax = __riscv_vsetvlmax_e32m1();
  vfloat32m1_t acc = __riscv_vfmv_v_f_f32m1(0.0f, vlmax);
  for (size_t vl; n > 0; n -= vl, x += vl) {
    vl = __riscv_vsetvl_e32m1(n);
    acc = __riscv_vfadd_vv_f32m1_tu(acc, acc, __riscv_vle32_v_f32m1(x, vl), vl);
  }
  vfloat32m1_t zero = __riscv_vfmv_s_f_f32m1(0.0f, 1);
  return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m1_f32m1(acc, zero, vlmax));
}

int main(void) {
  float x[64];
  size_t n = __riscv_vsetvlmax_e32m1() + 3; /* one full vector and a short tail */
  float exact = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    x[i] = (float)(i + 1);
    exact += x[i];
  }
  printf("agnostic=%g undisturbed=%g exact=%g\n", sum_tail_agnostic(x, n), sum_tail_undisturbed(x, n), exact);
  return 0;
}
