"""Reproduce a failure across VLENs and agnostic policies: the `nox -s repro` matrix.

A selection of tests runs in every configuration (host portable build, and
each VLEN with QEMU's default undisturbed policy and with all-ones agnostic
lanes), several configurations at once, each into its own log and JUnit XML.
The result is a test x configuration matrix, a JSON summary, and an exit
status that is non-zero when any cell failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR
from ..proc import log
from ..session import Session
from ..toolchain import build, host_packages
from ..toolchain.vlens import Variant, by_vlen, parse_vlens_option, variants
from ..warm import Target, ping, route
from . import testrun

POLICIES = ("undisturbed", "agnostic")
CELL = {"passed": ".", "failed": "F", "error": "E", "skipped": "s", "missing": "-"}


@dataclass(frozen=True)
class Config:
    """One column of the matrix: the host build, or one VLEN under one tail/mask policy."""

    vlen: int | None
    agnostic: bool = False

    @property
    def label(self) -> str:
        if self.vlen is None:
            return "host"
        return f"vlen{self.vlen}" + ("-agnostic" if self.agnostic else "")

    @property
    def variant(self) -> Variant:
        assert self.vlen is not None
        return by_vlen(self.vlen)


@dataclass
class Options:
    vlens: list[int] = field(default_factory=lambda: [v.vlen for v in variants()])
    policies: list[str] = field(default_factory=lambda: list(POLICIES))
    host: bool = True
    stop_at_first_failure: bool = False
    jobs: int = 0  # 0: one per core
    gdb: bool = False
    gdb_port: int = 1234


def parse_posargs(posargs: Sequence[str]) -> tuple[Options, list[str]]:
    """Split the session's arguments into repro options and pytest's arguments."""
    opts = Options()
    rest: list[str] = []
    for arg in posargs:
        name, sep, value = arg.partition("=")
        if name == "--vlens" and sep:
            try:
                opts.vlens = parse_vlens_option(value, allow_all=False)
            except ValueError as err:
                raise ConfigError(f"--vlens={value}: {err}") from err
        elif name == "--policies" and sep:
            opts.policies = [p for p in value.split(",") if p]
            unknown = set(opts.policies) - set(POLICIES)
            if unknown:
                raise ConfigError(
                    f"--policies: unknown {', '.join(sorted(unknown))}; choose from {', '.join(POLICIES)}"
                )
        elif arg == "--no-host":
            opts.host = False
        elif arg == "--stop-at-first-failure":
            opts.stop_at_first_failure = True
        elif name == "--jobs" and sep:
            opts.jobs = int(value)
        elif arg == "--gdb":
            opts.gdb = True
        elif name == "--gdb-port" and sep:
            opts.gdb_port = int(value)
        else:
            rest.append(arg)
    if not rest:
        raise ConfigError(
            "nox -s repro needs a test selection after --",
            "e.g. nox -s repro -- tests/test_kv_write.py::test_empty_batch_is_a_no_op, or -- -k bfloat16 tests",
        )
    if opts.stop_at_first_failure:
        rest = ["-x", *rest]
    return opts, rest


def configurations(opts: Options) -> list[Config]:
    configs = [Config(None)] if opts.host else []
    for vlen in opts.vlens:
        for policy in opts.policies:
            configs.append(Config(vlen, policy == "agnostic"))
    return configs


@dataclass
class CellResult:
    status: str  # passed, failed, error, skipped
    message: str = ""


@dataclass
class ConfigResult:
    config: Config
    returncode: int
    seconds: float
    log: Path
    cases: dict[str, CellResult]

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def parse_junit_cases(path: Path) -> dict[str, CellResult]:
    """Per-test outcomes from pytest's JUnit XML, keyed by a pytest-like node id."""
    cases: dict[str, CellResult] = {}
    if not path.exists():
        return cases
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        node = f"{module}.py::{case.get('name', '')}" if module else case.get("name", "")
        result = CellResult("passed")
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (child.get("message") or (child.text or "")).strip().splitlines()
                result = CellResult(status, message[0][:200] if message else "")
                break
        cases[node] = result
    return cases


Runner = Callable[[Config, Path, Path], tuple[list[str], dict[str, str]]]


