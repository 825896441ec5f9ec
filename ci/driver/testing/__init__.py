"""The test runs: pytest on the host and under QEMU, the emulated matrix, repro, and what they report.

- ``testrun``: pytest under QEMU or in the session's venv, its outcome as data, the summary session's tables;
- ``shards``: one configuration's test files split over several QEMU processes;
- ``vlen_sessions``: the sessions of one VLEN (test-vlenN[-agnostic], shell-vlenN): their docs and steps;
- ``demo``: the demo-vlenN session (the small model generating under QEMU);
- ``matrix``: test-emulated, every VLEN and agnostic lane at once, and its report;
- ``beside``: the host-side sessions test-emulated runs beside its configurations;
- ``repro``: the repro session's test x configuration matrix (and its gdb mode);
- ``torch_line_runs``: the runs of a torch line other than the default (test-torch2.14[-quick]);
- ``gcc_check``: the decode kernel built by each riscv64 compiler, level and VLEN, checked under QEMU;
- ``gcc_suite``: the whole package built with a riscv64 GCC and the suite run against it (test-gcc).
"""

from . import gcc_check, gcc_suite, matrix, repro, torch_line_runs
from .demo import run_demo
from .testrun import pytest_in_session, results_dir, session_clock, summary_lines
from .vlen_sessions import emulated_suite, guest_shell, vlen_session_docs

__all__ = [
    "emulated_suite",
    "gcc_check",
    "gcc_suite",
    "guest_shell",
    "matrix",
    "pytest_in_session",
    "repro",
    "results_dir",
    "run_demo",
    "session_clock",
    "torch_line_runs",
    "summary_lines",
    "vlen_session_docs",
]
