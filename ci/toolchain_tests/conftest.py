"""Integration tests of the real toolchain: they need the pinned QEMU, the sysroot and a cross build.

`nox -s test-toolchain` prepares all three and passes their paths in; run
directly without them, the tests fail with that instruction (they do not skip).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _path_from_env(name: str) -> Path:
    value = os.environ.get(name)
    if not value or not Path(value).exists():
        pytest.fail(f"{name} is not set to an existing path: run these tests through `nox -s test-toolchain`")
    return Path(value)


@pytest.fixture(scope="session")
def qemu() -> Path:
    return _path_from_env("RVV_ATTN_QEMU")


@pytest.fixture(scope="session")
def sysroot() -> Path:
    return _path_from_env("RVV_ATTN_SYSROOT")


@pytest.fixture(scope="session")
def cross_build_dir() -> Path:
    return _path_from_env("RVV_ATTN_CROSS_BUILD")


@pytest.fixture(scope="session")
def wheel() -> Path:
    return _path_from_env("RVV_ATTN_WHEEL")
