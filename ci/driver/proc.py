"""Running subprocesses: quiet by default, output kept for the error message."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import CommandFailed


def log(message: str) -> None:
    print(f"[rvv-attn] {message}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stream: bool = False,
    hint: str | None = None,
) -> str:
    """Run ``cmd``; return its combined output or raise CommandFailed.

    With ``stream`` the output goes to the terminal as it comes (long steps
    show progress), and the last lines are still kept for the error.
    """
    argv = [str(c) for c in cmd]
    proc = subprocess.Popen(
        argv,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if len(lines) > 400:
            del lines[:200]
        if stream:
            sys.stderr.write(line)
            sys.stderr.flush()
    returncode = proc.wait()
    output = "".join(lines)
    if returncode != 0:
        raise CommandFailed(argv, returncode, output, hint)
    return output


class Stopwatch:
    """Logs a step's start and how long it took."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> Stopwatch:
        self.start = time.monotonic()
        log(f"{self.what} ...")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            log(f"{self.what}: done in {time.monotonic() - self.start:.1f} s")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def quote(cmd: Sequence[str | Path]) -> str:
    return shlex.join(str(c) for c in cmd)
