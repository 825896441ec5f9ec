"""One error hierarchy: every failure says what failed, why, and what to do next."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


class DriverError(Exception):
    """Base class of every error the driver raises on purpose.

    ``hint`` is the next step for the user; the nox sessions print it under
    the message instead of a traceback.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  -> {self.hint}"
        return self.message


class MissingPrerequisite(DriverError):
    """A host tool is missing and cannot be installed automatically."""


class ConfigError(DriverError):
    """A setting (environment variable, session option, lock file) is wrong or absent."""


class IntegrityError(DriverError):
    """A downloaded or cached artefact does not match its pin."""


class CommandFailed(DriverError):
    """A subprocess exited non-zero; carries the command, exit code and output tail."""

    def __init__(self, cmd: Sequence[str], returncode: int, output: str = "", hint: str | None = None) -> None:
        tail = "\n".join(output.strip().splitlines()[-25:])
        message = f"command failed with exit code {returncode}: {shlex.join(cmd)}"
        if tail:
            message += "\n--- last lines of its output ---\n" + tail
        super().__init__(message, hint)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.output = output
