"""The board checks after apt (ci/board/run-board-checks.sh): venv, pip install, variant check, tests, benchmark.

Two stages, because the first runs under the system's python3, which has no rvv_attn:

1. (without ``--installed``) create a venv with the system site packages (Debian's torch), ``pip install``
   the wheel into it with no index, and run stage 2 with the venv's python;
2. (``--installed``) check that the variant the installed package picked matches the CPU's VLEN
   (``rvv_attn.runtime_info()``), run the test suite against the installed package (the kernel tests at the
   CPU's VLEN and with the portable build), run ``python -m rvv_attn.benchmark`` (``--quick`` by default),
   and write the results: ``junit.xml``, ``benchmark.json``, ``summary.md`` (the CI job appends it to the step
   summary) in ``--results``.

Standard library only until stage 2 imports rvv_attn. Under the project's emulated install test
(RVV_ATTN_QEMU set), child interpreters are started through qemu-riscv64, which a guest cannot do by itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTEST = "tests"
DEFAULT_BENCH = "--quick"


class CheckFailed(Exception):
    """A check failed; the message says what and what to do."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ci/board/run-board-checks.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, default=ROOT / "dist", help="the wheel, or a folder holding one (dist/)")
    p.add_argument("--installed", action="store_true", help="use this Python's rvv_attn: no venv, no pip")
    p.add_argument("--venv", type=Path, default=ROOT / "build" / "board" / "venv", help="where to create the venv")
    p.add_argument("--results", type=Path, default=ROOT / "build" / "results" / "board", help="results folder")
    p.add_argument("--expect-vlen", type=int, help="fail unless the CPU has this VLEN (the CI job: 256, a K1)")
    p.add_argument("--pytest", default=DEFAULT_PYTEST, help=f"pytest arguments (default: {DEFAULT_PYTEST!r})")
    p.add_argument("--bench", default=DEFAULT_BENCH, help=f"benchmark arguments (default: {DEFAULT_BENCH!r})")
    # Handled by the shell script; accepted here so the same command line reaches both.
    p.add_argument("--no-apt", action="store_true", help="do not apt-get install Debian's python3 and torch")
    p.add_argument("--container", action="store_true", help="run all of this in a debian:trixie container")
    return p.parse_args(argv)


def find_wheel(path: Path) -> Path:
    if path.is_file():
        return path
    wheels = sorted(path.glob("rvv_attn-*.whl")) if path.is_dir() else []
    if len(wheels) != 1:
        found = ", ".join(w.name for w in wheels) or "none"
        raise CheckFailed(
            f"--wheel={path}: need one rvv_attn-*.whl there, found {found}; download the CI's dist artifact or "
            "a release wheel, or build it with `./ci/nox -s wheel`"
        )
    return wheels[0]


def venv_commands(venv: Path, wheel: Path) -> list[list[str]]:
    """Stage 1: a venv that sees Debian's torch, and the wheel installed into it with no index."""
    pip = [str(venv / "bin" / "python3"), "-m", "pip", "install", "--no-index", "--disable-pip-version-check"]
    return [
        [sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)],
        [*pip, "--force-reinstall", "--no-deps", str(wheel)],
    ]


def expected_variant(info: Mapping[str, object], expect_vlen: int | None) -> str:
    """The variant the CPU calls for; CheckFailed when the installed package picked another, lacks it, or the
    CPU's VLEN is not ``expect_vlen``."""
    vlen = int(info["cpu_vlen"])
    want = f"vlen{vlen}" if vlen else "portable"
    if expect_vlen is not None and vlen != expect_vlen:
        raise CheckFailed(
            f"this CPU has VLEN {vlen} (runtime_info: {info}), but --expect-vlen={expect_vlen}: the job ran on "
            "another machine than the one it was written for"
        )
    if want not in info["compiled_variants"]:
        raise CheckFailed(
            f"the wheel has no variant for this CPU's VLEN {vlen} (it has {', '.join(info['compiled_variants'])});"
            " it runs the portable build: add the VLEN to toolchains/vlens.json"
        )
    if info["active_variant"] != want:
        raise CheckFailed(
            f"rvv_attn picked {info['active_variant']} on a CPU with VLEN {vlen} ({info['reason']}); expected "
            f"{want}. Is RVV_ATTN_VARIANT set? runtime_info: {info}"
        )
    return want


