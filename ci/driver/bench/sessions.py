"""The bench and bench-check sessions: measuring (``run``), judging (``figures``) and writing (``render``) in turn."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..proc import log
from ..session import Session
from ..testing import pytest_in_session, results_dir
from . import cases, figures, render, run


def run_session(session: Session, posargs: Sequence[str]) -> None:
    """The bench session: every row (or those ``--only`` names), written to build/results/bench and checked against
    the baseline, or made the baseline with ``--update-baseline``."""
    opts = cases.parse_posargs(posargs)
    session.install("matplotlib")
    runner = run.prepare(session)
    doc = run.measure(runner, cases.select(cases.full_configs(), opts.only), opts.jobs or os.cpu_count() or 1)
    render.write_run(session, doc, results_dir("bench"))
    if opts.update_baseline:
        render.update_baseline(session, figures.updated_baseline(doc, opts.only))
    else:
        figures.guard(figures.load_document(figures.BASELINE_FILE), doc, require_every_row=False, report=log)


def check_session(session: Session, pytest_args: Sequence[str]) -> None:
    """The bench-check session: the plugin's tests (``pytest_args``, default bench/tests), then the guard's subset
    measured and checked against the baseline."""
    runner = run.prepare(session)
    session.install("pytest>=8")
    pytest_in_session(session, "bench-check", pytest_args or ["bench/tests"], runner.plugin_env())
    run.check(runner, results_dir("bench-check") / "bench.json")
