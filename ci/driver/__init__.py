"""Host-side driver behind the noxfile.

Everything the nox sessions do lives here so it can be imported and unit
tested on the host: the VLEN table, host prerequisites, the pinned QEMU, the
riscv64 sysroot, the cross build, the emulated runs, the benchmarks, the
release artefacts, the warm guests and the install test.
"""
