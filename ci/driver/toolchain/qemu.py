"""The pinned qemu-riscv64: Debian trixie's static qemu-user, verified and cached."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommandFailed, IntegrityError
from ..paths import TOOLCHAINS_DIR, cache_lock, cache_root
from ..proc import Stopwatch, log, run
from . import archive
from .private_apt import PrivateApt

PIN_FILE = TOOLCHAINS_DIR / "qemu.lock.json"


@dataclass(frozen=True)
class QemuPin:
    package: str
    suite: str
    version: str
    member: str  # path of the binary inside the .deb
    sha256: str

    @classmethod
    def load(cls, path: Path = PIN_FILE) -> QemuPin:
        data = json.loads(path.read_text())
        return cls(data["package"], data["suite"], data["version"], data["member"], data["sha256"])

    @property
    def cache_dir(self) -> Path:
        # The version contains ':' (epoch); keep directory names portable.
        return cache_root() / "qemu" / self.version.replace(":", "_")

    @property
    def binary(self) -> Path:
        return self.cache_dir / "qemu-riscv64"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _private_apt(pin: QemuPin) -> PrivateApt:
    return PrivateApt(cache_root() / "apt-amd64", archive.debian_archive(), suite=pin.suite, arch="amd64")


def _extract(deb: Path, member: str, dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        run(["dpkg-deb", "-x", deb, tmp])
        shutil.copy2(Path(tmp) / member, dest)


def ensure_qemu(pin: QemuPin | None = None) -> Path:
    """Return the path of the pinned qemu-riscv64, downloading it on first use."""
    pin = pin or QemuPin.load()
    with cache_lock("qemu"):
        return _ensure(pin)


def _ensure(pin: QemuPin) -> Path:
    if pin.binary.exists():
        if sha256_of(pin.binary) == pin.sha256:
            return pin.binary
        log(f"cached {pin.binary} does not match the pin; fetching it again")
        pin.binary.unlink()
    pin.cache_dir.mkdir(parents=True, exist_ok=True)
    apt = _private_apt(pin)
    with Stopwatch(f"fetching pinned {pin.package} {pin.version} ({pin.suite}, amd64)"):
        apt.update()
        try:
            deb = apt.download(pin.package, pin.version, pin.cache_dir / "deb")
        except CommandFailed as err:
            found = apt.candidate_version(pin.package)
            raise IntegrityError(
                f"the archive no longer serves the pinned {pin.package} {pin.version} (it has {found})",
                f"point {archive.ARCHIVE_ENV} at an archive that keeps {pin.version}, "
                f"or re-pin with `nox -s pin-qemu` and commit {PIN_FILE.name}",
            ) from err
        partial = pin.binary.with_suffix(".partial")
        _extract(deb, pin.member, partial)
        got = sha256_of(partial)
        if got != pin.sha256:
            partial.unlink()
            raise IntegrityError(
                f"{pin.member} from {deb.name} has sha256 {got}, the pin in {PIN_FILE.name} says {pin.sha256}",
                "the download is not what was pinned; do not use it. Re-pin only if you trust the new package.",
            )
        partial.chmod(0o755)
        partial.rename(pin.binary)
        shutil.rmtree(pin.cache_dir / "deb", ignore_errors=True)
    log(f"qemu-riscv64: {qemu_version(pin.binary)}")
    return pin.binary


def qemu_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "unknown"


def repin(suite: str = "trixie", package: str = "qemu-user", member: str = "usr/bin/qemu-riscv64") -> QemuPin:
    """Fetch the archive's current qemu-user and write its version and checksum as the new pin."""
    probe = QemuPin(package, suite, "", member, "")
    apt = _private_apt(probe)
    apt.update()
    version = apt.candidate_version(package)
    workdir = cache_root() / "qemu" / "repin"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    deb = apt.download(package, version, workdir)
    binary = workdir / "qemu-riscv64"
    _extract(deb, member, binary)
    pin = QemuPin(package, suite, version, member, sha256_of(binary))
    PIN_FILE.write_text(json.dumps(pin.__dict__, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    return pin
