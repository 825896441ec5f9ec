"""Running the pytest suite (under QEMU, or in the session's venv) and reporting the result as data."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import log, quote
from ..session import Session
from ..toolchain.build import recorded_variants
from ..toolchain.guest_commands import guest_command, guest_env
from ..toolchain.vlens import Variant, portable_lane
from ..warm.targets import route
from . import shards


@dataclass(frozen=True)
class Outcome:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    deselected: int = 0  # as the suite's conftest records it (host_only under emulation, -k, ...)

    @property
    def collected(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    @property
    def ok(self) -> bool:
        # A configuration that collected nothing proves nothing: a wrong path or
        # an over-eager deselection must not look green.
        return self.failed == 0 and self.errors == 0 and self.collected > 0

    def line(self) -> str:
        if not self.collected:
            return f"no tests collected ({self.deselected} deselected)"
        parts = [f"{self.passed} passed", f"{self.failed} failed"]
        if self.errors:
            parts.append(f"{self.errors} errors")
        if self.skipped:
            parts.append(f"{self.skipped} skipped")
        if self.deselected:
            parts.append(f"{self.deselected} deselected")
        return ", ".join(parts) + f" in {self.seconds:.0f} s"


def parse_junit(path: Path) -> Outcome:
    """Counts from pytest's JUnit XML (one <testsuite>, possibly under <testsuites>)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = errors = skipped = deselected = 0
    seconds = 0.0
    for s in suites:
        total += int(s.get("tests", 0))
        failed += int(s.get("failures", 0))
        errors += int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
        seconds += float(s.get("time", 0.0))
        for prop in s.iter("property"):
            if prop.get("name") == "deselected":
                deselected += int(prop.get("value", 0))
    return Outcome(total - failed - errors - skipped, failed, errors, skipped, seconds, deselected)


