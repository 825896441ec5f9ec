"""What the driver's steps use of a nox session, and how its errors become the session's error.

A step gets the session (anything with ``run``, ``install`` and ``bin``, as
``nox.Session`` has) and raises DriverError on failure; the noxfile turns
that into the session's error. The unit tests pass a recorder instead of a
session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from .errors import DriverError


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
