"""gcc-check: which compilers, levels and VLENs it builds, how, and how it reads the results."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.testing import gcc_check
from driver.toolchain import cross_gcc, vlens

ALL_VLENS = tuple(v.vlen for v in vlens.variants())


def test_defaults_cover_every_compiler_level_and_vlen_of_the_table():
    options = gcc_check.parse_posargs([])
    assert options.vlens == ALL_VLENS
    cases = gcc_check.plan(options)
    assert len(cases) == len(gcc_check.COMPILERS) * len(gcc_check.LEVELS) * len(ALL_VLENS)
    assert {c.compiler for c in cases} == {"gcc14", "gcc15", "gcc16", "clang19", "clang21"}


def test_options_narrow_the_plan():
    options = gcc_check.parse_posargs(["--compilers=gcc14", "--levels=O2,O3", "--vlens=256"])
    assert [c.name for c in gcc_check.plan(options)] == ["gcc14-O2-vlen256", "gcc14-O3-vlen256"]


@pytest.mark.parametrize("bad", ["--compilers=gcc13", "--levels=Os", "--vlens=64", "--vlens=", "--jobs=2"])
def test_unknown_options_name_what_is_accepted(bad):
    with pytest.raises(ConfigError, match="--compilers=gcc14,gcc15,gcc16,clang19,clang21"):
        gcc_check.parse_posargs([bad])


def test_a_case_is_built_like_the_librarys_variant_of_that_vlen():
    args = gcc_check.compile_args(gcc_check.Case("gcc14", "O3", 512), "out")
    # Release flags (-fPIC -DNDEBUG: GCC 14's -O3 fault shows only with both) and the variant's target.
    for flag in ("-O3", "-fPIC", "-DNDEBUG", "-march=rv64gcv_zvl512b", "-mrvv-vector-bits=zvl", "-DRVV_ATTN_VLEN=512"):
        assert flag in args
    assert "-DRVV_ATTN_VARIANT=vlen512" in args and "-static" in args
    assert args[-3:] == ["decode_check.cpp", "-o", "out"]


def test_the_report_is_read_per_dtype():
    output = (
        "  wrong: f16 H=4 H_kv=4 D=64 splits=1 len=33 error 0.4\n"
        "ok f32 vlen=256 block=32 cases=24 wrong=0 worst=1e-07\n"
        "ok bf16 vlen=256 block=32 cases=24 wrong=0 worst=0.004\n"
        "WRONG f16 vlen=256 block=32 cases=24 wrong=9 worst=0.4\n"
    )
    assert gcc_check.parse_report(output) == {"f32": "ok", "bf16": "ok", "f16": "WRONG"}
    assert gcc_check.parse_report("Segmentation fault\n") == {}


def test_the_table_says_which_dtype_went_wrong_and_which_build_failed():
    options = gcc_check.Options(("gcc14",), ("O2",), (128, 256, 512))
    rows = {
        gcc_check.Case("gcc14", "O2", 128): {"f32": "ok", "f16": "WRONG"},
        gcc_check.Case("gcc14", "O2", 256): {"f32": "ok", "f16": "ok"},
        gcc_check.Case("gcc14", "O2", 512): {},
    }
    table = gcc_check.format_table(rows, options).splitlines()
    assert table[-1] == "| gcc14 | O2 | wrong: f16 | ok | crash or no build |"


def test_the_check_includes_the_kernel_source_as_it_is(tmp_path):
    gcc_check.stage_sources(tmp_path / "case")
    staged = tmp_path / "case"
    assert (staged / "kernels" / "decode.cpp").read_bytes() == (gcc_check.KERNELS / "decode.cpp").read_bytes()
    assert '#include "kernels/decode.cpp"' in (staged / "decode_check.cpp").read_text()


def test_a_host_compiler_runs_as_is_and_a_rooted_one_through_chroot_in_its_folder():
    on_host = cross_gcc.CrossGcc(14)
    assert on_host.command(["-O2", "x.cpp"], Path("/anywhere")) == ["riscv64-linux-gnu-g++-14", "-O2", "x.cpp"]
    root = Path("/cache/cross-gcc/forky")
    rooted = cross_gcc.CrossGcc(16, root)
    assert rooted.stage(Path("/build")) == root / "work"
    cmd = rooted.command(["-O2", "x.cpp"], root / "work" / "case", ["sudo", "-n"])
    assert cmd == [
        "sudo",
        "-n",
        "chroot",
        str(root),
        "env",
        "-C",
        "/work/case",
        "riscv64-linux-gnu-g++-16",
        "-O2",
        "x.cpp",
    ]


def test_only_missing_versions_come_from_the_root():
    present = {"riscv64-linux-gnu-g++-14"}
    assert cross_gcc.host_versions(lambda name: name if name in present else None) == [14]
    cmd = cross_gcc.mmdebstrap_command(Path("/t"), "http://archive.example/debian")
    assert "--architectures=amd64" in cmd
    assert "--include=g++-14-riscv64-linux-gnu,g++-15-riscv64-linux-gnu,g++-16-riscv64-linux-gnu,clang-21" in cmd
    assert cmd[-1].endswith("http://archive.example/debian forky main")
    # The key names everything the root holds, so adding a compiler builds a new root.
    assert cross_gcc.root_key() == "forky-amd64-gcc14-15-16-clang21"


def test_the_roots_clang_is_told_its_target_and_runs_like_the_gccs():
    root = Path("/cache/cross-gcc/forky")
    clang = cross_gcc.CrossGcc(21, root, kind="clang")
    assert clang.name == "clang21"
    assert clang.command(["-O2", "x.cpp"], root / "work" / "c") == [
        "chroot",
        str(root),
        "env",
        "-C",
        "/work/c",
        "clang++-21",
        "--target=riscv64-linux-gnu",
        "-O2",
        "x.cpp",
    ]


def test_the_hosts_archive_is_asked_for_a_candidate_first():
    offered = "g++-14-riscv64-linux-gnu:\n  Installed: (none)\n  Candidate: 14.2.0-19cross1\n  Version table:\n"
    assert cross_gcc.apt_candidate(offered) == "14.2.0-19cross1"
    assert cross_gcc.apt_candidate("g++-14-riscv64-linux-gnu:\n  Installed: (none)\n  Candidate: (none)\n") is None
    assert cross_gcc.apt_candidate("") is None  # apt-cache knows no such package
