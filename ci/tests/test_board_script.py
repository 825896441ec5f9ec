"""The board checks' script (ci/board/): wheel lookup, venv, the variant verdict, the test run's command and
environment, and stage 2 end to end against the host's portable build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "board"))

import board_checks  # noqa: E402

SHELL_SCRIPT = ROOT / "ci" / "board" / "run-board-checks.sh"


def _info(vlen: int, active: str, compiled=("portable", "vlen128", "vlen256")) -> dict:
    return {"cpu_vlen": vlen, "active_variant": active, "compiled_variants": list(compiled), "reason": "auto"}


def test_the_wheel_is_a_file_or_the_one_wheel_of_a_folder(tmp_path):
    wheel = tmp_path / "rvv_attn-0.2.0-py3-none-manylinux_2_39_riscv64.whl"
    with pytest.raises(board_checks.CheckFailed, match="found none.*`./ci/nox -s wheel`"):
        board_checks.find_wheel(tmp_path)
    wheel.write_bytes(b"")
    assert board_checks.find_wheel(tmp_path) == wheel == board_checks.find_wheel(wheel)
    (tmp_path / "rvv_attn-0.1.0-py3-none-manylinux_2_39_riscv64.whl").write_bytes(b"")
    with pytest.raises(board_checks.CheckFailed, match="need one rvv_attn-\\*.whl there, found rvv_attn-0.1.0"):
        board_checks.find_wheel(tmp_path)


def test_the_venv_sees_debians_torch_and_pip_uses_no_index(tmp_path):
    venv_cmd, pip_cmd = board_checks.venv_commands(tmp_path / "venv", tmp_path / "w.whl")
    assert venv_cmd[1:4] == ["-m", "venv", "--system-site-packages"]
    assert pip_cmd[0] == str(tmp_path / "venv/bin/python3") and "--no-index" in pip_cmd and "--no-deps" in pip_cmd
    assert pip_cmd[-1] == str(tmp_path / "w.whl")


def test_the_variant_must_match_the_cpus_vlen():
    assert board_checks.expected_variant(_info(256, "vlen256"), 256) == "vlen256"
    assert board_checks.expected_variant(_info(0, "portable"), None) == "portable"
    with pytest.raises(board_checks.CheckFailed, match="picked portable on a CPU with VLEN 256.*RVV_ATTN_VARIANT"):
        board_checks.expected_variant(_info(256, "portable"), None)
    with pytest.raises(board_checks.CheckFailed, match="no variant for this CPU's VLEN 512.*toolchains/vlens.json"):
        board_checks.expected_variant(_info(512, "portable"), None)
    with pytest.raises(board_checks.CheckFailed, match="VLEN 128 .*--expect-vlen=256"):
        board_checks.expected_variant(_info(128, "vlen128"), 256)


def test_children_start_directly_or_through_the_install_tests_qemu():
    assert board_checks.child_prefix({}) == []
    emulated = {"RVV_ATTN_QEMU": "/q", "RVV_ATTN_SYSROOT": "/s", "RVV_ATTN_QEMU_CPU": "rv64,v=true,vlen=128"}
    assert board_checks.child_prefix(emulated) == ["/q", "-L", "/s", "-cpu", "rv64,v=true,vlen=128"]
    assert board_checks.child_prefix({"RVV_ATTN_QEMU": "/q"}) == []  # half a configuration is none
    cmd = board_checks.pytest_command("/venv/bin/python3", "tests -x -k 'a or b'", Path("/r/j.xml"), emulated)
    assert cmd[:6] == ["/q", "-L", "/s", "-cpu", "rv64,v=true,vlen=128", "/venv/bin/python3"]
    assert cmd[6:] == ["-P", "-m", "pytest", "--junitxml=/r/j.xml", "tests", "-x", "-k", "a or b"]


def test_the_tests_are_told_the_variant_and_where_the_package_must_come_from():
    env = board_checks.pytest_env({"RVV_ATTN_VARIANT": "portable", "HOME": "/h"}, "vlen256", 256, "/venv")
    assert "RVV_ATTN_VARIANT" not in env and env["HOME"] == "/h"
    assert (env["RVV_ATTN_EXPECT_VARIANT"], env["RVV_ATTN_EXPECT_VLEN"]) == ("vlen256", "256")
    assert env["RVV_ATTN_TEST_PORTABLE"] == "1" and env["RVV_ATTN_EXPECT_INSTALLED_IN"] == "/venv"
    defaults = board_checks.parse_args([])
    assert (defaults.pytest, defaults.bench, defaults.installed) == ("tests", "--quick", False)


def test_the_shell_script_installs_debians_torch_then_hands_over():
    text = SHELL_SCRIPT.read_text()
    assert subprocess.run(["sh", "-n", str(SHELL_SCRIPT)]).returncode == 0
    assert "python3-torch" in text and "python3-venv" in text and "python3-hypothesis" in text
    assert text.rstrip().endswith('exec python3 "$here/board_checks.py" "$@"')
    assert "debian:trixie" in text and SHELL_SCRIPT.stat().st_mode & 0o111


def test_stage_two_runs_against_this_pythons_package(tmp_path):
    """--installed on the host's portable build: the variant check, one test in a child, the smoke benchmark."""
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RVV_ATTN_")}
    argv = ["--installed", "--results", str(results), "--pytest", "tests/test_packaging.py -k version_and_torch"]
    assert board_checks.main([*argv, "--bench", "--smoke --threads 1 --no-sdpa"], env=env) == 0
    doc = json.loads((results / "benchmark.json").read_text())
    assert doc["environment"]["variant"] == "portable" and doc["plan"]["sdpa"] is False
    summary = (results / "summary.md").read_text()
    assert "variant **portable** matches the CPU's VLEN 0" in summary and ": passed in" in summary
    assert "| shape | thr | median ms |" in summary
    # A failing test fails the checks, after the benchmark still ran.
    failing = ["--pytest", "tests/test_runtime.py -k no_such_test_selects_nothing", "--bench", "--smoke --only=ctx=24"]
    assert board_checks.main([*argv[:3], *failing], env=env) == 1
