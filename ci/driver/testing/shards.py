"""One emulated configuration's suite split by test file over several QEMU processes.

A QEMU process keeps one core busy, so a single `nox -s test-vlenN` used to
leave the other core idle for the whole run. Here the suite's test files are
dealt to ``jobs`` pytest processes (each file whole, so module-scoped fixtures
and hypothesis' per-module state behave as in one process), heaviest first,
weighed by the seconds they took in the last run of the same configuration.
Each shard writes its own log and JUnit XML; the JUnit files are merged into
the configuration's junit.xml, so the summary and the `-t test` report read
one file as before.

Only a plain selection is split: files and folders, plus options that apply to
each shard alike (``-x``, ``-k expr``, ...). A node id (``file::test``) or a
single file runs in one process, as before.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..paths import PROJECT_ROOT

PERCENT = re.compile(r"\[\s*(\d+)%\]")


@dataclass(frozen=True)
class Selection:
    """Pytest arguments taken apart: the test files to deal out and the options every shard gets."""

    files: list[str]
    options: list[str]


def split_selection(pytest_args: Sequence[str], root: Path = PROJECT_ROOT) -> Selection | None:
    """The files named by ``pytest_args`` (folders expanded to their test_*.py), or None when they cannot split.

    An argument is a path when it names an existing file or folder under ``root``; every other argument (options
    and their values) is kept, in order, for each shard. A node id (``::``) keeps the run in one process.
    """
    files: list[str] = []
    options: list[str] = []
    for arg in pytest_args:
        if "::" in arg:
            return None
        path = root / arg
        if arg.startswith("-") or not path.exists():
            options.append(arg)
        elif path.is_dir():
            files += sorted(str(p.relative_to(root)) for p in path.rglob("test_*.py"))
        else:
            files.append(arg)
    unique = list(dict.fromkeys(files))
    return Selection(unique, options) if unique else None


def deal(files: Sequence[str], seconds: Mapping[str, float], shards: int) -> list[list[str]]:
    """``files`` in ``shards`` groups of about equal weight: heaviest first, each to the lightest group.

    A file without a recorded time weighs as much as the median of the recorded ones (1 when none is known),
    so a first run still spreads the files evenly. Empty groups are dropped; each group keeps the files'
    given order, so the run reads as the unsplit one did.
    """
    known = sorted(seconds[f] for f in files if f in seconds)
    default = known[len(known) // 2] if known else 1.0
    weight = {f: seconds.get(f, default) for f in files}
    groups: list[list[str]] = [[] for _ in range(max(1, min(shards, len(files))))]
    load = [0.0] * len(groups)
    for f in sorted(files, key=lambda f: (-weight[f], f)):
        lightest = min(range(len(groups)), key=lambda i: (load[i], i))
        groups[lightest].append(f)
        load[lightest] += weight[f]
    position = {f: i for i, f in enumerate(files)}
    return [sorted(g, key=position.__getitem__) for g in groups if g]


def merge_junit(parts: Sequence[Path], into: Path) -> None:
    """One <testsuites> with every part's <testsuite>s (a part that is missing or unreadable is left out).

    The per-suite counts, times and properties (the suite's deselected count) stay as each part wrote them;
    readers sum over the suites.
    """
    merged = ET.Element("testsuites")
    for part in parts:
        try:
            root = ET.parse(part).getroot()
        except (OSError, ET.ParseError):
            continue
        merged.extend([root] if root.tag == "testsuite" else list(root.iter("testsuite")))
    ET.ElementTree(merged).write(into, encoding="utf-8", xml_declaration=True)


@dataclass(frozen=True)
class ShardResult:
    index: int
    returncode: int
    seconds: float
    log: Path
    junit: Path
    files: list[str]


def summary_lines(log: Path, failures: bool) -> list[str]:
    """What pytest printed at the end of a shard: its short failure summary (if it failed) and final line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ["(no log)"]
    start = next((i for i, line in enumerate(lines) if "short test summary info" in line), None)
    if failures and start is not None:
        return lines[start:]
    tail = [line for line in lines if line.startswith("=") and (" in " in line or "no tests ran" in line)]
    return tail[-1:] or lines[-5:]


def run_shards(
    groups: Sequence[Sequence[str]],
    command_for: Callable[[list[str], Path], tuple[list[str], dict]],
    folder: Path,
    report: Callable[[str], None],
    progress_every: float = 30.0,
) -> list[ShardResult]:
    """Run one pytest process per group at once; ``command_for(files, junit)`` gives its command and environment.

    Each shard's output goes to ``folder``/pytest-shardN.log; a line reports each shard's finish, and while
    they run, every ``progress_every`` seconds, how many tests each has finished (from its log).
    """
    results: list[ShardResult | None] = [None] * len(groups)

    def one(index: int, files: list[str]) -> None:
        log_path = folder / f"pytest-shard{index + 1}.log"
        junit = folder / f"junit-shard{index + 1}.xml"
        junit.unlink(missing_ok=True)
        cmd, env = command_for(files, junit)
        start = time.monotonic()
        with log_path.open("w") as log:
            log.write("$ " + " ".join(cmd) + "\n\n")
            log.flush()
            code = subprocess.run(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT
            ).returncode
        seconds = time.monotonic() - start
        results[index] = ShardResult(index, code, seconds, log_path, junit, files)
        state = "ok" if code == 0 else f"FAILED (exit {code})"
        report(f"[shard {index + 1}/{len(groups)}] {state} in {seconds:.0f} s ({len(files)} files); log {log_path}")

    threads = [threading.Thread(target=one, args=(i, list(g)), daemon=True) for i, g in enumerate(groups)]
    for t in threads:
        t.start()
    started = time.monotonic()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=max(0.1, progress_every / len(threads)))
        if any(t.is_alive() for t in threads) and progress_every and time.monotonic() - started >= progress_every:
            started = time.monotonic()
            report(
                "running: "
                + ", ".join(
                    f"shard {i + 1} {progress(folder / f'pytest-shard{i + 1}.log')}"
                    for i in range(len(groups))
                    if results[i] is None
                )
            )
    return [r for r in results if r is not None]


def progress(log: Path) -> str:
    """How far a shard is, from the last ``[ NN%]`` pytest wrote to its log."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "starting"
    found = PERCENT.findall(text)
    return f"{int(found[-1])}%" if found else "importing torch and collecting"


def take_jobs(posargs: Sequence[str], default: int) -> tuple[int, list[str]]:
    """A leading ``--jobs=N`` (processes to split the suite over) taken off the pytest arguments."""
    from ..errors import ConfigError

    args = list(posargs)
    if args and args[0].startswith("--jobs="):
        value = args.pop(0).partition("=")[2]
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"--jobs={value}: give a number of QEMU processes, 1 or more")
        return int(value), args
    return default, args
