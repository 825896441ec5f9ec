"""The board checks (ci/board/board_checks.py, what the CI job on a SpacemiT K1 runs) against the installed wheel.

Only in the install test, where the package sits in a venv as on a board: the
script's stage after apt and pip (``--installed``) checks the variant, runs a
test in a child interpreter and the benchmark's smoke plan, and writes the
results the job uploads. Elsewhere the package is a build tree and the test
skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _board_checks():
    spec = importlib.util.spec_from_file_location("board_checks", ROOT / "ci" / "board" / "board_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_board_checks_run_against_the_installed_wheel(tmp_path):
    if not os.environ.get("RVV_ATTN_EXPECT_INSTALLED_IN"):
        pytest.skip("not the install test (RVV_ATTN_EXPECT_INSTALLED_IN unset): the script checks an installed wheel")
    results = tmp_path / "results"
    selection = "tests/test_packaging.py -k version_and_torch -p no:cacheprovider"
    argv = ["--installed", "--results", str(results), "--pytest", selection, "--bench", "--smoke --threads 1"]
    assert _board_checks().main(argv) == 0
    variant = os.environ["RVV_ATTN_EXPECT_VARIANT"]
    doc = json.loads((results / "benchmark.json").read_text())
    assert doc["environment"]["variant"] == variant and doc["plan"]["name"] == "smoke"
    assert doc["environment"]["emulated"], "the install test's CPU is emulated, and the result must say so"
    summary = (results / "summary.md").read_text()
    assert f"variant **{variant}** matches the CPU's VLEN {os.environ['RVV_ATTN_EXPECT_VLEN']}" in summary
    assert f"tests (`pytest {selection}`, {variant} and portable): passed" in summary
    assert "## rvv-attn board benchmark" in summary and "> **EMULATED CPU" in summary
    junit = (results / "junit.xml").read_text()
    assert 'tests="1"' in junit and 'failures="0"' in junit and 'errors="0"' in junit
