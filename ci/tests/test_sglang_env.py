"""The SGLang environment's driver: its table, wheel handling, cache key, session options and the stand-ins."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import shutil
import zipfile
from pathlib import Path

import pytest

from driver.errors import ConfigError, IntegrityError
from driver.paths import PROJECT_ROOT
from driver.sglang import environment, session
from driver.toolchain import torch_lines


@pytest.fixture(scope="module")
def table() -> environment.Table:
    return environment.load()


def test_table_pins_sglang_to_a_torch_line_and_a_vlen(table):
    assert table.sglang.name == "sglang" and table.sglang.filename.startswith(f"sglang-{table.sglang.version}-")
    assert len(table.sglang.sha256) == 64
    assert torch_lines.find(table.torch).python  # the line exists
    from driver.toolchain.vlens import by_vlen

    assert by_vlen(table.vlen).vlen == table.vlen
    assert table.debian == tuple(sorted(table.debian)), "keep the Debian list sorted"
    assert all("==" in requirement for requirement in table.host), "the host's packages are pinned"
    for pin in table.wheels:
        assert pin.filename.endswith("-py3-none-any.whl"), f"{pin.filename}: only pure-Python wheels go in the target"


def _stand_ins_named_in(source: Path) -> set[str]:
    """The STAND_INS tuple of a module, read without importing it (the stand-ins' package imports torch)."""
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "STAND_INS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{source} has no STAND_INS")


def test_stand_ins_match_their_tree_router_and_start_up_hook(table):
    environment.check_stand_ins(table)
    listed = {s.module for s in table.stand_ins}
    assert _stand_ins_named_in(environment.STANDINS_DIR / "__init__.py") == listed
    assert _stand_ins_named_in(PROJECT_ROOT / "python" / "_rvv_attn_sglang_startup.py") == listed


def test_stand_in_disagreement_is_an_error(table, tmp_path):
    tree = tmp_path / "standins"
    shutil.copytree(environment.STANDINS_DIR, tree)
    (tree / "cuda").mkdir()
    (tree / "cuda" / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match="not in the table: cuda"):
        environment.check_stand_ins(table, tree)


def test_the_target_sysroot_adds_sglang_packages_to_its_line(table):
    line = torch_lines.find(table.torch)
    manifest = environment.sysroot_manifest(table, line)
    assert set(line.packages) | set(table.debian) == set(manifest.packages)
    assert manifest.key() != environment.sysroot_mod.Manifest.for_line(line).key()
    assert manifest.lock_file == table.lock_file != line.lock_file
    other = next(candidate for candidate in torch_lines.lines() if candidate.torch != table.torch)
    with pytest.raises(ConfigError, match="RVV_ATTN_TORCH_LINE"):
        environment.sysroot_manifest(table, other)


def test_same_torch_in_both_locks(tmp_path):
    a, b = tmp_path / "a.lock", tmp_path / "b.lock"
    a.write_text("python3-torch 2.14.1+dfsg-1\n")
    b.write_text("python3-torch 2.14.1+dfsg-1\npython3-zmq 27\n")
    environment.same_torch(a, b)
    b.write_text("python3-torch 2.14.1+dfsg-2\n")
    with pytest.raises(IntegrityError, match="archive moved"):
        environment.same_torch(a, b)


def test_download_command_asks_for_exactly_the_pinned_wheel():
    pin = environment.WheelPin("sglang", "0.5.23", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "0" * 64)
    cmd = environment.download_command("python", pin, Path("/d"))
    assert cmd[-1] == "sglang==0.5.23" and "--no-deps" in cmd
    assert cmd[cmd.index("--platform") + 1] == "manylinux_2_34_x86_64"
    assert cmd[cmd.index("--python-version") + 1] == "311" and cmd[cmd.index("--abi") + 1] == "cp311"
    pure = environment.WheelPin("einops", "0.8.1", "einops-0.8.1-py3-none-any.whl", "0" * 64)
    assert "--platform" not in environment.download_command("python", pure, Path("/d"))


def test_a_wheel_whose_hash_differs_is_refused(tmp_path):
    (tmp_path / "x-1-py3-none-any.whl").write_bytes(b"not the pinned bytes")
    pin = environment.WheelPin("x", "1", "x-1-py3-none-any.whl", "0" * 64)
    with pytest.raises(IntegrityError, match="pins"):
        environment.fetch_wheel(pin, "python", tmp_path)


def _wheel(path: Path) -> Path:
    members = {
        "pkg/__init__.py": "",
        "pkg/fast.cpython-311-x86_64-linux-gnu.so": "ELF",
        "pkg/sub/mod.py": "X = 1\n",
        "pkg-1.dist-info/METADATA": "Name: pkg\nVersion: 1\n",
        "pkg-1.dist-info/entry_points.txt": "[console_scripts]\npkg = pkg:main\n",
    }
    record = "".join(f"{name},sha256=x,1\n" for name in members) + "pkg-1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
        archive.writestr("pkg-1.dist-info/RECORD", record)
    return path


def test_unpack_keeps_python_files_and_metadata_without_the_native_ones(tmp_path):
    site = tmp_path / "site"
    kept = environment.unpack_python_files(_wheel(tmp_path / "pkg-1-py3-none-any.whl"), site, ["*.so"])
    assert "pkg/fast.cpython-311-x86_64-linux-gnu.so" not in kept
    assert (site / "pkg/sub/mod.py").exists() and not list(site.rglob("*.so"))
    record = (site / "pkg-1.dist-info/RECORD").read_text()
    assert ".so" not in record and "pkg/sub/mod.py" in record and "pkg-1.dist-info/INSTALLER,," in record
    assert (site / "pkg-1.dist-info/INSTALLER").read_text().strip() == environment.INSTALLER
    dist = importlib.metadata.Distribution.at(site / "pkg-1.dist-info")
    assert dist.version == "1" and [ep.name for ep in dist.entry_points] == ["pkg"]


def test_site_key_follows_the_pins_and_the_sysroot(table):
    key = environment.site_key(table, "sysroot-a")
    assert key == environment.site_key(table, "sysroot-a")
    assert key != environment.site_key(table, "sysroot-b")
    repinned = dataclasses.replace(table, sglang=dataclasses.replace(table.sglang, sha256="0" * 64))
    assert key != environment.site_key(repinned, "sysroot-a")


def test_compile_units_split_the_big_package(tmp_path):
    for name in ("big/a/x.py", "big/b/y.py", "big/top.py", "small/z.py", "big-1.dist-info/METADATA"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    units = {u.relative_to(tmp_path).as_posix() for u in environment.compile_units(tmp_path)}
    assert units == {"big/a", "big/b", "small"}


def test_pth_puts_the_site_on_the_path(tmp_path):
    assert environment.pth_text(tmp_path).splitlines() == [str(tmp_path)]


def test_session_options():
    assert session.parse_posargs([]) == (("host", "target"), ["-m", "sglang and not sglang_server", "tests"])
    assert session.parse_posargs(["--only=target", "-x", "tests/a.py"]) == (("target",), ["-x", "tests/a.py"])
    with pytest.raises(ConfigError, match="choose from"):
        session.parse_posargs(["--only=board"])