def command_factory(host_python: str, qemu: Path, sysroot: Path, stage: Path, pytest_args: Sequence[str]) -> Runner:
    """Commands for each configuration: the host venv's pytest, or the suite under QEMU (warm target if running)."""

    def command_for(config: Config, junit: Path, out_dir: Path) -> tuple[list[str], dict[str, str]]:
        if config.vlen is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RVV_ATTN_EXPECT")}
            return [host_python, "-m", "pytest", f"--junitxml={junit}", *pytest_args], env
        cmd, env = testrun.emulated_pytest(qemu, sysroot, stage, config.variant, pytest_args, junit, config.agnostic)
        return route(cmd, env), env

    return command_for


def warm_report(configs: Sequence[Config]) -> str:
    """Which emulated configurations have a warm target running (the others start cold, ~24 s each)."""
    emulated = [c for c in configs if c.vlen is not None]
    warm = [c.label for c in emulated if ping(Target(c.vlen, c.agnostic).socket_path()) is not None]  # type: ignore[arg-type]
    cold = [c.label for c in emulated if c.label not in warm]
    parts = [f"warm targets: {', '.join(warm)}" if warm else "no warm target running"]
    if cold:
        parts.append(f"cold starts: {', '.join(cold)} (nox -s warm -- --vlens=... --policies=all makes them warm)")
    return "; ".join(parts)


def run_matrix(
    configs: Sequence[Config],
    command_for: Runner,
    out_dir: Path,
    jobs: int = 0,
    stop_at_first_failure: bool = False,
    report: Callable[[str], None] = print,
    paths: Callable[[Config], tuple[Path, Path]] | None = None,
) -> list[ConfigResult]:
    """Run every configuration (``command_for`` gives its command and environment) in parallel.

    ``jobs`` processes at once, started in the order of ``configs``; each writes its log and JUnit XML to
    ``paths(config)`` (default: ``out_dir/<label>.log`` and ``.xml``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 1
    results: list[ConfigResult] = []
    failed = False

    def one(config: Config) -> ConfigResult:
        log_path, junit = paths(config) if paths else (out_dir / f"{config.label}.log", out_dir / f"{config.label}.xml")
        junit.unlink(missing_ok=True)
        if stop_at_first_failure and failed:
            return ConfigResult(config, -1, 0.0, log_path, {})
        cmd, env = command_for(config, junit, out_dir)
        start = time.monotonic()
        with log_path.open("w") as log:
            log.write("$ " + " ".join(cmd) + "\n\n")
            log.flush()
            code = subprocess.run(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            ).returncode
        return ConfigResult(config, code, time.monotonic() - start, log_path, parse_junit_cases(junit))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, c) for c in configs]
        for future in as_completed(futures):
            r = future.result()
            results.append(r)
            failed = failed or not r.ok
            state = (
                "skipped (an earlier configuration failed)"
                if r.returncode == -1
                else ("ok" if r.ok else f"FAILED (exit {r.returncode})")
            )
            report(f"[{len(results)}/{len(configs)}] {r.config.label}: {state} in {r.seconds:.0f} s; log {r.log}")
    order = {c.label: i for i, c in enumerate(configs)}
    return sorted(results, key=lambda r: order[r.config.label])


def format_matrix(results: Sequence[ConfigResult], max_rows: int = 60) -> str:
    """Tests down, configurations across; '.' pass, F fail, E error, s skip, - not run."""
    labels = [r.config.label for r in results]
    tests = sorted({t for r in results for t in r.cases})
    width = max([len(t) for t in tests] + [10])
    lines = ["  ".join([" " * width, *[f"{i:>2}" for i in range(1, len(labels) + 1)]])]
    all_pass = 0
    for test in tests:
        cells = [r.cases.get(test, CellResult("missing")).status for r in results]
        if len(tests) > max_rows and all(c == "passed" for c in cells):
            all_pass += 1
            continue
        lines.append("  ".join([test.ljust(width), *[f"{CELL[c]:>2}" for c in cells]]))
    if all_pass:
        lines.append(f"... and {all_pass} more tests that passed in every configuration")
    lines.append("")
    lines += [
        f"{i:>2} = {label}" + ("" if r.ok else f"  (exit {r.returncode}, log {r.log})")
        for i, (label, r) in enumerate(zip(labels, results), 1)
    ]
    failures = [
        (test, r.config.label, cell.message)
        for r in results
        for test, cell in r.cases.items()
        if cell.status in ("failed", "error")
    ]
    if failures:
        lines += ["", "first failing assertion per cell:"]
        lines += [f"  {label:<18} {test}: {msg}" for test, label, msg in failures[:40]]
    broken = [r for r in results if not r.ok and not r.cases and r.returncode != -1]
    for r in broken:
        lines.append(f"  {r.config.label}: pytest ran no test (exit {r.returncode}); see {r.log}")
    return "\n".join(lines)


def summary_json(results: Sequence[ConfigResult]) -> str:
    return (
        json.dumps(
            {
                r.config.label: {
                    "vlen": r.config.vlen,
                    "agnostic": r.config.agnostic,
                    "returncode": r.returncode,
                    "seconds": round(r.seconds, 1),
                    "log": str(r.log),
                    "tests": {t: c.__dict__ for t, c in r.cases.items()},
                }
                for r in results
            },
            indent=2,
        )
        + "\n"
    )


def gdb_instructions(qemu_port: int, sysroot: Path, stage: Path, variant: Variant, python: str) -> str:
    """The commands to attach gdb-multiarch to a guest started with ``qemu-riscv64 -g <port>``."""
    ns = f"rvv_attn::{variant.name}"
    return f"""\
