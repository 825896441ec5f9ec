"""Which Debian archive to fetch trixie packages from.

The project names no archive host.  Order: the ``RVV_ATTN_DEBIAN_ARCHIVE``
environment variable (or a session option that sets it), then the Debian
archive the host's own apt sources use.  On Ubuntu or a GitHub runner there is
no Debian archive in the apt sources, so the variable is required there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError

ARCHIVE_ENV = "RVV_ATTN_DEBIAN_ARCHIVE"
DEBIAN_SUITES = {"buster", "bullseye", "bookworm", "trixie", "forky", "sid", "unstable", "testing", "stable"}


def _suite_base(suite: str) -> str:
    return re.split(r"[-/]", suite, maxsplit=1)[0]


def _is_debian_archive(uri: str, suites: Iterable[str]) -> bool:
    """True for the main Debian archive (not security, not a third-party repo)."""
    if not uri.startswith(("http://", "https://")):
        return False
    path = uri.rstrip("/").split("://", 1)[1]
    if "security" in path or not path.endswith("/debian"):
        return False
    return any(_suite_base(s) in DEBIAN_SUITES for s in suites)


def parse_one_line_sources(text: str) -> list[str]:
    uris = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = re.sub(r"\[[^\]]*\]", " ", line).split()
        if len(words) >= 3 and _is_debian_archive(words[1], [words[2]]):
            uris.append(words[1].rstrip("/"))
    return uris


def parse_deb822_sources(text: str) -> list[str]:
    uris = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.lstrip().startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
            continue
        suites = fields.get("suites", "").split()
        for uri in fields.get("uris", "").split():
            if _is_debian_archive(uri, suites):
                uris.append(uri.rstrip("/"))
    return uris


def host_archives(etc_apt: Path = Path("/etc/apt")) -> list[str]:
    found: list[str] = []
    files = [etc_apt / "sources.list"]
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        files += sorted(parts.iterdir())
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.name.endswith(".sources"):
            found += parse_deb822_sources(text)
        elif f.name.endswith(".list"):
            found += parse_one_line_sources(text)
    return list(dict.fromkeys(found))


def debian_archive(environ: dict[str, str] | None = None, etc_apt: Path = Path("/etc/apt")) -> str:
    env = os.environ if environ is None else environ
    if env.get(ARCHIVE_ENV):
        uri = env[ARCHIVE_ENV].strip().rstrip("/")
        if not uri.startswith(("http://", "https://", "file:/")):
            raise ConfigError(f"{ARCHIVE_ENV}={uri!r} is not an http(s) or file: URL of a Debian archive")
        return uri
    found = host_archives(etc_apt)
    if found:
        return found[0]
    raise ConfigError(
        "no Debian archive to fetch the riscv64 sysroot and the pinned QEMU from: "
        f"the host's apt sources name none, and {ARCHIVE_ENV} is not set",
        f"set {ARCHIVE_ENV} to the URL of a Debian archive mirror (the directory holding dists/trixie), "
        f"e.g. `export {ARCHIVE_ENV}=https://<mirror>/debian`",
    )
