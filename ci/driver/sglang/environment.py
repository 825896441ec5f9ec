"""SGLang's released Python package, installed beside rvv-attn: on the host, and in the emulated riscv64 target.

Everything comes from one table, toolchains/sglang.json. In the target:

- the line's sysroot packages plus the table's Debian packages make a sysroot
  of their own (the same build as the line's test sysroot, another key and
  lock), so the default sysroot stays as it is;
- SGLang's x86-64 wheel (the only one its release has), checked against its
  SHA-256, gives its Python files; the compiled files (``native``) are left
  out. They go, with the pinned pure-Python wheels, into one site folder,
  byte-compiled once under QEMU and cached under the key of all of those pins;
- a venv of that sysroot's python3 (system site packages) sees the site folder
  through a ``.pth`` file; rvv-attn's wheel is pip-installed into it, so its
  entry points are in its distribution metadata, and its own start-up hook
  serves SGLang the stand-ins (python/rvv_attn/sglang_plugin/standins/), as
  it does on a board.

On the host, the same SGLang wheel is pip-installed without dependencies
into the session's venv, beside the table's ``host`` pins and the line's host
torch.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, IntegrityError
from ..paths import PROJECT_ROOT, TOOLCHAINS_DIR, cache_lock, cache_root
from ..proc import Stopwatch, log, run
from ..toolchain import sysroot as sysroot_mod
from ..toolchain.guest_commands import guest_command
from ..toolchain.qemu import sha256_of
from ..toolchain.torch_lines import TorchLine

TABLE_FILE = TOOLCHAINS_DIR / "sglang.json"
# The stand-ins ship in rvv-attn's wheel; the table lists them with their reasons.
STANDINS_DIR = PROJECT_ROOT / "python" / "rvv_attn" / "sglang_plugin" / "standins"
# Bump when the layout of the prepared site folder changes, so caches are rebuilt.
RECIPE_VERSION = 2
MARKER = ".rvv-attn-sglang-site.json"
PTH_NAME = "rvv_attn_sglang.pth"
INSTALLER = "rvv-attn-driver"


@dataclass(frozen=True)
class WheelPin:
    """One wheel by exact file name and SHA-256 (the name carries version and tags)."""

    name: str  # the distribution, e.g. "sglang"
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def tags(self) -> tuple[str, str, str]:
        """(python, abi, platform) from the file name; a compressed tag set keeps its first entry."""
        python, abi, platform = self.filename.removesuffix(".whl").split("-")[-3:]
        return python.split(".")[0], abi.split(".")[0], platform.split(".")[0]


@dataclass(frozen=True)
class StandIn:
    module: str
    reason: str


@dataclass(frozen=True)
class Table:
    sglang: WheelPin
    native: tuple[str, ...]
    torch: str
    vlen: int
    debian: tuple[str, ...]
    lock: str
    wheels: tuple[WheelPin, ...]
    host: tuple[str, ...]
    stand_ins: tuple[StandIn, ...]

    @property
    def lock_file(self) -> Path:
        return TOOLCHAINS_DIR / self.lock


def load(table: Path = TABLE_FILE) -> Table:
    data = json.loads(table.read_text())
    pin = data["sglang"]
    return Table(
        sglang=WheelPin("sglang", pin["version"], pin["wheel"], pin["sha256"]),
        native=tuple(pin["native"]),
        torch=data["torch"],
        vlen=int(data["vlen"]),
        debian=tuple(data["debian"]),
        lock=data["lock"],
        wheels=tuple(WheelPin(w["name"], w["version"], w["wheel"], w["sha256"]) for w in data["wheels"]),
        host=tuple(data["host"]),
        stand_ins=tuple(StandIn(s["module"], s["reason"]) for s in data["stand_ins"]),
    )


def check_stand_ins(table: Table, tree: Path = STANDINS_DIR) -> None:
    """The table and the tree name the same stand-ins, each with a reason; ConfigError otherwise."""
    in_tree = {p.name for p in tree.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    listed = {s.module for s in table.stand_ins}
    problems = []
    if in_tree - listed:
        problems.append(f"in {tree.name}/ but not in the table: {', '.join(sorted(in_tree - listed))}")
    if listed - in_tree:
        problems.append(f"in the table but not in {tree.name}/: {', '.join(sorted(listed - in_tree))}")
    problems += [f"{s.module} has no reason" for s in table.stand_ins if not s.reason.strip()]
    if problems:
        raise ConfigError(f"stand-ins of {TABLE_FILE.name} and {tree.name}/ disagree: " + "; ".join(problems))


def sysroot_manifest(table: Table, line: TorchLine) -> sysroot_mod.Manifest:
    """The target's sysroot: the line's packages and SGLang's Debian packages, with a lock of its own."""
    if line.torch != table.torch:
        raise ConfigError(
            f"SGLang {table.sglang.version} runs on the torch {table.torch} line, not on {line.describe()}",
            f"RVV_ATTN_TORCH_LINE={table.torch}, or change 'torch' in {TABLE_FILE.name}",
        )
    packages = tuple(dict.fromkeys((*line.packages, *table.debian)))
    return sysroot_mod.Manifest(line.suite, sysroot_mod.ARCH, packages, line.torch, line.rolling, table.lock_file)


