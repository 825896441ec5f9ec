/*
 * A freestanding riscv64 program whose instruction counts are known by
 * construction, for checking the insn_count plugin. It marks [kernel,
 * kernel_end) as the library range, then runs `kernel` inside a region.
 * Per loop iteration (LOOP_TRIPS times): 3 vset* (vsetvli, vsetvli, vsetvl),
 * 3 vector arithmetic instructions at LMUL 4, 1/2 and 8 (weights 4 + 1 + 8),
 * 3 vector loads/stores: vle32 at e32/m4 (EMUL 4), vle16 at e32/m4 (EMUL 2),
 * vse32 at e32/m8 (EMUL 8), and 4 scalar instructions (li, flw, addi, bnez).
 * No compressed instructions and no linker relaxation: every count is fixed.
 */
    .option norvc
    .option norelax

#define MARK_FD -21078
#define SYS_LSEEK 62
#define SYS_EXIT 93

    .macro mark cmd, value
    li a0, MARK_FD
    mv a1, \value
    li a2, \cmd
    li a7, SYS_LSEEK
    ecall
    .endm

    .text
    .globl _start
_start:
    la s1, kernel
    mark 0x5201, s1
    la s1, kernel_end
    mark 0x5202, s1
    li s1, 7
    mark 0x5203, s1   /* region 7 starts */
    jal ra, kernel
    mark 0x5204, s1   /* region 7 ends: outside the library, 1 (jal) + 7 (this mark) instructions */
    li s1, 8
    mark 0x5203, s1   /* region 8: empty */
    mark 0x5204, s1
    li a0, 0
    li a7, SYS_EXIT
    ecall

kernel:
    li t0, LOOP_TRIPS
    la a1, buffer
1:
    vsetvli t1, zero, e32, m4, ta, ma
    vle32.v v8, (a1)
    vfadd.vv v8, v8, v8
    vle16.v v4, (a1)
    vsetvli t1, zero, e8, mf2, ta, ma
    vadd.vv v1, v1, v1
    li t2, 0x13          /* vtype e32, m8 */
    vsetvl t1, zero, t2
    vadd.vv v16, v16, v16
    vse32.v v16, (a1)
    flw ft0, 0(a1)
    addi t0, t0, -1
    bnez t0, 1b
    ret
kernel_end:

    .bss
    .balign 64
buffer:
    .zero 1024 * 8
