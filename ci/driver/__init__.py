"""Host-side driver behind the noxfile.

Everything the nox sessions do lives here so it can be imported and unit
tested on the host. Each sub-package's ``__init__`` says what it holds and
hands on what the noxfile uses:

- ``toolchain``: host packages, the pinned QEMU, the riscv64 sysroot, the VLEN table, the builds;
- ``testing``: the test runs on the host and under QEMU, the emulated matrix, repro, the summary;
- ``warm``: warm targets, emulated Pythons with torch imported that serve runs;
- ``bench``: the instruction-count benchmarks, the plugin QEMU and the cycle model;
- ``release``: the sdist and wheel, the install test, the CI matrices.

Beside them, the basics every part uses (``errors``, ``paths``, ``proc``,
``session``: what a step uses of a nox session) and the lint session's
checks (``lint``).
"""
