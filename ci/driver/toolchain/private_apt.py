"""A private apt configuration for fetching packages of another Debian release.

It never touches the host's /etc/apt: sources, lists, status and cache all live
in a folder of the rvv-attn cache, passed to apt-get with ``-o`` options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..proc import run

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class PrivateApt:
    root: Path
    archive: str
    suite: str = "trixie"
    arch: str = "amd64"
    # "deb" for binary packages, "deb-src" for source packages (`apt-get source`).
    kind: str = "deb"

    def sources_line(self) -> str:
        return f"{self.kind} [arch={self.arch} signed-by={KEYRING}] {self.archive} {self.suite} main"

    def options(self) -> list[str]:
        r = self.root
        opts = {
            "Dir::Etc::SourceList": r / "sources.list",
            "Dir::Etc::SourceParts": "/dev/null",
            "Dir::Etc::Preferences": r / "preferences",
            "Dir::Etc::PreferencesParts": "/dev/null",
            "Dir::State::Lists": r / "lists",
            "Dir::State::Status": r / "status",
            "Dir::Cache": r / "cache",
            "APT::Architecture": self.arch,
            "APT::Architectures": self.arch,
            "Debug::NoLocking": "true",
        }
        if os.geteuid() != 0:
            opts["APT::Sandbox::User"] = os.environ.get("USER", "nobody")
        args: list[str] = []
        for key, value in opts.items():
            args += ["-o", f"{key}={value}"]
        return args

    def prepare(self) -> None:
        for sub in ("lists/partial", "cache/archives/partial"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        (self.root / "preferences").touch()
        (self.root / "sources.list").write_text(self.sources_line() + "\n")

    def update(self) -> None:
        self.prepare()
        run(
            ["apt-get", *self.options(), "update"],
            hint=f"check that {self.archive} serves {self.suite} and is reachable",
        )

    def download(self, package: str, version: str, dest: Path) -> Path:
        """Download ``package=version`` into ``dest``; return the .deb path."""
        dest.mkdir(parents=True, exist_ok=True)
        run(["apt-get", *self.options(), "download", f"{package}={version}"], cwd=dest)
        debs = sorted(dest.glob(f"{package}_*.deb"))
        if not debs:
            raise FileNotFoundError(f"apt-get download left no {package}_*.deb in {dest}")
        return debs[-1]

    def download_source(self, package: str, version: str, dest: Path) -> Path:
        """Download the source package ``package=version`` (.dsc and tarballs) into ``dest``; return the .dsc."""
        dest.mkdir(parents=True, exist_ok=True)
        run(
            ["apt-get", *self.options(), "source", "--download-only", f"{package}={version}"],
            cwd=dest,
            hint=f"the archive needs a deb-src index for {self.suite} that still carries {package} {version}",
        )
        upstream = version.split(":", 1)[-1]
        dsc = dest / f"{package}_{upstream}.dsc"
        if not dsc.exists():
            raise FileNotFoundError(f"apt-get source left no {dsc.name} in {dest}")
        return dsc

    def candidate_version(self, package: str) -> str:
        return apt_candidate(run(["apt-cache", *self.options(), "policy", package])) or "(none)"


def apt_candidate(policy_output: str) -> str | None:
    """The version ``apt-cache policy <package>`` would install, or None."""
    for line in policy_output.splitlines():
        name, _, value = line.strip().partition(":")
        if name == "Candidate":
            return None if value.strip() in ("", "(none)") else value.strip()
    return None
