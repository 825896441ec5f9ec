"""The release artefacts: wheel names and tags, auditwheel's arguments, the sdist sync, the checks, the versions."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from driver.errors import DriverError
from driver.release import artefacts as release

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_name_parsing_and_manylinux_glibc():
    name = release.WheelName.parse("rvv_attn-0.2.dev3-py3-none-manylinux_2_39_riscv64.whl")
    assert (name.distribution, name.version, name.python, name.abi) == ("rvv_attn", "0.2.dev3", "py3", "none")
    assert name.manylinux_glibc == (2, 39)
    both = release.WheelName.parse("x-1.0-1-py3-none-manylinux_2_39_riscv64.manylinux_2_31_riscv64.whl")
    assert both.version == "1.0" and both.manylinux_glibc == (2, 31)
    assert release.WheelName.parse("x-1.0-py3-none-linux_riscv64.whl").manylinux_glibc is None
    with pytest.raises(ValueError, match="not a wheel file name"):
        release.WheelName.parse("x-1.0.tar.gz")


def test_auditwheel_picks_the_oldest_policy_and_excludes_only_torch():
    args = release.auditwheel_repair_args(Path("raw/x.whl"), Path("dist"))
    assert args[:5] == ["repair", "--plat", "auto", "--wheel-dir", "dist"]
    excluded = [args[i + 1] for i, a in enumerate(args) if a == "--exclude"]
    assert excluded == ["libtorch*.so*", "libc10*.so*", "libshm*.so*"]
    assert args[-1] == "raw/x.whl"


def _sdist(path: Path, files: dict[str, bytes], version: str = "1.0") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"rvv_attn-{version}/{name}")
            info.size, info.mtime = len(data), 1_000_000  # sdists carry one fixed time stamp
            tar.addfile(info, io.BytesIO(data))
    return path


def test_sync_sdist_rewrites_only_changed_files_and_drops_removed_ones(tmp_path):
    dest = tmp_path / "src"
    top = release.sync_sdist(_sdist(tmp_path / "a.tar.gz", {"a.cpp": b"1", "b.cpp": b"2", "d/c.h": b"3"}), dest)
    assert top == dest / "rvv_attn" and (top / "d/c.h").read_bytes() == b"3"
    for f in ("a.cpp", "b.cpp"):
        os.utime(top / f, (100, 100))
    # The next commit's sdist has another version: same folder, so the build there stays incremental.
    again = release.sync_sdist(_sdist(tmp_path / "b.tar.gz", {"a.cpp": b"1", "b.cpp": b"changed"}, "1.1"), dest)
    assert again == top and sorted(p.name for p in dest.iterdir()) == ["rvv_attn"]
    assert (top / "a.cpp").stat().st_mtime == 100  # unchanged: ninja keeps its object
    assert (top / "b.cpp").read_bytes() == b"changed" and (top / "b.cpp").stat().st_mtime > 100
    assert not (top / "d").exists()


def test_sync_sdist_refuses_paths_outside_the_tree(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("rvv_attn-1.0/../../evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(DriverError, match="unsafe path"):
        release.sync_sdist(bad, tmp_path / "src")
    assert not (tmp_path / "evil").exists()


@pytest.fixture(scope="module")
def shared_libraries(tmp_path_factory) -> tuple[bytes, bytes]:
    """A real shared library with debug info, and the same stripped by llvm-strip-19 (what the build uses)."""
    d = tmp_path_factory.mktemp("elf")
    (d / "f.c").write_text("int f(int x) { return x + 1; }\n")
    subprocess.run(["clang-19", "-g", "-shared", "-fPIC", "-o", d / "lib.so", d / "f.c"], check=True)
    shutil.copy(d / "lib.so", d / "stripped.so")
    subprocess.run(["llvm-strip-19", "--strip-all", d / "stripped.so"], check=True)
    return (d / "lib.so").read_bytes(), (d / "stripped.so").read_bytes()


def test_section_names_match_llvm_readelf(shared_libraries, tmp_path):
    (tmp_path / "lib.so").write_bytes(shared_libraries[0])
    out = subprocess.run(
        ["llvm-readelf-19", "-S", "-W", tmp_path / "lib.so"], capture_output=True, text=True, check=True
    ).stdout
    listed = [
        line.split("]", 1)[1].split()[0]
        for line in out.splitlines()
        if line.strip().startswith("[") and "]" in line and not line.strip().startswith("[Nr]")
    ]
    assert release.section_names(shared_libraries[0])[1:] == listed[1:]
    with pytest.raises(DriverError, match="not a little-endian 64-bit ELF"):
        release.section_names(b"#!/bin/sh\n")


def test_unstripped_sections_are_found(shared_libraries):
    unstripped, stripped = shared_libraries
    assert ".symtab" in release.unstripped_sections(unstripped)
    assert ".debug_info" in release.unstripped_sections(unstripped)
    assert release.unstripped_sections(stripped) == []


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


LINE_LIBRARIES = ("rvv_attn/torch-2.6.0/librvv_attn_ops.so", "rvv_attn/torch-2.14.1/librvv_attn_ops.so")


def _good_files(library: bytes) -> dict[str, bytes]:
    return {
        "rvv_attn/__init__.py": b"",
        "rvv_attn/_version.py": b"",
        "_rvv_attn_sglang_startup.py": b"",
        "_rvv_attn_sglang_startup.pth": b"import _rvv_attn_sglang_startup\n",
        **dict.fromkeys(LINE_LIBRARIES, library),
    }


def test_release_wheel_check_accepts_a_good_wheel(tmp_path, shared_libraries):
    wheel = _wheel(tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl", _good_files(shared_libraries[1]))
    assert release.check_release_wheel(wheel, "1.0").manylinux_glibc == (2, 39)


@pytest.mark.parametrize(
    "name, extra, library, expected",
    [
        ("rvv_attn-1.0-py3-none-linux_riscv64.whl", {}, 1, "not tagged py3-none-manylinux"),
        (
            "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl",
            {"rvv_attn.libs/libgomp-1234.so.1": b""},
            1,
            "holds libraries other than its operator libraries",
        ),
        ("rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl", {}, 0, "is not stripped"),
        ("rvv_attn-1.1-py3-none-manylinux_2_39_riscv64.whl", {}, 1, "has version 1.1, but the sdist has 1.0"),
    ],
)
def test_release_wheel_check_says_what_is_wrong(tmp_path, shared_libraries, name, extra, library, expected):
    wheel = _wheel(tmp_path / name, {**_good_files(shared_libraries[library]), **extra})
    with pytest.raises(DriverError, match=expected):
        release.check_release_wheel(wheel, "1.0")


@pytest.mark.parametrize("member", ["rvv_attn/_version.py", "_rvv_attn_sglang_startup.pth"])
def test_release_wheel_check_wants_the_generated_and_root_files(tmp_path, shared_libraries, member):
    files = _good_files(shared_libraries[1])
    del files[member]
    wheel = _wheel(tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl", files)
    with pytest.raises(DriverError, match=f"lacks {member}"):
        release.check_release_wheel(wheel)


def test_release_wheel_check_wants_one_library_per_torch_line(tmp_path, shared_libraries):
    files = _good_files(shared_libraries[1])
    del files[LINE_LIBRARIES[1]]
    wheel = _wheel(tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl", files)
    with pytest.raises(
        DriverError, match=r"has operator libraries for torch 2.6, not one for each torch line \(2.14, 2.6\)"
    ):
        release.check_release_wheel(wheel)
    files[LINE_LIBRARIES[0].replace("torch-2.6.0", "torch-2.6.1")] = shared_libraries[1]  # two for one line
    with pytest.raises(DriverError, match="has operator libraries for torch 2.6, 2.6, not one for each"):
        release.check_release_wheel(_wheel(tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl", files))


def _line_wheel(path: Path, library: str, version: str = "1.0", extra: bytes = b"") -> Path:
    info = f"rvv_attn-{version}.dist-info"
    path.parent.mkdir(parents=True, exist_ok=True)
    return _wheel(
        path,
        {
            "rvv_attn/__init__.py": b"# package" + extra,
            library: library.encode(),
            f"{info}/METADATA": f"Version: {version}".encode(),
            f"{info}/RECORD": b"stale",
        },
    )


def test_line_wheels_merge_into_one_with_a_fresh_record(tmp_path):
    first = _line_wheel(tmp_path / "a" / "rvv_attn-1.0-py3-none-linux_riscv64.whl", LINE_LIBRARIES[0])
    second = _line_wheel(tmp_path / "b" / "rvv_attn-1.0-py3-none-linux_riscv64.whl", LINE_LIBRARIES[1])
    merged = release.merge_line_wheels([first, second], tmp_path / "out")
    assert merged.name == first.name and merged.parent == tmp_path / "out"
    with zipfile.ZipFile(merged) as zf:
        names = set(zf.namelist())
        record = zf.read("rvv_attn-1.0.dist-info/RECORD").decode().splitlines()
        assert zf.read(LINE_LIBRARIES[1]) == LINE_LIBRARIES[1].encode()
    assert set(LINE_LIBRARIES) <= names
    rows = {row.split(",")[0]: row for row in record}
    assert set(rows) == names
    assert rows["rvv_attn-1.0.dist-info/RECORD"] == "rvv_attn-1.0.dist-info/RECORD,,"
    data = b"# package"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert rows["rvv_attn/__init__.py"] == f"rvv_attn/__init__.py,sha256={digest},{len(data)}"


def test_line_wheels_from_different_sources_are_not_merged(tmp_path):
    first = _line_wheel(tmp_path / "a" / "rvv_attn-1.0-py3-none-linux_riscv64.whl", LINE_LIBRARIES[0])
    edited = _line_wheel(tmp_path / "b" / "rvv_attn-1.0-py3-none-linux_riscv64.whl", LINE_LIBRARIES[1], extra=b"!")
    with pytest.raises(DriverError, match="differ in rvv_attn/__init__.py"):
        release.merge_line_wheels([first, edited], tmp_path / "out")
    same_line = _line_wheel(tmp_path / "c" / "rvv_attn-1.0-py3-none-linux_riscv64.whl", LINE_LIBRARIES[0])
    with pytest.raises(DriverError, match="two wheels hold a library built against torch 2.6.0"):
        release.merge_line_wheels([first, same_line], tmp_path / "out")


def test_tag_must_match_the_version():
    release.check_tag("v0.2.0", "0.2.0")
    with pytest.raises(DriverError, match="tag v0.2.0 does not match the artefacts' version 0.2.1.dev1"):
        release.check_tag("v0.2.0", "0.2.1.dev1")
    assert release.parse_tag_option(["--tag=v1.0.0"]) == "v1.0.0"
    with pytest.raises(DriverError, match="expected --tag=vX.Y.Z"):
        release.parse_tag_option([])


def test_dist_must_hold_exactly_one_release(tmp_path):
    with pytest.raises(DriverError, match="expected one manylinux riscv64 wheel .* found nothing"):
        release.release_wheel(tmp_path)
    (tmp_path / "rvv_attn-1.0.tar.gz").write_bytes(b"")
    (tmp_path / "rvv_attn-0.9.tar.gz").write_bytes(b"")
    with pytest.raises(DriverError, match="found rvv_attn-0.9.tar.gz, rvv_attn-1.0.tar.gz"):
        release.release_sdist(tmp_path)
    release.clear_artifacts(tmp_path)
    assert list(tmp_path.iterdir()) == []


def _git(repo: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def test_version_scheme_gives_the_tag_on_a_tag_and_dev_n_between_tags(tmp_path):
    """The project's own [tool.setuptools_scm] settings, applied to a throw-away repository."""
    import setuptools_scm  # a build requirement, installed in every session that builds
    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools_scm"]
    assert settings["local_scheme"] == "no-local-version"
    _git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    _git(tmp_path, "add", "f")
    _git(tmp_path, "commit", "-q", "-m", "one")
    _git(tmp_path, "tag", "v0.2.0")
    assert setuptools_scm.get_version(root=str(tmp_path), **settings) == "0.2.0"
    for n in (1, 2):
        (tmp_path / "f").write_text(str(n + 1))
        _git(tmp_path, "commit", "-q", "-am", f"more {n}")
    # No "+g<hash>" local part: PyPI refuses those.
    assert setuptools_scm.get_version(root=str(tmp_path), **settings) == "0.2.1.dev2"
