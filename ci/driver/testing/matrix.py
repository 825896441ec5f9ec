"""The emulated part of `nox -t test`: every VLEN and the agnostic lanes, several configurations at once.

Each configuration is one qemu-riscv64 process with its own log, JUnit XML and
summary.json under build/results/test-<configuration>/ (the folders the single
test-vlenN sessions write too). A QEMU process keeps one core busy, so one
runs per core, plus one while the host-side sessions run beside them (see
default_jobs), the longest first. The tests marked variant_independent (no
kernel reachable, checked by the suite) run in one configuration only
(``vlens.variant_independent_lane``); every other test runs in all of them.
One report at the end names each failing configuration and test.

The host-side sessions of `nox -t test` (``BESIDE_GROUPS``) run beside the
pool as two more processes: on 2 cores they fill the gaps the emulated
configurations leave instead of running after them, each with its sessions'
output in build/results/test-emulated/beside.log (beside-2.log, ...), printed
when they end. Each ``--beside`` option is one such process.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError
from ..paths import BUILD_DIR
from ..proc import log
from ..session import Session
from ..toolchain import vlens
from ..warm import route
from . import repro, testrun
from .beside import beside_log, sessions_beside

Config = repro.Config


def configurations() -> list[Config]:
    """Every VLEN with QEMU's default (undisturbed) policy, and the agnostic lanes `nox -t test` runs
    (``test_agnostic_lane`` of toolchains/vlens.json)."""
    return [Config(v.vlen) for v in vlens.variants()] + [
        Config(vlen, True) for vlen in vlens.agnostic_lane_in_test_tag()
    ]


def known_configurations() -> list[Config]:
    """What ``--configs`` may name: every VLEN with either policy."""
    return [Config(v.vlen, agnostic) for agnostic in (False, True) for v in vlens.variants()]


def label(config: Config) -> str:
    """The name of the single session that runs the same configuration (and of its results folder)."""
    return f"test-{config.label}"


def runs_variant_independent(config: Config) -> bool:
    return config.vlen == vlens.variant_independent_lane() and not config.agnostic


def selection_env(config: Config) -> dict[str, str]:
    """What tells the suite's conftest whether this configuration runs the variant-independent tests, and that
    no configuration here runs the kernel tests against the portable build.

    test-vlen128 runs them under QEMU (the portable lane; CI's emulated job at VLEN 128), at a cost of 260 s
    of that configuration's 564 s. Within `nox -t test` the portable build is covered by test-host (the whole
    suite, natively), sanitize, and install-test-quick's run of the installed wheel on a CPU without V.
    """
    return {
        "RVV_ATTN_VARIANT_INDEPENDENT": "run" if runs_variant_independent(config) else "deselect",
        "RVV_ATTN_TEST_PORTABLE": "0",
    }


# The sessions of `nox -t test` that test-emulated runs beside its configurations: two processes, each running
# its group in order. One chain of all five outlasted the pool (~14.5 of `-t test`'s ~19 min) and then ran
# alone with a core idle. The host builds (test-host, sanitize) go in one, the sessions on the riscv64 cross
# build and its wheel (test-toolchain, install-test-quick, bench-check) in the other, so no two processes
# build in one folder.
BESIDE_GROUPS = (("test-host", "sanitize"), ("test-toolchain", "install-test-quick", "bench-check"))
BESIDE = tuple(name for group in BESIDE_GROUPS for name in group)
# Sessions --beside may name besides those: SGLang's share rides beside its torch line's quick run (see
# torch_line_runs.quick_args), where the one configuration leaves a core free.
ALSO_BESIDE = ("test-sglang-quick",)


@dataclass
class Options:
    jobs: int = 0  # 0: one per core
    configs: list[Config] = field(default_factory=configurations)
    pytest_args: list[str] = field(default_factory=lambda: ["tests"])
    # One tuple of sessions per process beside the pool.
    beside: tuple[tuple[str, ...], ...] = BESIDE_GROUPS


def parse_posargs(posargs: Sequence[str]) -> Options:
    """``--jobs=N``, ``--configs=vlen128,vlen1024-agnostic``, ``--beside=none|sanitize,...`` (each ``--beside``
    one more process); anything else goes to pytest (default: tests). Chosen configurations or pytest arguments
    mean no session beside, unless ``--beside`` names some."""
    opts = Options()
    rest: list[str] = []
    beside: list[tuple[str, ...]] | None = None
    known = {c.label: c for c in known_configurations()}
    for arg in posargs:
        name, sep, value = arg.partition("=")
        if name == "--jobs" and sep:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"--jobs={value}: give a number of processes, 1 or more")
            opts.jobs = int(value)
        elif name == "--configs" and sep:
            wanted = [c for c in value.split(",") if c]
            unknown = [c for c in wanted if c not in known]
            if unknown or not wanted:
                raise ConfigError(
                    f"--configs={value}: unknown {', '.join(unknown) or '(none given)'}",
                    f"choose from {', '.join(known)}",
                )
            opts.configs = [known[c] for c in wanted]
        elif name == "--beside" and sep:
            group = () if value == "none" else tuple(b for b in value.split(",") if b)
            unknown = [b for b in group if b not in (*BESIDE, *ALSO_BESIDE)]
            if unknown or (value != "none" and not group):
                raise ConfigError(
                    f"--beside={value}: unknown {', '.join(unknown) or '(none given)'}",
                    f"choose from {', '.join((*BESIDE, *ALSO_BESIDE))}, or none",
                )
            beside = [] if value == "none" else [*(beside or []), group]
        else:
            rest.append(arg)
    if rest:
        opts.pytest_args = rest
    narrowed = bool(rest) or opts.configs != configurations()
    opts.beside = tuple(beside) if beside is not None else (() if narrowed else BESIDE_GROUPS)
    return opts


def recorded_seconds(results: Path | None = None) -> dict[str, float]:
    """Each configuration's last recorded wall time (summary.json), by its session label."""
    found: dict[str, float] = {}
    for path in (results or BUILD_DIR / "results").glob("test-*/summary.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("wall_seconds"):
            found[data["label"]] = float(data["wall_seconds"])
    return found


def order(configs: Sequence[Config], seconds: Mapping[str, float]) -> list[Config]:
    """Longest first, so the last process to start is a short one and both cores finish close together.

    By the last recorded wall time; a configuration never run before ranks by what usually costs most: the
    portable lane (it also runs the portable build), then the agnostic lanes, then the larger VLENs.
    """

    def static_rank(c: Config) -> tuple[int, int, int]:
        return (c.vlen == vlens.portable_lane() and not c.agnostic, c.agnostic, c.vlen or 0)

    known = [c for c in configs if label(c) in seconds]
    new = [c for c in configs if label(c) not in seconds]
    return sorted(new, key=static_rank, reverse=True) + sorted(known, key=lambda c: seconds[label(c)], reverse=True)


def paths(config: Config) -> tuple[Path, Path]:
    folder = testrun.results_dir(label(config))
    return folder / "pytest.log", folder / "junit.xml"


def run(
    configs: Sequence[Config], command_for: repro.Runner, jobs: int = 0, report: Callable[[str], None] = print
) -> list[repro.ConfigResult]:
    """Run ``configs`` ``jobs`` at a time (longest first); record each one's summary.json for the summary."""
    queue = order(configs, recorded_seconds())
    results = repro.run_matrix(queue, command_for, BUILD_DIR / "results", jobs, report=report, paths=paths)
    for r in results:
        junit = paths(r.config)[1]
        outcome = testrun.parse_junit(junit) if junit.exists() else None
        testrun.write_summary(
            label(r.config),
            r.returncode,
            outcome,
            vlen=r.config.vlen,
            qemu_cpu=r.config.variant.qemu_cpu(r.config.agnostic),
            wall_seconds=round(r.seconds, 1),
            log=str(r.log),
            variant_independent="run" if runs_variant_independent(r.config) else "deselected",
        )
    order_in = {c.label: i for i, c in enumerate(configs)}
    return sorted(results, key=lambda r: order_in[r.config.label])


def command_factory(qemu: Path, sysroot: Path, stage: Path, pytest_args: Sequence[str]) -> repro.Runner:
    """Each configuration's pytest under QEMU (a warm target when one matches), with its test selection."""

    def command_for(config: Config, junit: Path, out_dir: Path) -> tuple[list[str], dict[str, str]]:
        cmd, env = testrun.emulated_pytest(qemu, sysroot, stage, config.variant, pytest_args, junit, config.agnostic)
        env.update(selection_env(config))
        return route(cmd, env), env

    return command_for


def ok(result: repro.ConfigResult) -> bool:
    """Exit 0 and at least one test run: a configuration that collected nothing proves nothing."""
    junit = paths(result.config)[1]
    return result.ok and junit.exists() and testrun.parse_junit(junit).ok


def report_lines(
    results: Sequence[repro.ConfigResult], wall_seconds: float, jobs: int, max_failures: int = 30
) -> list[str]:
    """One line per configuration, then every failing test with its configuration and first message line."""
    lines = [
        f"emulated configurations: {len(results)}, {jobs} at a time, {wall_seconds:.0f} s wall "
        f"(their own wall times add up to {sum(r.seconds for r in results):.0f} s)"
    ]
    for r in results:
        junit = paths(r.config)[1]
        outcome = testrun.parse_junit(junit) if junit.exists() else None
        text = outcome.line() if outcome else f"no report (exit code {r.returncode})"
        lines.append(
            f"  {'ok  ' if ok(r) else 'FAIL'} {label(r.config):<24} {text}; wall {r.seconds:.0f} s; log {r.log}"
        )
    failures = [
        (label(r.config), test, cell.message)
        for r in results
        for test, cell in sorted(r.cases.items())
        if cell.status in ("failed", "error")
    ]
    if failures:
        lines.append(f"failing tests ({len(failures)}):")
        lines += [f"  {where}: {test}: {message}" for where, test, message in failures[:max_failures]]
        if len(failures) > max_failures:
            lines.append(f"  ... and {len(failures) - max_failures} more (JUnit XML in each results folder)")
    for r in results:
        if not ok(r) and not any(c.status in ("failed", "error") for c in r.cases.values()):
            tail = _tail(r.log)
            lines.append(
                f"  {label(r.config)}: exit {r.returncode} without a failing test (crash, or nothing "
                f"collected); last lines of {r.log}:"
            )
            lines += [f"    {line}" for line in tail]
    return lines


def _tail(log: Path, count: int = 8) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return ["(no log)"]


def default_jobs(beside: Sequence[Sequence[str]] = ()) -> int:
    """Configurations at once: one per core, and one more while sessions run beside them.

    With a pool of one per core, the last configuration to start runs alone at the end while the other
    core idles (a minute or more of `-t test` on 2 cores). One more keeps every core busy until the end;
    while the beside process still runs, the cores are shared among more processes, which costs no CPU.
    """
    return (os.cpu_count() or 1) + (1 if beside else 0)


def run_session(session: Session, posargs: Sequence[str]) -> None:
    """The test-emulated session: the configurations ``posargs`` choose under QEMU, several at once, with the
    sessions beside them; fail if any of them failed."""
    opts = parse_posargs(posargs)
    qemu_bin, root = toolchain.ensure()
    stage = toolchain.stage_for(session, root, sorted({c.variant for c in opts.configs}, key=lambda v: v.vlen))
    jobs = opts.jobs or default_jobs(opts.beside)
    log(
        f"running {len(opts.configs)} emulated configurations, {jobs} at a time; each one's log, JUnit XML and "
        f"summary in {BUILD_DIR / 'results'}/test-<configuration>/; variant-independent tests at VLEN "
        f"{vlens.variant_independent_lane()} only; {toolchain.active_line().describe()}"
    )
    log(repro.warm_report(opts.configs))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        besides = [
            stack.enter_context(sessions_beside(group, log_path=beside_log(number)))
            for number, group in enumerate(opts.beside, 1)
        ]
        results = run(opts.configs, command_factory(qemu_bin, root, stage, opts.pytest_args), jobs, log)
        print("\n".join(["", *report_lines(results, time.monotonic() - started, jobs)]), flush=True)
    failed = [label(r.config) for r in results if not ok(r)]
    failed += [name for beside in besides if beside.failed for name in beside.sessions]
    if failed:
        session.error(f"failed: {', '.join(failed)} (failing tests above)")
