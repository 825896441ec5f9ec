"""The test runs of a torch line other than the default: the same sessions, in a nested nox with the line chosen.

Every session already follows ``RVV_ATTN_TORCH_LINE`` (its sysroot, host torch,
build trees and venvs), so a line's runs are the default line's sessions run
again with that variable set: its whole matrix (test-torch2.14), and the share
`nox -t test` runs (test-torch2.14-quick): VLEN 256 with the variant-independent
tests, and the quick install test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..paths import LINE_ENV
from ..toolchain.torch_lines import TorchLine
from ..toolchain.vlens import agnostic_lane, variant_independent_lane, variants
from .beside import nested_nox_command
from .repro import Config

# test-emulated's sessions beside the share of `nox -t test`: one configuration (the one that also runs the
# variant-independent tests), and beside it the quick install test (the installed wheel on this line's Python,
# the portable build on a CPU without V). The host's portable build against this line's torch is left to the
# whole run (test-torch2.14, CI's torch-line job): in a fresh clone its venv alone installs the CUDA build of
# torch (5.5 GB), and it took 3 min 16 s of the share's 5 min 38 s.
QUICK_BESIDE = ("install-test-quick",)
# Beside the whole matrix of a line: everything of `nox -t test` but bench-check (instruction counts do not
# depend on the torch line; its baseline is the default line's).
FULL_BESIDE = ("test-host", "test-toolchain", "sanitize", "install-test-quick")


def full_args() -> tuple[str, ...]:
    """The whole run's options: every VLEN and every agnostic lane CI runs (more than `nox -t test`'s)."""
    configs = [Config(v.vlen) for v in variants()] + [Config(vlen, True) for vlen in agnostic_lane()]
    return (f"--configs={','.join(c.label for c in configs)}", f"--beside={','.join(FULL_BESIDE)}")


def quick_args(also_beside: Sequence[str] = ()) -> tuple[str, ...]:
    """The quick share's options; ``also_beside``: sessions for a second process beside the one configuration
    (test-sglang-quick on SGLang's line), so that three processes share the two cores until the end instead
    of the longer beside process running alone after the configuration."""
    second = (f"--beside={','.join(also_beside)}",) if also_beside else ()
    return (f"--configs=vlen{variant_independent_lane()}", f"--beside={','.join(QUICK_BESIDE)}", *second)


def line_run(
    line: TorchLine,
    quick: bool,
    posargs: Sequence[str],
    environ: Mapping[str, str] | None = None,
    also_beside: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """Command and environment of a line's run: test-emulated and summary, with the line selected."""
    share = quick_args(also_beside) if quick else full_args()
    return nested_run(line.torch, ["test-emulated", "summary"], [*share, *posargs], environ)


def nested_run(
    torch: str, sessions: Sequence[str], posargs: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Command and environment of ``sessions`` run with the torch line ``torch`` selected (e.g. test-sglang)."""
    env = dict(os.environ if environ is None else environ)
    env[LINE_ENV] = torch
    return [*nested_nox_command(list(sessions)), "--", *posargs], env


def session_docs(line: TorchLine, also_beside: Sequence[str] = ()) -> dict[str, str]:
    also = f"; in one more process beside them, {', '.join(also_beside)}" if also_beside else ""
    return {
        "full": f"Every test of `nox -t test` (but bench-check) against {line.describe()}: every VLEN and agnostic "
        f"lane under QEMU, the host's portable and sanitizer builds, the install test (RVV_ATTN_TORCH_LINE="
        f"{line.torch} for any other session).",
        "quick": f"The share of `nox -t test` for {line.describe()}: the suite at VLEN {variant_independent_lane()} "
        "(with the variant-independent tests) under QEMU, and beside it the quick install test"
        f"{also}.",
    }
