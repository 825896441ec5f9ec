"""The sessions of one VLEN: test-vlenN, test-vlenN-agnostic, shell-vlenN and demo-vlenN (its steps in demo.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import toolchain
from ..proc import log
from ..session import Session
from ..toolchain.guest_commands import guest_command, staged_guest_env
from ..toolchain.vlens import Variant
from ..warm import route
from . import shards, testrun


def vlen_session_docs(variant: Variant, portable_lane: bool) -> dict[str, str]:
    """What ``nox -l`` says of the sessions of one VLEN: test, agnostic, shell and demo."""
    where = f"VLEN {variant.vlen} ({variant.board})"
    portable = ", for its RVV build and the portable one" if portable_lane else ""
    return {
        "test": f"Cross-build, then run the whole suite under qemu-riscv64 at {where}{portable}, its files split "
        "over one QEMU process per core (--jobs=N first to change that).",
        "agnostic": f"As test-{variant.name} (its RVV build only), with tail/mask-agnostic lanes filled with ones "
        "(rvv_ta_all_1s/rvv_ma_all_1s), as real hardware may.",
        "shell": f"Run any command given after -- in the emulated target at {where}, rvv_attn importable "
        "(e.g. -- python3 -m pytest other/tests -x).",
        "demo": "Generate with a small model (Llama; gpt-oss-like with -- --model=gpt-oss) through the RVV and "
        f"torch-native backends at {where}; options after -- (see -- --help).",
    }


def emulated_suite(session: Session, variant: Variant, agnostic: bool, posargs: Sequence[str]) -> None:
    """A test-vlenN[-agnostic] session: the suite under QEMU at ``variant``'s VLEN, split over the cores."""
    jobs, pytest_args = shards.take_jobs(posargs, os.cpu_count() or 1)
    qemu_bin, root = toolchain.ensure()
    stage = toolchain.stage_for(session, root, [variant])
    label = f"test-{variant.name}" + ("-agnostic" if agnostic else "")
    code, outcome = testrun.run_emulated_pytest(
        qemu_bin, root, stage, variant, pytest_args or ["tests"], agnostic_ones=agnostic, label=label, jobs=jobs
    )
    testrun.print_summary(label, code, outcome)
    if code != 0:
        session.error(f"{label}: pytest exited with {code}; JUnit XML and summary in {testrun.results_dir(label)}")


def guest_shell(session: Session, variant: Variant, argv: Sequence[str]) -> None:
    """A shell-vlenN session: ``argv`` in the emulated target at ``variant``'s VLEN, rvv_attn importable (through a
    warm target when one matches)."""
    if not argv:
        session.error(f"give a command after --, e.g. nox -s shell-{variant.name} -- python3 -c 'import rvv_attn'")
    qemu_bin, root = toolchain.ensure()
    env = staged_guest_env(toolchain.stage_for(session, root, [variant]))
    cmd = route(guest_command(qemu_bin, root, variant, argv), env, report=log)
    session.run(*cmd, env=env, include_outer_env=False, external=True)