def same_torch(line_lock: Path, sglang_lock: Path) -> None:
    """The wheel is built against the line's sysroot and runs in SGLang's: both must hold the same torch."""
    versions = [sysroot_mod.parse_lock(p.read_text()).get("python3-torch") for p in (line_lock, sglang_lock)]
    if versions[0] != versions[1]:
        raise IntegrityError(
            f"the line's sysroot has python3-torch {versions[0]}, SGLang's sysroot {versions[1]} "
            f"({line_lock.name}, {sglang_lock.name}): the archive moved between their builds",
            "rebuild both from the same archive state (delete them under the cache's sysroot/ folder)",
        )


# ---- wheels: fetched once, checked on every use ----


def download_command(python: str, pin: WheelPin, dest: Path) -> list[str]:
    """pip download of exactly this wheel, whatever the host is (platform tags from its file name)."""
    py, abi, platform = pin.tags()
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    if platform != "any":
        cmd += ["--platform", platform, "--implementation", py[:2], "--python-version", py[2:], "--abi", abi]
    return [*cmd, pin.requirement]


def fetch_wheel(pin: WheelPin, python: str, downloads: Path | None = None) -> Path:
    """The pinned wheel from the download cache, fetched first if missing; IntegrityError if its hash differs."""
    downloads = downloads or cache_root() / "downloads"
    path = downloads / pin.filename
    if not path.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        with Stopwatch(f"downloading {pin.filename}"):
            run(download_command(python, pin, downloads), hint="pip needs the package index for this download")
        if not path.exists():
            raise IntegrityError(
                f"pip download of {pin.requirement} did not give {pin.filename}",
                f"the index serves another file for {pin.requirement}; re-pin it in {TABLE_FILE.name}",
            )
    got = sha256_of(path)
    if got != pin.sha256:
        raise IntegrityError(
            f"{path} has SHA-256 {got}, {TABLE_FILE.name} pins {pin.sha256}",
            "delete the file to fetch it again, or re-pin (docs/sglang-environment.md)",
        )
    return path


# ---- the target's site folder ----


def python_members(names: Iterable[str], native: Sequence[str]) -> list[str]:
    """A wheel's members without the compiled ones (``native`` patterns) and without its RECORD."""
    kept = []
    for name in names:
        if name.endswith("/") or name.endswith(".dist-info/RECORD"):
            continue
        if any(fnmatch.fnmatch(name.rsplit("/", 1)[-1], pattern) for pattern in native):
            continue
        kept.append(name)
    return kept


def record_without(record: str, kept: Iterable[str], dist_info: str) -> str:
    """The wheel's RECORD with only the files installed (and no hash for RECORD itself)."""
    wanted = set(kept)
    lines = [line for line in record.splitlines() if line and line.split(",", 1)[0] in wanted]
    lines.append(f"{dist_info}/RECORD,,")
    lines.append(f"{dist_info}/INSTALLER,,")
    return "\n".join(lines) + "\n"


