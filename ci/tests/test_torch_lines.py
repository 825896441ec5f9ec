"""A second torch line: its nested runs, the native sdist build's steps, binfmt_misc's registration line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.release import native_build
from driver.testing import matrix, torch_line_runs
from driver.toolchain import binfmt, board_root, sysroot, torch_lines, vlens

FORKY = torch_lines.find("2.14")
TRIXIE = torch_lines.default_line()


def test_a_lines_quick_share_is_vlen256_with_the_install_check_in_its_own_nox():
    cmd, env = torch_line_runs.line_run(FORKY, True, ["-x"], environ={"HOME": "/h"})
    assert env == {"HOME": "/h", "RVV_ATTN_TORCH_LINE": "2.14"}
    sessions = cmd[cmd.index("--sessions") + 1 : cmd.index("--")]
    assert sessions == ["test-emulated", "summary"]
    after = cmd[cmd.index("--") + 1 :]
    assert after == [
        f"--configs=vlen{vlens.variant_independent_lane()}",
        "--beside=install-test-quick",
        "-x",
    ]
    full, _ = torch_line_runs.line_run(FORKY, False, [])
    configs, beside = full[full.index("--") + 1 :]
    assert beside == "--beside=test-host,test-toolchain,sanitize,install-test-quick"
    # The whole run has every agnostic lane CI runs, also those `nox -t test` leaves out.
    every = [f"vlen{v.vlen}" for v in vlens.variants()] + [f"vlen{v}-agnostic" for v in vlens.agnostic_lane()]
    assert configs.removeprefix("--configs=").split(",") == every
    assert set(vlens.agnostic_lane()) > set(vlens.agnostic_lane_in_test_tag())
    assert matrix.parse_posargs([configs]).configs != matrix.configurations()
    # SGLang's share runs in a second process beside its line's quick run.
    with_sglang, _ = torch_line_runs.line_run(FORKY, True, [], also_beside=["test-sglang-quick"])
    assert with_sglang[with_sglang.index("--") + 2 :] == [
        "--beside=install-test-quick",
        "--beside=test-sglang-quick",
    ]


def test_the_binfmt_line_matches_riscv64_elf_and_fixes_the_interpreter():
    line = binfmt.registration(Path("/q/qemu-riscv64"))
    name, kind, offset, magic, mask, interpreter, flags = line.strip(":").split(":")
    assert (name, kind, offset, interpreter, flags) == ("qemu-riscv64", "M", "", "/q/qemu-riscv64", "F")
    magic_bytes = bytes.fromhex(magic.replace("\\x", ""))
    mask_bytes = bytes.fromhex(mask.replace("\\x", ""))
    assert magic_bytes[18:20] == (0xF3).to_bytes(2, "little")  # EM_RISCV
    assert len(magic_bytes) == len(mask_bytes) == 20
    # A shared object (e_type 3) matches as well as an executable (2); an x86-64 binary does not.
    for e_type, e_machine, matches in ((2, 0xF3, True), (3, 0xF3, True), (2, 0x3E, False)):
        header = bytearray(magic_bytes)
        header[16:18] = e_type.to_bytes(2, "little")
        header[18:20] = e_machine.to_bytes(2, "little")
        assert all((h & m) == (g & m) for h, g, m in zip(header, magic_bytes, mask_bytes)) == matches
    assert binfmt.interpreter_of("enabled\ninterpreter /usr/bin/qemu-riscv64-static\nflags: F\n") == (
        "/usr/bin/qemu-riscv64-static"
    )


def test_each_line_builds_natively_with_its_gcc_and_clang():
    assert [(c.kind, c.cc, c.cxx) for c in board_root.compilers(TRIXIE)] == [
        ("clang", "clang-19", "clang++-19"),
        ("gcc", "gcc-14", "g++-14"),
    ]
    assert [(c.kind, c.cxx) for c in board_root.compilers(FORKY)] == [("clang", "clang++-21"), ("gcc", "g++-16")]
    packages = board_root.packages(FORKY)
    assert {"g++-16", "clang-21", "cmake", "python3-scikit-build-core", "python3-torch"} <= set(packages)
    cmd = board_root.mmdebstrap_command(FORKY, "http://m/debian", Path("/r"))
    assert "--variant=minbase" in cmd and "--aptopt=Acquire::Check-Valid-Until false" in cmd
    assert cmd[-3:] == ["forky", "/r", f"deb [signed-by={sysroot.KEYRING}] http://m/debian forky main"]
    assert board_root.key(FORKY) != board_root.key(TRIXIE)


def test_the_guest_script_builds_the_sdist_as_the_readme_says_and_tests_the_installed_package():
    clang, gcc = board_root.compilers(TRIXIE)
    assert native_build.tested_variant(clang, vlens.by_vlen(256)) == vlens.by_vlen(256)
    # GCC 14 and later build the RVV variants; an older GCC builds the portable kernels only.
    assert native_build.tested_variant(gcc, vlens.by_vlen(256)) == vlens.by_vlen(256)
    assert native_build.tested_variant(dataclasses.replace(gcc, package="g++-13"), vlens.by_vlen(256)) is None
    script = native_build.guest_script("rvv_attn-1.0.tar.gz", gcc, None, [])
    assert "python3 -m venv --system-site-packages /root/rvv-attn/venv-gcc" in script
    assert (
        "CC=gcc-14 CXX=g++-14 /root/rvv-attn/venv-gcc/bin/pip install --verbose --no-index --no-cache-dir "
        "--disable-pip-version-check --no-build-isolation --no-binary rvv-attn rvv_attn-1.0.tar.gz"
    ) in script
    assert "RVV_ATTN_EXPECT_VARIANT=portable" in script and "RVV_ATTN_EXPECT_VLEN=0" in script
    assert "RVV_ATTN_EXPECT_INSTALLED_IN=/root/rvv-attn/venv-gcc" in script
    on_clang = native_build.guest_script("rvv_attn-1.0.tar.gz", clang, vlens.by_vlen(256), [])
    assert "CC=clang-19 CXX=clang++-19" in on_clang and "RVV_ATTN_EXPECT_VARIANT=vlen256" in on_clang
    assert script.startswith("set -eu\n")


def test_native_build_options():
    opts = native_build.parse_posargs(["--compilers=gcc", "--vlen=128", "-x"], TRIXIE)
    assert (opts.compilers, opts.variant.vlen, opts.pytest_args) == (("gcc",), 128, ("-x",))
    assert native_build.parse_posargs([], FORKY).compilers == ("clang", "gcc")
    with pytest.raises(ConfigError, match="--compilers=icc: unknown icc; known: clang, gcc"):
        native_build.parse_posargs(["--compilers=icc"], TRIXIE)
