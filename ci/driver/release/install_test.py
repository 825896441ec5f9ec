"""The install test: the release wheel, installed by pip as a user would, tested in the emulated target.

In each configuration (every VLEN of the table, and a CPU without V) the
active torch line's sysroot python3 under qemu-riscv64 creates a venv with
system site packages (so it sees Debian's python3-torch, e.g. ``torch
2.6.0+debian``; the one wheel carries a library for each line),
pip installs the wheel from dist/ with no index (so nothing can be fetched),
and the suite runs against the installed package with no build tree on the
path. The tests are told which variant must be active; without V that is
the portable build, and no vector instruction may run.

The venv is created ``--without-pip`` and pip is Debian's python3-pip, seen
through the system site packages: under QEMU's user mode a guest process
cannot start another riscv64 program (no binfmt_misc on the host), and
``ensurepip`` would. On a board ``python3 -m venv --system-site-packages``
(with python3-venv installed) does the same job.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR
from ..proc import log, quote, run
from ..session import Session
from ..testing import testrun
from ..toolchain.guest_commands import guest_env, guest_program
from ..toolchain.vlens import Variant, variants
from .artefacts import release_artefacts, release_wheel

# qemu-riscv64's generic CPU with the vector extension switched off.
NO_VECTOR_CPU = "rv64,v=false"
NO_VECTOR = "novector"
# What `nox -t test` runs of the install test, in a few minutes: without V,
# every operator (float and int8, decode, extend, the KV write) through the
# files that call them all, plus the detection and variant checks; at the
# first VLEN of the table the detection and variant checks. The whole suite
# in every configuration is `nox -s install-test` (and its CI jobs); the
# tree-based test-vlen sessions run the whole suite at every VLEN.
# Left out at the first VLEN: the two checks that start a second emulated interpreter (a ~20 s torch import
# each, most of that configuration's time with the board checks). `nox -t test` runs both on the same sources in
# test-emulated (its VLEN 128 configuration; a torch line's share at VLEN 256 runs the first); the whole install
# test runs them against the installed wheel at every VLEN.
QUICK_SECOND_INTERPRETER = (
    "tests/test_runtime.py::test_forcing_this_vlens_build_on_another_vlen_fails_cleanly_in_a_fresh_process",
    "tests/test_packaging.py::test_riscv_hwprobe_reports_zvfh_when_the_cpu_has_it",
)
QUICK_SELECTION: dict[str, tuple[str, ...]] = {
    NO_VECTOR: (
        "tests/test_runtime.py",
        "tests/test_packaging.py",
        "tests/test_kv_write.py",
        "tests/test_sglang_compat.py",
        "tests/test_int8_kv_cache.py",
    ),
    # ... and the board checks' script (ci/board/) with the benchmark's smoke plan, as a board runs them.
    "first-vlen": (
        "tests/test_runtime.py",
        "tests/test_packaging.py",
        "tests/test_board_checks.py",
        *(f"--deselect={test}" for test in QUICK_SECOND_INTERPRETER),
    ),
}


@dataclass(frozen=True)
class Config:
    """One CPU the installed package is tested on."""

    name: str  # "novector" or the variant id "vlen256"
    qemu_cpu: str
    vlen: int  # 0 without V

    @property
    def expected_variant(self) -> str:
        return self.name if self.vlen else "portable"

    @classmethod
    def for_variant(cls, variant: Variant) -> Config:
        return cls(variant.name, variant.qemu_cpu(), variant.vlen)


def configurations(table: Sequence[Variant] | None = None) -> tuple[Config, ...]:
    """No V first (it needs no RVV build), then every VLEN of the table."""
    rows = variants() if table is None else table
    return (Config(NO_VECTOR, NO_VECTOR_CPU, 0), *(Config.for_variant(v) for v in rows))


def quick_plan(table: Sequence[Variant] | None = None) -> list[tuple[Config, tuple[str, ...]]]:
    """The configurations and pytest selections of `install-test-quick` (part of `nox -t test`)."""
    novector, first = configurations(table)[:2]
    return [(novector, QUICK_SELECTION[NO_VECTOR]), (first, QUICK_SELECTION["first-vlen"])]


@dataclass(frozen=True)
class Options:
    configs: tuple[Config, ...]
    wheel: Path | None  # None: build it with the wheel session's steps; a folder: its one release wheel


def parse_posargs(posargs: Sequence[str], table: Sequence[Variant] | None = None) -> tuple[Options, list[str]]:
    """Split ``--configs=novector,vlen256`` and ``--wheel=PATH`` from the pytest arguments that follow."""
    known = {c.name: c for c in configurations(table)}
    chosen = list(known.values())
    wheel = None
    rest = list(posargs)
    while rest and rest[0].startswith("--") and rest[0].split("=", 1)[0] in ("--configs", "--wheel"):
        option, _, value = rest.pop(0).partition("=")
        if not value:
            raise ConfigError(
                f"{option} needs a value, e.g. {option}="
                + ("novector,vlen256" if option == "--configs" else "dist/rvv_attn-....whl")
            )
        if option == "--configs":
            names = [n.strip() for n in value.split(",") if n.strip()]
            unknown = [n for n in names if n not in known]
            if unknown or not names:
                raise ConfigError(
                    f"--configs={value}: unknown configuration {', '.join(unknown) or '(none)'}; "
                    f"known: {', '.join(known)}"
                )
            chosen = [known[n] for n in names]
        else:
            wheel = Path(value).resolve()
            if wheel.is_dir():  # a dist folder, e.g. a downloaded CI artifact
                wheel = release_wheel(wheel)
            elif not wheel.is_file():
                raise ConfigError(f"--wheel={value}: no such file or folder")
    return Options(tuple(chosen), wheel), rest


def qemu_prefix(qemu: Path, sysroot: Path, cpu: str) -> list[str]:
    return [str(qemu), "-L", str(sysroot), "-cpu", cpu]


def create_venv_command(qemu: Path, sysroot: Path, venv: Path) -> list[str]:
    return [
        *qemu_prefix(qemu, sysroot, NO_VECTOR_CPU),
        guest_program(sysroot, "python3"),
        "-m",
        "venv",
        "--system-site-packages",
        "--without-pip",
        str(venv),
    ]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python3"


def pip_install_command(qemu: Path, sysroot: Path, venv: Path, wheel: Path) -> list[str]:
    """pip install as a user would, but with no index: it must need nothing beyond the wheel and the system."""
    return [
        *qemu_prefix(qemu, sysroot, NO_VECTOR_CPU),
        str(venv_python(venv)),
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        str(wheel),
    ]


def pytest_command(
    qemu: Path, sysroot: Path, venv: Path, config: Config, pytest_args: Sequence[str], junit: Path
) -> list[str]:
    # -P: do not put the working directory (the checkout) on sys.path.
    return [
        *qemu_prefix(qemu, sysroot, config.qemu_cpu),
        str(venv_python(venv)),
        "-P",
        "-m",
        "pytest",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit2",
        *pytest_args,
    ]


def pytest_env(
    config: Config, venv: Path, tmpdir: Path, qemu: Path, sysroot: Path, host_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The guest environment: no PYTHONPATH (only the installed package), and what the tests must check."""
    env = guest_env(
        None,
        tmpdir,
        host_env,
        extra={
            # For tests that start a second emulated process at another VLEN.
            "RVV_ATTN_QEMU": str(qemu),
            "RVV_ATTN_SYSROOT": str(sysroot),
            "RVV_ATTN_EXPECT_VARIANT": config.expected_variant,
            "RVV_ATTN_EXPECT_VLEN": str(config.vlen),
            "RVV_ATTN_QEMU_CPU": config.qemu_cpu,
            # The tests check that rvv_attn was imported from here.
            "RVV_ATTN_EXPECT_INSTALLED_IN": str(venv),
            # No pip configuration of the host (QEMU's -L falls back to the host's
            # /etc): pip sees the wheel, the venv and the system, nothing else.
            "PIP_CONFIG_FILE": "/dev/null",
        },
    )
    # A forced variant would defeat the check of what auto-selection picks.
    env.pop("RVV_ATTN_VARIANT", None)
    return env


