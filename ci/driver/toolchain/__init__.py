"""The cross toolchain and what runs on it: host packages, the pinned QEMU, the riscv64 sysroot, the builds."""