The test is waiting for a debugger (qemu-riscv64 -g {qemu_port}, VLEN {variant.vlen}). In another terminal:

  gdb-multiarch -q \\
    -ex 'set sysroot {sysroot}' \\
    -ex 'set solib-search-path {stage}/rvv_attn' \\
    -ex 'file {python}' \\
    -ex 'target remote localhost:{qemu_port}' \\
    -ex 'set breakpoint pending on' \\
    -ex 'break {ns}::write_kv' \\
    -ex 'continue'

Break on any kernel of this VLEN's build by its namespace ({ns}::...; `info functions {ns}::` lists them).
At a breakpoint:
  info registers vector     all vector registers (v0-v31) and vtype/vl/vlenb
  p $vl                     active vector length;  p $vlenb  VLEN in bytes
  p $v8.w                   v8 as 32-bit lanes (.h 16-bit, .b bytes, .d 64-bit)
  x/8fw $a0                 8 floats at the first pointer argument
  stepi / display/i $pc     step instruction by instruction
The library is built with debug info (RelWithDebInfo) for this session."""


def run_session(session: Session, opts: Options, pytest_args: list[str], host_requirements: Sequence[str]) -> None:
    """`nox -s repro`: the configurations of ``opts``, a matrix of their outcomes and a JSON summary; or with
    --gdb, one configuration waiting for a debugger."""
    qemu_bin, root = toolchain.ensure()
    if opts.gdb:
        gdb_session(session, opts, pytest_args, qemu_bin, root)
        return
    if opts.host:
        toolchain.host_build(session, host_requirements, BUILD_DIR / "host-repro")
    stage = toolchain.stage_for(session, root, [by_vlen(v) for v in opts.vlens])
    out = testrun.results_dir("repro")
    configs = configurations(opts)
    log(warm_report(configs))
    log(f"running {len(configs)} configurations, {opts.jobs or os.cpu_count()} at a time; logs in {out}")
    python = str(Path(session.bin) / "python")
    results = run_matrix(
        configs,
        command_factory(python, qemu_bin, root, stage, pytest_args),
        out,
        opts.jobs,
        opts.stop_at_first_failure,
        report=log,
    )
    (out / "summary.json").write_text(summary_json(results))
    print("\n" + format_matrix(results) + f"\n\nJSON summary: {out / 'summary.json'}")
    if not all(r.ok for r in results):
        raise DriverError("some configurations failed (matrix above)")


def gdb_session(session: Session, opts: Options, pytest_args: list[str], qemu_bin: Path, root: Path) -> None:
    """The tests at the first VLEN of ``opts`` in a debug build, QEMU waiting for gdb-multiarch."""
    host_packages.ensure_host_packages(host_packages.DEBUGGER_PACKAGES)
    variant = by_vlen(opts.vlens[0])
    stage = build.stage_wheel(
        toolchain.cross_build(session, root, BUILD_DIR / "wheels-debug", debug=True), BUILD_DIR / "stage-riscv64-debug"
    )
    junit = testrun.results_dir("repro-gdb") / "junit.xml"
    cmd, env = testrun.emulated_pytest(
        qemu_bin, root, stage, variant, pytest_args, junit, opts.policies == ["agnostic"]
    )
    cmd = [cmd[0], "-g", str(opts.gdb_port), *cmd[1:]]
    print(gdb_instructions(opts.gdb_port, root, stage, variant, cmd[cmd.index("-cpu") + 2]), flush=True)
    session.run(*cmd, env=env, include_outer_env=False, external=True)