@dataclass
class Timing:
    """Seconds per step of one configuration, for the report and the README."""

    config: str
    venv: float = 0.0
    install: float = 0.0
    tests: float = 0.0
    ok: bool = False

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return (
            f"{status} install-test {self.config:<10} venv {self.venv:5.1f} s, pip install {self.install:5.1f} s, "
            f"tests {self.tests:6.1f} s"
        )


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def lap(self) -> float:
        now = time.monotonic()
        elapsed, self.start = now - self.start, now
        return round(elapsed, 1)


def run_plan(
    qemu: Path, sysroot: Path, wheel: Path, plan: Sequence[tuple[Config, Sequence[str]]], work: Path, cwd: Path
) -> list[Timing]:
    """For each configuration: a fresh venv, pip install ``wheel``, pytest; results as for the test sessions.

    Returns the timings; each configuration's JUnit XML and summary.json go
    to build/results/install-test-<config>/.
    """
    timings = []
    for config, pytest_args in plan:
        label = f"install-test-{config.name}"
        venv = work / config.name / "venv"
        tmp = work / config.name / "tmp"
        if venv.parent.exists():
            shutil.rmtree(venv.parent)
        tmp.mkdir(parents=True)
        env = pytest_env(config, venv, tmp, qemu, sysroot)
        timing = Timing(config.name)
        clock = Clock()
        log(f"{label}: creating {venv} (system site packages) under QEMU")
        run(create_venv_command(qemu, sysroot, venv), env=env)
        timing.venv = clock.lap()
        log(f"{label}: pip install {wheel.name} (no index)")
        print(run(pip_install_command(qemu, sysroot, venv, wheel), env=env).rstrip(), flush=True)
        timing.install = clock.lap()
        junit = testrun.results_dir(label) / "junit.xml"
        junit.unlink(missing_ok=True)
        cmd = pytest_command(qemu, sysroot, venv, config, pytest_args, junit)
        log(f"{label}: running the suite against the installed package under QEMU ({config.qemu_cpu})")
        log(quote(cmd))
        returncode = subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL).returncode
        timing.tests = clock.lap()
        outcome = testrun.parse_junit(junit) if junit.exists() else None
        timing.ok = returncode == 0 and outcome is not None and outcome.ok
        testrun.write_summary(
            label,
            returncode,
            outcome,
            qemu_cpu=config.qemu_cpu,
            wheel=wheel.name,
            venv_seconds=timing.venv,
            install_seconds=timing.install,
            wall_seconds=timing.tests,
        )
        testrun.print_summary(label, returncode, outcome)
        timings.append(timing)
    return timings


def run_session(session: Session, plan: Sequence[tuple[Config, tuple[str, ...]]], wheel: Path | None) -> None:
    """The install test of ``wheel`` (built by the release steps if None): run ``plan``, print each
    configuration's outcome, fail if any failed."""
    qemu_bin, root = toolchain.ensure()
    wheel = wheel or release_artefacts(session)
    timings = run_plan(qemu_bin, root, wheel, plan, BUILD_DIR / "install-test", cwd=Path.cwd())
    print("\n".join(["", f"install test of {wheel.name}:", *(t.line() for t in timings)]), flush=True)
    if not all(t.ok for t in timings):
        raise DriverError(
            "the install test failed in some configuration (above); JUnit XML in build/results/install-test-*"
        )