def results_dir(name: str) -> Path:
    d = BUILD_DIR / "results" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def pytest_in_session(session: Session, label: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
    """pytest in the session's venv; the outcome is recorded for the summary session."""
    junit = results_dir(label) / "junit.xml"
    junit.unlink(missing_ok=True)
    try:
        session.run("python", "-m", "pytest", f"--junitxml={junit}", *args, env=env)
    finally:
        outcome = parse_junit(junit) if junit.exists() else None
        code = 0 if outcome and outcome.ok else 1
        write_summary(label, code, outcome)
        print_summary(label, code, outcome)


def emulated_pytest(
    qemu: Path,
    sysroot: Path,
    stage: Path,
    variant: Variant,
    pytest_args: Sequence[str],
    junit: Path,
    agnostic_ones: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """Command and environment for pytest with the sysroot's python3 under qemu-riscv64.

    The tests are told which variant must be active (RVV_ATTN_EXPECT_VARIANT),
    so a build that silently fell back to portable fails instead of passing,
    and whether the kernel tests also run the portable build (only in the
    portable lane: see ``vlens.portable_lane``).
    """
    argv = ["python3", "-m", "pytest", f"--junitxml={junit}", "-o", "junit_family=xunit2", *pytest_args]
    cmd = guest_command(qemu, sysroot, variant, argv, agnostic_ones)
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    compiled = recorded_variants(stage)
    env = guest_env(
        stage,
        tmp,
        extra={
            # What the staged library holds, when the session knows: a one-VLEN build has only portable + that VLEN.
            **({"RVV_ATTN_EXPECT_COMPILED": compiled} if compiled else {}),
            "RVV_ATTN_EXPECT_VARIANT": variant.name,
            "RVV_ATTN_EXPECT_VLEN": str(variant.vlen),
            "RVV_ATTN_TEST_PORTABLE": "1" if variant.vlen == portable_lane() and not agnostic_ones else "0",
            "RVV_ATTN_QEMU_CPU": variant.qemu_cpu(agnostic_ones),
            # For tests that start a second emulated process at another VLEN.
            "RVV_ATTN_QEMU": str(qemu),
            "RVV_ATTN_SYSROOT": str(sysroot),
        },
    )
    return cmd, env


def run_emulated_pytest(
    qemu: Path,
    sysroot: Path,
    stage: Path,
    variant: Variant,
    pytest_args: Sequence[str],
    agnostic_ones: bool = False,
    label: str | None = None,
    jobs: int = 1,
) -> tuple[int, Outcome | None]:
    """Run the suite at ``variant``'s VLEN; record the outcome.

    With ``jobs`` > 1 and a selection of several test files, the files are split over ``jobs`` QEMU processes
    (``shards``), each with its own log; their pytest summaries are printed when they end. Otherwise one
    process writes to the terminal.
    """
    label = label or f"test-{variant.name}"
    folder = results_dir(label)
    junit = folder / "junit.xml"
    previous = seconds_per_file(junit)
    junit.unlink(missing_ok=True)
    cmd, env = emulated_pytest(qemu, sysroot, stage, variant, pytest_args, junit, agnostic_ones)
    selection = shards.split_selection(pytest_args) if jobs > 1 else None
    routed = route(cmd, env, report=log)
    if routed == cmd:
        log(
            f"running the suite under QEMU ({variant.qemu_cpu(agnostic_ones)}); importing torch alone takes ~20 s "
            f"(a warm target skips that: nox -s warm -- --vlens={variant.vlen})"
        )
    start = time.monotonic()
    if selection is not None and len(selection.files) > 1 and routed == cmd:
        groups = shards.deal(selection.files, previous, jobs)
        log(
            f"{len(selection.files)} test files in {len(groups)} QEMU processes at once (split by their last "
            f"times); logs in {folder}/pytest-shard*.log"
        )

        def shard_command(files: list[str], shard_junit: Path) -> tuple[list[str], dict[str, str]]:
            return emulated_pytest(
                qemu, sysroot, stage, variant, [*selection.options, *files], shard_junit, agnostic_ones
            )

        for stale in folder.glob("junit-shard*.xml"):
            stale.unlink()
        ran = shards.run_shards(groups, shard_command, folder, log)
        shards.merge_junit([r.junit for r in ran], junit)
        for r in ran:
            print(f"--- shard {r.index + 1}/{len(ran)} ({', '.join(Path(f).stem for f in r.files)}):", flush=True)
            print("\n".join(shards.summary_lines(r.log, failures=r.returncode != 0)), flush=True)
        # pytest's codes: 0 all passed, 1 some failed, 2+ interrupted or an internal error: the worst one.
        returncode = max(r.returncode for r in ran)
    else:
        log(quote(routed))
        returncode = subprocess.run(routed, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL).returncode
    outcome = parse_junit(junit) if junit.exists() else None
    write_summary(
        label,
        returncode,
        outcome,
        vlen=variant.vlen,
        qemu_cpu=variant.qemu_cpu(agnostic_ones),
        wall_seconds=round(time.monotonic() - start, 1),
    )
    return returncode, outcome


def write_summary(label: str, returncode: int, outcome: Outcome | None, **details: object) -> None:
    summary = {
        "label": label,
        "returncode": returncode,
        "finished": time.time(),
        "outcome": outcome.__dict__ if outcome else None,
        **details,
    }
    (results_dir(label) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def summary_table(since: float) -> list[str]:
    """One line per configuration whose results were written after ``since``, with its slowest test files."""
    rows = []
    results = BUILD_DIR / "results"
    found = [(p.parent, json.loads(p.read_text())) for p in results.glob("*/summary.json")]
    for folder, data in sorted(found, key=lambda d: d[1].get("finished", 0)):  # in the order they ran
        if data.get("finished", 0) < since:
            continue
        outcome = Outcome(**data["outcome"]) if data.get("outcome") else None
        status = "ok  " if data["returncode"] == 0 and outcome is not None and outcome.ok else "FAIL"
        text = outcome.line() if outcome else f"no report (exit code {data['returncode']})"
        if data.get("wall_seconds"):
            text += f" (wall {data['wall_seconds']:.0f} s)"
        where = f"  [{data['qemu_cpu']}]" if data.get("qemu_cpu") else ""
        rows.append(f"{status} {data['label']:<24} {text}{where}")
        slow = slowest_files(folder / "junit.xml")
        if slow:
            rows.append(
                f"     {'':<24} slowest files: " + ", ".join(f"{name} {short_seconds(secs)}" for name, secs in slow)
            )
    return rows


def case_file(classname: str) -> str:
    """The file of a JUnit test case from its classname (``tests.test_kv_write`` -> ``tests/test_kv_write.py``)."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py"
    return "/".join(parts) + ".py" if classname else "?"


def seconds_per_file(junit: Path) -> dict[str, float]:
    """Seconds per test file in a JUnit report (the sum of its cases); empty when there is no readable report."""
    if not junit.exists():
        return {}
    try:
        root = ET.parse(junit).getroot()
    except ET.ParseError:
        return {}
    per_file: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        per_file[case_file(case.get("classname", ""))] += float(case.get("time", 0.0))
    return dict(per_file)


def slowest_files(junit: Path, count: int = 3) -> list[tuple[str, float]]:
    """The ``count`` test files that took longest (sum of their test cases' times), slowest first."""
    return sorted(seconds_per_file(junit).items(), key=lambda kv: (-kv[1], kv[0]))[:count]


SESSIONS_DIR = "_sessions"


@contextlib.contextmanager
def session_clock(name: str) -> Iterator[None]:
    """Record a nox session's wall time and whether it succeeded, for the summary session."""
    started = time.time()
    ok = False
    try:
        yield
        ok = True
    finally:
        folder = BUILD_DIR / "results" / SESSIONS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(
            json.dumps({"name": name, "started": started, "seconds": round(time.time() - started, 1), "ok": ok}) + "\n"
        )


def short_seconds(value: float) -> str:
    """``42.4`` -> ``42 s``, ``0.35`` -> ``0.3 s``: short times keep a decimal."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def duration(seconds: float) -> str:
    """``75`` -> ``1 min 15 s``; under a minute, ``42 s``."""
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def session_table(since: float, now: float | None = None) -> list[str]:
    """Each session this invocation ran (started after ``since``), its wall time and status, then the total."""
    folder = BUILD_DIR / "results" / SESSIONS_DIR
    found = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.exists() else []
    found = sorted((d for d in found if d.get("started", 0) >= since), key=lambda d: d["started"])
    rows = [f"{'ok  ' if d['ok'] else 'FAIL'} {d['name']:<24} {duration(d['seconds']):>12}" for d in found]
    if found:
        now = time.time() if now is None else now
        rows.append(f"{'':<4} {'total (wall)':<24} {duration(now - since):>12}")
    return rows


def print_summary(label: str, returncode: int, outcome: Outcome | None) -> None:
    if outcome is None:
        print(f"{label}: pytest produced no report (exit code {returncode})", file=sys.stderr)
    else:
        print(f"{label}: {outcome.line()}", file=sys.stderr)


def summary_lines(started: float) -> list[str]:
    """The summary session's report: the wall time of each session and each configuration's result since
    ``started``."""
    return [
        "",
        "rvv-attn test summary:",
        "sessions, in the order they ran (wall time):",
        *(session_table(started) or ["(no timed session ran in this invocation)"]),
        "configurations:",
        *(summary_table(started) or ["(no test session ran in this invocation)"]),
    ]
