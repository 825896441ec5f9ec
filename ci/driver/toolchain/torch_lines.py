"""The torch lines (toolchains/torch_lines.json): which Debian riscv64 torch the library is built and tested against.

The first line of the table is every session's default; ``RVV_ATTN_TORCH_LINE``
(a line's torch major.minor, e.g. ``2.14``) selects another for a whole nox
run. Nothing else names a suite or a torch version: the sysroot, the host's
torch, the test tools' pins and the release wheel's libraries come from here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..paths import LINE_ENV, TOOLCHAINS_DIR

TABLE_FILE = TOOLCHAINS_DIR / "torch_lines.json"


@dataclass(frozen=True)
class TorchLine:
    torch: str  # major.minor
    suite: str
    python: str
    rolling: bool
    packages: tuple[str, ...]
    lock: str
    host_torch: str
    compilers: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        """``torch2.14``: in session names, build folders and messages."""
        return f"torch{self.torch}"

    @property
    def lock_file(self) -> Path:
        return TOOLCHAINS_DIR / self.lock

    def describe(self) -> str:
        return f"torch {self.torch} (Debian {self.suite}, Python {self.python})"


def lines(table: Path = TABLE_FILE) -> list[TorchLine]:
    data = json.loads(table.read_text())
    return [
        TorchLine(
            torch=row["torch"],
            suite=row["suite"],
            python=row["python"],
            rolling=bool(row.get("rolling", False)),
            packages=tuple(row["packages"]),
            lock=row["lock"],
            host_torch=row["host_torch"],
            compilers=tuple(sorted(row["compilers"].items())),
        )
        for row in data["lines"]
    ]


def default_line(table: Path = TABLE_FILE) -> TorchLine:
    return lines(table)[0]


def find(torch: str, table: Path = TABLE_FILE) -> TorchLine:
    """The line of torch major.minor ``torch`` (``2.14``, or ``torch2.14``); ConfigError naming the choices."""
    known = lines(table)
    wanted = torch.removeprefix("torch")
    for line in known:
        if line.torch == wanted:
            return line
    raise ConfigError(
        f"no torch line {torch!r} in {table.name}",
        f"choose one of {', '.join(line.torch for line in known)} (e.g. {LINE_ENV}={known[-1].torch})",
    )


def active_line(environ: Mapping[str, str] | None = None, table: Path = TABLE_FILE) -> TorchLine:
    """The line this run builds and tests: ``RVV_ATTN_TORCH_LINE``, else the table's first."""
    env = os.environ if environ is None else environ
    chosen = env.get(LINE_ENV, "").strip()
    return find(chosen, table) if chosen else default_line(table)


def other_lines(table: Path = TABLE_FILE) -> list[TorchLine]:
    """Every line but the default: each gets sessions of its own (test-torch2.14, ...)."""
    return lines(table)[1:]