def unpack_python_files(wheel: Path, site: Path, native: Sequence[str] = ()) -> list[str]:
    """Install ``wheel``'s files but the ``native`` ones into ``site``, as an installer would; returns them."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        kept = python_members(names, native)
        for name in kept:
            archive.extract(name, site)
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise IntegrityError(f"{wheel.name} has {len(records)} RECORD files, expected one")
        dist_info = records[0].rsplit("/", 1)[0]
        record = archive.read(records[0]).decode()
    (site / dist_info / "RECORD").write_text(record_without(record, kept, dist_info))
    (site / dist_info / "INSTALLER").write_text(INSTALLER + "\n")
    return kept


def site_key(table: Table, sysroot_key: str) -> str:
    """Everything that goes into the site folder: the pins and the sysroot it is compiled for."""
    canonical = json.dumps(
        {
            "sglang": [table.sglang.filename, table.sglang.sha256, list(table.native)],
            "wheels": [[w.filename, w.sha256] for w in table.wheels],
            "sysroot": sysroot_key,
            "recipe": RECIPE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def site_path(manifest: sysroot_mod.Manifest, key: str) -> Path:
    return cache_root() / "sglang-site" / f"{manifest.suite}-{key}"


def compile_units(site: Path) -> list[Path]:
    """The folders to byte-compile, one QEMU process each: SGLang's sub-packages (most of the work) and the rest."""
    units = []
    for top in sorted(p for p in site.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")):
        subs = [p for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"]
        units += subs if len(subs) > 1 else [top]
    return sysroot_mod.largest_first(units)


def byte_compile(site: Path, qemu: Path, root: Path, jobs: int | None = None) -> None:
    """.pyc files for the target's Python, written under QEMU through host paths (see sysroot.byte_compile)."""
    units = compile_units(site)
    # The modules directly in each top-level package, which no unit covers.
    top_files = [str(p) for p in sorted(site.glob("*/*.py")) if p.parent not in units]
    if top_files:
        run(guest_command(qemu, root, None, ["python3", "-m", "py_compile", *top_files]), env=sysroot_mod.GUEST_ENV)
    sysroot_mod.compile_trees(units, qemu, root, site, jobs)


def ensure_site(table: Table, manifest: sysroot_mod.Manifest, root: Path, qemu: Path, python: str) -> Path:
    """The target's site folder (SGLang's Python files, the pinned wheels, the stand-ins), built once per key."""
    check_stand_ins(table)
    key = site_key(table, manifest.key())
    site_dir = site_path(manifest, key)
    with cache_lock("sglang-site"):
        if sysroot_mod.is_complete(site_dir, key, MARKER):
            log(f"SGLang {table.sglang.version} site folder (cached): {site_dir}")
            return site_dir
        wheels = [fetch_wheel(table.sglang, python), *(fetch_wheel(w, python) for w in table.wheels)]
        partial = site_dir.with_name(site_dir.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        with Stopwatch(f"installing SGLang {table.sglang.version}'s Python files and {len(wheels) - 1} wheel(s)"):
            unpack_python_files(wheels[0], partial, table.native)
            for wheel in wheels[1:]:
                unpack_python_files(wheel, partial)
        with Stopwatch("byte-compiling them under QEMU (a few minutes)"):
            byte_compile(partial, qemu, root)
        (partial / MARKER).write_text(
            json.dumps({"key": key, "sglang": table.sglang.filename, "seconds": round(time.monotonic() - started)})
        )
        shutil.rmtree(site_dir, ignore_errors=True)
        partial.rename(site_dir)
    return site_dir


def pth_text(site_dir: Path) -> str:
    """The venv's .pth: the site folder on sys.path (the stand-ins come with rvv-attn's wheel)."""
    return f"{site_dir}\n"


def venv_site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise ConfigError(f"expected one lib/python3.*/site-packages in {venv}, found {len(found)}")
    return found[0]


def host_requirements(table: Table) -> list[str]:
    """The host venv's packages besides torch and the test tools."""
    return list(table.host)
