"""Host prerequisites: install what is missing with the distro's package manager."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingPrerequisite
from ..paths import cache_lock
from ..proc import Stopwatch, log, quote, run

# Package -> a file whose presence shows it is installed (works without dpkg too).
HOST_PACKAGES: dict[str, str] = {
    "clang-19": "/usr/bin/clang++-19",
    "lld-19": "/usr/bin/ld.lld-19",
    "mmdebstrap": "/usr/bin/mmdebstrap",
    "debian-archive-keyring": "/usr/share/keyrings/debian-archive-keyring.gpg",
}
# Only for `nox -s repro -- --gdb`.
DEBUGGER_PACKAGES: dict[str, str] = {"gdb-multiarch": "/usr/bin/gdb-multiarch"}
# Only for `nox -s sanitize`: clang's sanitizer runtimes.
SANITIZER_PACKAGES: dict[str, str] = {
    "libclang-rt-19-dev": "/usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.asan-x86_64.so",
}
SUPPORTED = "Debian 12 (bookworm), Debian 13 (trixie) or Ubuntu 24.04"


@dataclass(frozen=True)
class OsRelease:
    id: str
    version_id: str
    codename: str

    @property
    def is_debian_family(self) -> bool:
        return self.id in {"debian", "ubuntu"}


def parse_os_release(text: str) -> OsRelease:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"')
    return OsRelease(fields.get("ID", ""), fields.get("VERSION_ID", ""), fields.get("VERSION_CODENAME", ""))


def read_os_release(path: Path = Path("/etc/os-release")) -> OsRelease:
    try:
        return parse_os_release(path.read_text())
    except OSError:
        return OsRelease("", "", "")


def missing_packages(packages: dict[str, str] = HOST_PACKAGES) -> list[str]:
    return [pkg for pkg, marker in packages.items() if not Path(marker).exists()]


def privilege_prefix(euid: int | None = None, sudo: str | None = None) -> list[str] | None:
    """``[]`` as root, ``["sudo", "-n"]`` where passwordless sudo works, else None."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return []
    sudo = shutil.which("sudo") if sudo is None else sudo
    if sudo and subprocess.run([sudo, "-n", "true"], capture_output=True).returncode == 0:
        return [sudo, "-n"]
    return None


def install_command(prefix: list[str], packages: list[str]) -> list[list[str]]:
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    return [
        prefix + env + ["apt-get", "update", "-q"],
        # With recommends: mmdebstrap's (arch-test, uidmap) are what it was tested with.
        prefix + env + ["apt-get", "install", "-y", "-q", *packages],
    ]


def ensure_host_packages(packages: dict[str, str] = HOST_PACKAGES) -> None:
    """Install clang-19, lld-19, mmdebstrap and the Debian keyring (or ``packages``) if absent.

    Sessions that run side by side (test-emulated's processes beside the pool) may each need packages on a
    fresh machine; apt-get refuses to start while another holds its lock, so they take turns, and each looks
    again once it has its turn.
    """
    if not missing_packages(packages):
        return
    with cache_lock("apt"):
        _install_missing(packages)


def _install_missing(packages: dict[str, str]) -> None:
    missing = missing_packages(packages)
    if not missing:
        return
    osr = read_os_release()
    by_hand = f"sudo apt-get update && sudo apt-get install -y {' '.join(missing)}"
    if not osr.is_debian_family or not shutil.which("apt-get"):
        raise MissingPrerequisite(
            f"missing host packages: {', '.join(missing)}; this host ({osr.id or 'unknown'}) has no apt-get",
            f"use {SUPPORTED}, or install the equivalents of: {' '.join(missing)}",
        )
    prefix = privilege_prefix()
    if prefix is None:
        raise MissingPrerequisite(
            f"missing host packages: {', '.join(missing)}, and this user is neither root nor has passwordless sudo",
            f"install them once by hand: {by_hand}",
        )
    with Stopwatch(f"installing host packages {' '.join(missing)}"):
        for cmd in install_command(prefix, missing):
            log(quote(cmd))
            run(cmd, stream=True, hint=f"on {SUPPORTED} this should work; otherwise install by hand: {by_hand}")
    still = missing_packages(packages)
    if still:
        raise MissingPrerequisite(
            f"apt-get finished but these are still missing: {', '.join(still)}",
            f"on Debian 12 clang-19 comes from bookworm's own archive; check your apt sources, then: {by_hand}",
        )