def child_prefix(env: Mapping[str, str]) -> list[str]:
    """How to start another interpreter of this machine: directly, or through qemu-riscv64 when this one is
    emulated by the project's install test (a guest cannot start a riscv64 program by itself)."""
    qemu, sysroot, cpu = (env.get(k) for k in ("RVV_ATTN_QEMU", "RVV_ATTN_SYSROOT", "RVV_ATTN_QEMU_CPU"))
    return [qemu, "-L", sysroot, "-cpu", cpu] if qemu and sysroot and cpu else []


def pytest_command(python: str, pytest_args: str, junit: Path, env: Mapping[str, str]) -> list[str]:
    # -P: the checkout is not on sys.path, so the tests import the installed package.
    return [*child_prefix(env), python, "-P", "-m", "pytest", f"--junitxml={junit}", *shlex.split(pytest_args)]


def pytest_env(env: Mapping[str, str], variant: str, vlen: int, prefix: str) -> dict[str, str]:
    """What tests/conftest.py reads: the variant that must be active (the kernel tests run it and, with
    RVV_ATTN_TEST_PORTABLE=1, the portable build too) and the venv the package must come from."""
    out = {k: v for k, v in env.items() if k != "RVV_ATTN_VARIANT"}  # a forced variant defeats the check
    out.update(
        {
            "RVV_ATTN_EXPECT_VARIANT": variant,
            "RVV_ATTN_EXPECT_VLEN": str(vlen),
            "RVV_ATTN_TEST_PORTABLE": "1",
            "RVV_ATTN_EXPECT_INSTALLED_IN": prefix,
        }
    )
    return out


def bench_args(bench: str, results: Path) -> list[str]:
    """The benchmark's command line: the plan, then the results and the cycle model of this checkout."""
    return [*shlex.split(bench), "--json", str(results / "benchmark.json"), "--markdown", str(results / "summary.md")]


def log(message: str) -> None:
    print(f"[board] {message}", flush=True)


def installed_checks(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Stage 2, in the interpreter that has rvv_attn installed."""
    import rvv_attn

    results = args.results
    results.mkdir(parents=True, exist_ok=True)
    summary = results / "summary.md"
    info = rvv_attn.runtime_info()
    log(f"rvv_attn {info['version']} from {Path(rvv_attn.__file__).parent}; runtime_info: {info}")
    variant = expected_variant(info, args.expect_vlen)
    log(f"variant: {variant} matches the CPU's VLEN {info['cpu_vlen']}")
    lines = [
        "## rvv-attn board checks",
        "",
        f"- rvv_attn {info['version']}, torch {info['torch']}: variant **{variant}** matches the CPU's "
        f"VLEN {info['cpu_vlen']} ({info['cpu_detection']}: {', '.join(info['cpu_extensions']) or 'no V'})",
    ]
    junit = results / "junit.xml"
    cmd = pytest_command(sys.executable, args.pytest, junit, env)
    log(f"tests: {shlex.join(cmd)}")
    started = time.monotonic()
    tests = subprocess.run(cmd, env=pytest_env(env, variant, int(info["cpu_vlen"]), sys.prefix), cwd=ROOT)
    verdict = "passed" if tests.returncode == 0 else f"FAILED (pytest exit {tests.returncode})"
    seconds = time.monotonic() - started
    lines.append(f"- tests (`pytest {args.pytest}`, {variant} and portable): {verdict} in {seconds:.0f} s")
    summary.write_text("\n".join(lines) + "\n\n")

    from rvv_attn.benchmark import cli

    argv = bench_args(args.bench, results)
    if "--cycle-model" not in argv:
        argv += ["--cycle-model", str(ROOT / "bench" / "baseline.json")]
    log(f"benchmark: python -m rvv_attn.benchmark {shlex.join(argv)}")
    bench_status = cli.main(argv)
    log(f"results in {results}: junit.xml, benchmark.json, summary.md")
    if tests.returncode != 0 or bench_status != 0:
        raise CheckFailed(f"tests {verdict}, benchmark exit {bench_status}: see above and {results}")
    return 0


def install_and_rerun(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Stage 1: the venv and the wheel, then stage 2 in the venv."""
    wheel = find_wheel(args.wheel)
    for cmd in venv_commands(args.venv, wheel):
        log(shlex.join(cmd))
        if subprocess.run(cmd).returncode != 0:
            raise CheckFailed(f"`{shlex.join(cmd)}` failed (above); is python3-venv installed (or drop --no-apt)?")
    python = str(args.venv / "bin" / "python3")
    return subprocess.run([python, __file__, "--installed", *argv]).returncode


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        if args.installed:
            return installed_checks(args, os.environ if env is None else env)
        return install_and_rerun(args, argv)
    except CheckFailed as err:
        log(f"FAILED: {err}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
