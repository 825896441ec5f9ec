"""Host-side driver for the rvv-attn cross toolchain.

Everything the nox sessions do lives here so it can be imported and unit
tested on the host: the VLEN table, host prerequisites, the pinned QEMU, the
riscv64 sysroot, the cross build and the emulated command lines.
"""
