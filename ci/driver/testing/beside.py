"""Sessions run as one more process beside test-emulated's configurations (``nox -s ...`` in the background)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import log


@dataclass
class Beside:
    """Sessions run as one more process beside test-emulated's configurations, and how that process ended."""

    sessions: tuple[str, ...]
    log_path: Path
    returncode: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.sessions) and self.returncode != 0


def beside_log(number: int = 1) -> Path:
    """The output of the ``number``-th process beside the pool (from 1): beside.log, beside-2.log, ..."""
    return BUILD_DIR / "results" / "test-emulated" / ("beside.log" if number == 1 else f"beside-{number}.log")


def nested_nox_command(sessions: Sequence[str], noxfile: Path = PROJECT_ROOT / "noxfile.py") -> list[str]:
    """This nox (the interpreter running the noxfile) on ``sessions``, in the order given."""
    return [sys.executable, "-m", "nox", "--noxfile", str(noxfile), "--sessions", *sessions]


@contextlib.contextmanager
def sessions_beside(
    sessions: Sequence[str],
    report: Callable[[str], None] = log,
    log_path: Path | None = None,
    command: Sequence[str] | None = None,
) -> Iterator[Beside]:
    """Run ``sessions`` (nox, or ``command``) in the background while the block runs; after it, wait for them,
    print their output and set ``returncode``. An exception in the block stops them."""
    log_path = log_path or beside_log()
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
