"""The test-sglang session: the tests marked ``sglang`` against SGLang's real package, on the host and under QEMU.

Steps, each timed: the host venv (the line's host torch, the table's host
pins, SGLang's wheel without dependencies, rvv-attn built and installed with
its metadata) runs ``pytest -m sglang``; then the target: SGLang's sysroot and
site folder (cached, environment.py), rvv-attn's riscv64 wheel (portable + the
table's VLEN, incremental), a fresh venv with the wheel pip-installed, and the
same tests under qemu-riscv64 at that VLEN. SGLang starts its processes with
the ``spawn`` method (a new interpreter), and so do the tests: a riscv64
program can start another only through the kernel, so the pinned QEMU is
registered with binfmt_misc while the target's tests run, and QEMU_LD_PREFIX
and QEMU_CPU give the children the same sysroot and CPU. ``RVV_ATTN_SGLANG=require`` tells
the tests' conftest that SGLang must import: a failing ``import sglang`` is an
error there, never a skip.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import Stopwatch, log, quote, run
from ..release import install_test
from ..session import Session
from ..testing import testrun
from ..toolchain import binfmt, build, sysroot
from ..toolchain.torch_lines import TorchLine
from ..toolchain.vlens import by_vlen
from . import board_steps, environment

# What the conftest reads: "require" runs the sglang-marked tests and fails the run if SGLang does not import.
SGLANG_ENV = "RVV_ATTN_SGLANG"
DEFAULT_PYTEST_ARGS = ("-m", "sglang and not sglang_server", "tests")
PLACES = ("host", "target")

# The share of `nox -t test`: the sglang-marked tests in the target only, less the two that spawn fresh
# interpreters importing torch and SGLang (73 s of 125 s of tests; test-sglang runs them, and
# test-sglang-server's scheduler process shows the same plugin loading). Most of the rest is the interpreter
# importing torch and SGLang once; the host side needs a CUDA build of torch in a venv of its own.
QUICK_POSARGS = ("--only=target", "-m", "sglang and not sglang_server and not sglang_spawn", "tests")
# test-sglang-server: SGLang's own server started by the tests, in the target only (its riscv64 defaults are
# what they check). Each architecture's server takes minutes to start under QEMU.
SERVER_POSARGS = ("--only=target", "-m", "sglang_server", "tests/test_sglang_server.py")
# Hypothesis's pytest plugin, once it has collected any property test, harvests constants from the source of
# every imported module it takes for the project's own: anything outside the venv's site-packages. In the
# target's venv that is torch, SGLang and the sysroot's dist-packages (~3,500 files), parsed under QEMU: 4 min
# whenever its cache (guest_env: one per user) lacks them, e.g. on a fresh machine or after a pin moves. No
# sglang-marked test uses Hypothesis, so the target runs without that plugin and never pays it; Hypothesis
# itself still works for any property test named on the command line.
TARGET_PYTEST_OPTIONS = ("-p", "no:hypothesispytest")


@dataclass
class Timings:
    steps: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"  {name:<34} {seconds:7.1f} s" for name, seconds in self.steps.items()]


def parse_posargs(posargs: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """``--only=host`` or ``--only=target`` first, then pytest arguments (default: ``-m sglang tests``)."""
    rest = list(posargs)
    places = PLACES
    if rest and rest[0].startswith("--only="):
        chosen = tuple(p.strip() for p in rest.pop(0).split("=", 1)[1].split(",") if p.strip())
        unknown = [p for p in chosen if p not in PLACES]
        if unknown or not chosen:
            raise ConfigError(f"--only: choose from {', '.join(PLACES)} (got {', '.join(chosen) or 'nothing'})")
        places = chosen
    return places, rest or list(DEFAULT_PYTEST_ARGS)


def host_part(
    session: Session, table: environment.Table, requirements: Sequence[str], pytest_args: Sequence[str], t: Timings
) -> None:
    with Stopwatch("host: venv with the line's torch, SGLang's imports and rvv-attn") as watch:
        toolchain.host_build(session, [*requirements, *environment.host_requirements(table)])
        wheel = environment.fetch_wheel(table.sglang, str(Path(session.bin) / "python"))
        # --no-deps: SGLang's requirements name CUDA packages; what its imports need is in the table's host pins.
        session.run("python", "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel), silent=True)
    t.steps["host: prepare"] = watch.elapsed
    with Stopwatch("host: pytest") as watch:
        testrun.pytest_in_session(session, "test-sglang-host", pytest_args, {SGLANG_ENV: "require"})
    t.steps["host: tests"] = watch.elapsed


def target_part(
    session: Session, table: environment.Table, line: TorchLine, pytest_args: Sequence[str], t: Timings
) -> bool:
    variant = by_vlen(table.vlen)
    with Stopwatch("target: toolchain, SGLang's sysroot and site folder") as watch:
        qemu, line_root = toolchain.ensure(line)
        manifest = environment.sysroot_manifest(table, line)
        root = sysroot.ensure_sysroot(qemu, manifest)
        environment.same_torch(line.lock_file, table.lock_file)
        site_dir = environment.ensure_site(table, manifest, root, qemu, str(Path(session.bin) / "python"))
    t.steps["target: sysroot + site folder"] = watch.elapsed
    with Stopwatch(f"target: rvv-attn's riscv64 wheel (portable + {variant.name})") as watch:
        wheel = toolchain.cross_build(session, line_root, build.cross_tree([variant]).wheels, only=[variant])
    t.steps["target: wheel"] = watch.elapsed

    config = install_test.Config.for_variant(variant)
    work = BUILD_DIR / "sglang"
    venv, tmp = work / "venv", work / "tmp"
    shutil.rmtree(work, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = {**install_test.pytest_env(config, venv, tmp, qemu, root), SGLANG_ENV: "require"}
    # What the kernel's binfmt_misc entry does not carry: the children's sysroot and CPU (QEMU reads both).
    env.update(QEMU_LD_PREFIX=str(root), QEMU_CPU=config.qemu_cpu)
    with Stopwatch("target: venv and pip install of the wheel") as watch:
        run(install_test.create_venv_command(qemu, root, venv), env=env)
        (environment.venv_site_packages(venv) / environment.PTH_NAME).write_text(environment.pth_text(site_dir))
        log(run(install_test.pip_install_command(qemu, root, venv, wheel), env=env).strip().splitlines()[-1])
    t.steps["target: venv + pip install"] = watch.elapsed

    label = "test-sglang-target"
    junit = testrun.results_dir(label) / "junit.xml"
    junit.unlink(missing_ok=True)
    cmd = install_test.pytest_command(qemu, root, venv, config, [*TARGET_PYTEST_OPTIONS, *pytest_args], junit)
    log(f"target: pytest under QEMU ({config.qemu_cpu}): {quote(cmd)}")
    with Stopwatch("target: pytest") as watch, binfmt.registered(qemu):
        returncode = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL).returncode
    t.steps["target: tests"] = watch.elapsed
    outcome = testrun.parse_junit(junit) if junit.exists() else None
    testrun.write_summary(label, returncode, outcome, qemu_cpu=config.qemu_cpu, wall_seconds=round(watch.elapsed, 1))
    testrun.print_summary(label, returncode, outcome)
    return returncode == 0 and outcome is not None and outcome.ok


def run_session(session: Session, line: TorchLine, requirements: Sequence[str], posargs: Sequence[str]) -> None:
    table = environment.load()
    environment.check_stand_ins(table)
    places, pytest_args = parse_posargs(posargs)
    timings = Timings()
    ok = True
    try:
        if "host" in places:
            host_part(session, table, requirements, pytest_args, timings)
        if "target" in places:
            ok = target_part(session, table, line, pytest_args, timings)
    finally:
        print("\n".join([f"test-sglang (SGLang {table.sglang.version}, {line.describe()}):", *timings.lines()]))
    if not ok:
        raise DriverError("the sglang tests failed in the emulated target (above); JUnit XML in build/results/")


def board_steps_session(session: Session, line: TorchLine) -> None:
    """docs/sglang.md's board steps in a fresh riscv64 root, with rvv-attn's wheel built from this tree."""
    table = environment.load()
    variant = by_vlen(table.vlen)
    qemu, line_root = toolchain.ensure(line)
    environment.sysroot_manifest(table, line)  # the table's torch line is this one
    with Stopwatch(f"rvv-attn's riscv64 wheel (portable + {variant.name})"):
        wheel = toolchain.cross_build(session, line_root, build.cross_tree([variant]).wheels, only=[variant])
    started = time.monotonic()
    with binfmt.registered(qemu):
        pristine = board_steps.ensure_fresh_root(line)
        steps = board_steps.run_steps(pristine, wheel, variant.qemu_cpu())
    total = time.monotonic() - started
    lines = [f"  {name:<14} {seconds / 60:6.1f} min" for name, seconds in steps.items()]
    print("\n".join([f"docs/sglang.md's board steps on {line.describe()}, {variant.name}:", *lines,
                     f"  {'in all':<14} {total / 60:6.1f} min"]))  # fmt: skip
