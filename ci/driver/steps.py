"""Steps several nox sessions share, written against the few session methods they use.

A step gets the session (anything with ``run``, ``install`` and ``bin``, as
``nox.Session`` has) and raises DriverError on failure; the noxfile turns
that into the session's error. The unit tests pass a recorder instead of a
session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import DriverError
from .paths import BUILD_DIR, PROJECT_ROOT
from .proc import Stopwatch, log
from .release import artefacts as release
from .testing import shards, testrun
from .toolchain import build, host_packages, qemu, sysroot
from .toolchain.vlens import Variant, variants


class Session(Protocol):
    """What the steps use of ``nox.Session``."""

    @property
    def bin(self) -> str: ...

    def run(self, *args: str, **kwargs: Any) -> Any: ...

    def install(self, *args: str, **kwargs: Any) -> Any: ...

    def error(self, *args: Any) -> Any: ...


@contextlib.contextmanager
def reported_errors(session: Session) -> Iterator[None]:
    """Turn the driver's errors into the session's error: the message and its hint, no traceback."""
    try:
        yield
    except DriverError as err:
        session.error(str(err))


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


def summary_lines(started: float) -> list[str]:
    """The summary session's report: the wall time of each session and each configuration's result since
    ``started``."""
    return [
        "",
        "rvv-attn test summary:",
        "sessions, in the order they ran (wall time):",
        *(testrun.session_table(started) or ["(no timed session ran in this invocation)"]),
        "configurations:",
        *(testrun.summary_table(started) or ["(no test session ran in this invocation)"]),
    ]


def toolchain() -> tuple[Path, Path]:
    """Host packages, pinned QEMU and sysroot: each step is a no-op when already done."""
    host_packages.ensure_host_packages()
    qemu_bin = qemu.ensure_qemu()
    return qemu_bin, sysroot.ensure_sysroot(qemu_bin)


def install_build_tools(session: Session) -> None:
    # pip's own "already satisfied" check costs seconds: skip it when the tools are there.
    if not build.build_tools_present(Path(session.bin)):
        session.install(*build.BUILD_REQUIREMENTS)


def cross_build(
    session: Session,
    root: Path,
    out_dir: Path = BUILD_DIR / "wheels",
    debug: bool = False,
    only: Sequence[Variant] | None = None,
) -> Path:
    """Build (incrementally) the riscv64 wheel with the portable build and every VLEN variant (or ``only``)."""
    install_build_tools(session)
    host_packages.ensure_host_packages(build.COMPILER_CACHE_PACKAGES)
    kind: dict[str, Any] = dict(build_dir=BUILD_DIR / "riscv64-debug", build_type="RelWithDebInfo") if debug else {}
    if only:
        kind = dict(build_dir=build.cross_tree(only).build)
    what = f"portable + {', '.join(v.name for v in only)}" if only else "portable + every VLEN variant"
    with Stopwatch(f"cross-building the riscv64 wheel ({what}; incremental)"):
        session.run(
            "python",
            "-m",
            "pip",
            *build.cross_wheel_args(root, out_dir, only or variants(), launcher="ccache", **kind),
            silent=True,
            env=build.compiler_cache_env(),
        )
    return build.newest_wheel(out_dir)


def stage_for(session: Session, root: Path, only: Sequence[Variant]) -> Path:
    """The library for a session that runs only ``only``: the full build if it is current, else portable + those."""
    install_build_tools(session)
    full = build.cross_tree()
    if build.is_current(full, str(Path(session.bin) / "ninja")):
        log("the full build (every VLEN) is current: using it")
        stage = build.stage_wheel(build.newest_wheel(full.wheels), full.stage)
        return build.record_variants(stage, variants())
    tree = build.cross_tree(only)
    # Configured and staged from a wheel before: ninja alone compiles what changed.
    if (tree.build / "build.ninja").exists() and build.stage_has_metadata(tree.stage):
        with Stopwatch(f"building portable + {', '.join(v.name for v in only)} in {tree.build} (incremental)"):
            session.run("ninja", "-C", str(tree.build), env=build.compiler_cache_env(), silent=True)
        stage = build.stage_tree(tree)
    else:
        stage = build.stage_wheel(cross_build(session, root, tree.wheels, only=only), tree.stage)
    return build.record_variants(stage, sorted(only, key=lambda v: v.vlen))


def host_build(
    session: Session, requirements: Sequence[str], build_dir: Path = BUILD_DIR / "host", defines: Sequence[str] = ()
) -> None:
    """Install ``requirements`` (the host's torch, the test tools), then build and install the portable kernels."""
    host_packages.ensure_host_packages({**host_packages.HOST_PACKAGES, **build.COMPILER_CACHE_PACKAGES})  # one apt run
    session.install(*requirements, *build.BUILD_REQUIREMENTS)
    with Stopwatch("building the portable kernels for the host (incremental)"):
        session.run(
            "python",
            "-m",
            "pip",
            *build.host_install_args(build_dir, list(defines), launcher="ccache"),
            silent=True,
            env=build.compiler_cache_env(),
        )


def sanitizer_env(session: Session) -> dict[str, str]:
    """After host_build of the sanitized kernels: check the installed library is sanitized, return the
    environment that preloads the ASan runtime."""
    package_dir = session.run(
        "python",
        "-c",
        "import importlib.util as u; print(u.find_spec('rvv_attn').submodule_search_locations[0])",
        silent=True,
    ).strip()
    build.check_sanitized(Path(package_dir) / "librvv_attn_ops.so")
    runtime = session.run(
        "clang++-19", "-print-file-name=libclang_rt.asan-x86_64.so", silent=True, external=True
    ).strip()
    return build.sanitizer_env(runtime)


def pytest_in_session(session: Session, label: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
    """pytest in the session's venv; the outcome is recorded for the summary session."""
    junit = testrun.results_dir(label) / "junit.xml"
    junit.unlink(missing_ok=True)
    try:
        session.run("python", "-m", "pytest", f"--junitxml={junit}", *args, env=env)
    finally:
        outcome = testrun.parse_junit(junit) if junit.exists() else None
        code = 0 if outcome and outcome.ok else 1
        testrun.write_summary(label, code, outcome)
        testrun.print_summary(label, code, outcome)


def emulated_suite(session: Session, variant: Variant, agnostic: bool, posargs: Sequence[str]) -> None:
    """A test-vlenN[-agnostic] session: the suite under QEMU at ``variant``'s VLEN, split over the cores."""
    jobs, pytest_args = shards.take_jobs(posargs, os.cpu_count() or 1)
    qemu_bin, root = toolchain()
    stage = stage_for(session, root, [variant])
    label = f"test-{variant.name}" + ("-agnostic" if agnostic else "")
    code, outcome = testrun.run_emulated_pytest(
        qemu_bin, root, stage, variant, pytest_args or ["tests"], agnostic_ones=agnostic, label=label, jobs=jobs
    )
    testrun.print_summary(label, code, outcome)
    if code != 0:
        session.error(f"{label}: pytest exited with {code}; JUnit XML and summary in {testrun.results_dir(label)}")


def release_artefacts(session: Session, root: Path, dist: Path = release.DIST_DIR) -> Path:
    """sdist -> wheel built from it -> auditwheel repair -> checks; returns the wheel in ``dist``."""
    session.install(*build.BUILD_REQUIREMENTS, *release.RELEASE_REQUIREMENTS)
    release.clear_artifacts(dist)
    with Stopwatch("building the sdist"):
        session.run("python", *release.sdist_command(dist), silent=True)
    sdist = release.release_sdist(dist)
    source = release.sync_sdist(sdist, release.SOURCE_DIR)
    raw = release.reset_dir(release.RAW_WHEEL_DIR)
    # Through ccache where the machine has it (every test session installs it): the cache only returns
    # what the same compiler made of the same preprocessed source and flags.
    launcher = "ccache" if shutil.which("ccache") else None
    with Stopwatch(f"cross-building the wheel from {sdist.name} (portable + every VLEN variant)"):
        session.run(
            "python",
            "-m",
            "pip",
            *release.wheel_from_sdist_args(root, source, raw, launcher=launcher),
            silent=True,
            env=build.compiler_cache_env(source),
        )
    session.run("auditwheel", "show", str(build.newest_wheel(raw)))
    session.run("auditwheel", *release.auditwheel_repair_args(build.newest_wheel(raw), dist))
    wheel, sdist = release.checked_artefacts(dist)
    session.run("twine", "check", "--strict", str(wheel), str(sdist))
    log(f"sdist: {sdist} ({sdist.stat().st_size / 1e3:.0f} kB)")
    log(f"wheel: {wheel} ({wheel.stat().st_size / 1e6:.2f} MB)")
    return wheel


# ---- sessions beside the emulated pool ----------------------------------------------------------


@dataclass
class Beside:
    """Sessions run as one more process beside test-emulated's configurations, and how that process ended."""

    sessions: tuple[str, ...]
    log_path: Path
    returncode: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.sessions) and self.returncode != 0


def nested_nox_command(sessions: Sequence[str], noxfile: Path = PROJECT_ROOT / "noxfile.py") -> list[str]:
    """This nox (the interpreter running the noxfile) on ``sessions``, in the order given."""
    return [sys.executable, "-m", "nox", "--noxfile", str(noxfile), "--sessions", *sessions]


@contextlib.contextmanager
def sessions_beside(
    sessions: Sequence[str],
    report: Callable[[str], None] = log,
    log_path: Path = BUILD_DIR / "results" / "test-emulated" / "beside.log",
    command: Sequence[str] | None = None,
) -> Iterator[Beside]:
    """Run ``sessions`` (nox, or ``command``) in the background while the block runs; after it, wait for them,
    print their output and set ``returncode``. An exception in the block stops them."""
    beside = Beside(tuple(sessions), log_path)
    if not sessions:
        yield beside
        return
    cmd = list(command or nested_nox_command(sessions))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    report(f"beside them, one more process runs nox -s {' '.join(sessions)}; its output: {log_path}")
    started_wall = time.time()
    with log_path.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield beside
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    if proc.poll() is None:
        report(f"waiting for nox -s {' '.join(sessions)} (output so far in {log_path})")
    beside.returncode = proc.wait()
    # The process may have ended long before the block did: its last write is when it ended.
    took = log_path.stat().st_mtime - started_wall
    print(f"\n---- nox -s {' '.join(sessions)}, run beside the emulated configurations ----", flush=True)
    print(log_path.read_text(errors="replace"), end="", flush=True)
    outcome = "ok" if beside.returncode == 0 else f"failed (exit {beside.returncode})"
    report(f"nox -s {' '.join(sessions)} beside them: {outcome} in {max(took, 0):.0f} s")
