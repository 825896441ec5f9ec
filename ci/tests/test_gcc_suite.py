"""test-gcc: its options, what the compiler in a root is shown, and the CMake arguments of a GCC build."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.testing import gcc_suite
from driver.toolchain import build, cross_gcc, vlens

ALL_VLENS = tuple(v.vlen for v in vlens.variants())


def test_defaults_are_gcc_14_at_vlen_256_and_the_whole_suite():
    assert gcc_suite.parse_posargs([]) == gcc_suite.Options((14,), (256,), ())


def test_options_choose_compilers_and_vlens_and_pass_the_rest_to_pytest():
    options = gcc_suite.parse_posargs(["--gcc=14,16", "--vlens=all", "-x", "tests/test_decode_attention.py"])
    assert options == gcc_suite.Options((14, 16), ALL_VLENS, ("-x", "tests/test_decode_attention.py"))
    assert gcc_suite.parse_posargs(["--vlens=128,1024"]).vlens == (128, 1024)


@pytest.mark.parametrize(
    ("bad", "named"), [("--gcc=13", "--gcc=13"), ("--gcc=", "--gcc="), ("--vlens=64", "--vlens=64")]
)
def test_unknown_compilers_or_vlens_are_refused_by_name(bad, named):
    with pytest.raises(ConfigError, match=named):
        gcc_suite.parse_posargs([bad])


def test_the_build_tree_and_the_sysroot_are_shown_to_the_compiler(tmp_path):
    project, sysroot = tmp_path / "checkout", tmp_path / "sysroot"
    assert gcc_suite.shared_folders(sysroot, project, project / "build") == [project, sysroot]
    outside = tmp_path / "elsewhere" / "build"
    assert gcc_suite.shared_folders(sysroot, project, outside) == [project, sysroot, outside]


def test_a_host_compiler_is_used_as_it_is(monkeypatch, tmp_path):
    monkeypatch.setattr(cross_gcc.shutil, "which", lambda name: f"/usr/bin/{name}")
    script = tmp_path / "g++"
    assert cross_gcc.compiler_script(cross_gcc.CrossGcc(14), script, [tmp_path]) == Path(
        "/usr/bin/riscv64-linux-gnu-g++-14"
    )
    assert not script.exists()


def test_a_missing_host_compiler_says_which_package_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(cross_gcc.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError) as raised:
        cross_gcc.compiler_script(cross_gcc.CrossGcc(16), tmp_path / "g++", [tmp_path])
    assert "g++-16-riscv64-linux-gnu" in raised.value.hint


def test_a_compiler_in_a_root_runs_in_a_private_mount_namespace_as_the_user(tmp_path):
    root, checkout, sysroot = tmp_path / "root", tmp_path / "my checkout", tmp_path / "sysroot"
    script = cross_gcc.compiler_script(cross_gcc.CrossGcc(14, root), tmp_path / "bin" / "g++", [checkout, sysroot])
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n")
    argv = shlex.split(text.splitlines()[-1])
    assert argv[:5] == ["exec", "unshare", "--mount", "--propagation", "private"]
    assert argv[-2:] == [str(root), "$@"]
    inner = argv[argv.index("-c") + 1]
    # Both folders, the one with a space quoted, bound at their own paths; the compiler as the calling user.
    assert f"for folder in {shlex.quote(str(checkout))} {shlex.quote(str(sysroot))};" in inner
    assert 'mount --bind "$folder" "$root$folder"' in inner
    assert f"chroot --userspec={os.getuid()}:{os.getgid()}" in inner
    assert inner.endswith('env -C "$PWD" TMPDIR=/tmp riscv64-linux-gnu-g++-14 "$@"')


def test_the_privilege_prefix_comes_first(tmp_path):
    script = cross_gcc.compiler_script(
        cross_gcc.CrossGcc(16, tmp_path / "root"), tmp_path / "g++", [tmp_path], prefix=["sudo", "-n"]
    )
    assert shlex.split(script.read_text().splitlines()[-1])[:3] == ["exec", "sudo", "-n"]


def test_the_script_passes_arguments_through_unchanged(tmp_path):
    # The script's own quoting, checked by running its shell line with `echo` standing in for unshare.
    script = cross_gcc.compiler_script(cross_gcc.CrossGcc(14, tmp_path / "root"), tmp_path / "g++", [tmp_path])
    probe = tmp_path / "probe"
    probe.write_text(script.read_text().replace("exec unshare", "exec printf '%s\\n' unshare", 1))
    out = subprocess.run(["sh", str(probe), "-DX=a b", "-c", "x.cpp"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-4:] == [str(tmp_path / "root"), "-DX=a b", "-c", "x.cpp"]


def test_a_gcc_build_uses_the_gcc_toolchain_file_and_names_its_compiler(tmp_path):
    args = build.cross_wheel_args(
        tmp_path / "sysroot",
        tmp_path / "wheels",
        [vlens.by_vlen(256)],
        build_dir=tmp_path / "tree",
        toolchain_file=build.GCC_TOOLCHAIN_FILE,
        defines=["RVV_ATTN_CROSS_GXX=/x/g++"],
    )
    assert f"cmake.toolchain-file={build.GCC_TOOLCHAIN_FILE}" in args
    assert args[args.index("cmake.define.RVV_ATTN_CROSS_GXX=/x/g++") - 1] == "-C"
    assert "cmake.define.RVV_ATTN_VLENS=256" in args and args[-1] == str(build.PROJECT_ROOT)
    assert build.GCC_TOOLCHAIN_FILE.exists()
    # The clang build keeps its own file and adds nothing.
    clang = build.cross_wheel_args(tmp_path / "sysroot", tmp_path / "wheels", [vlens.by_vlen(256)])
    assert f"cmake.toolchain-file={build.TOOLCHAIN_FILE}" in clang
    assert not any("RVV_ATTN_CROSS_GXX" in a for a in clang)
