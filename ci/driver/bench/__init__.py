"""Instruction-count benchmarks of the kernels under a plugin-capable QEMU.

- ``cases``: what is measured (shapes, configurations, units of work) and the session's options;
- ``run``: driving the emulated guest processes under the insn_count plugin;
- ``figures``: plugin counts -> figures per unit, the lower bound, the comparison with the baseline;
- ``render``: the markdown tables, the plot and the tables of docs/benchmarks.md;
- ``plugin_qemu``: the plugin-capable QEMU (the pinned version, built from its Debian source) and the plugin;
- ``cycles``: the cycle estimate of the measured basic blocks (llvm-mca with each core's scheduling model);
- ``sessions``: the bench and bench-check sessions, strung from the above.

``python -m driver.bench plot <bench.json> <out.png>`` draws the plot in a
Python that has matplotlib (the session's venv).
"""

from .sessions import check_session, run_session

__all__ = ["check_session", "run_session"]
