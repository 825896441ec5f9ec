"""The variant_independent marker: such a test runs once, so the suite proves it cannot reach a kernel.

A small suite, run by the real conftest in a child pytest, holds a marked test
that writes the KV cache through a kernel: it must fail, naming the marker.
A marked test refused before dispatch and an unmarked kernel test pass, and
RVV_ATTN_VARIANT_INDEPENDENT=deselect drops only the marked ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The check itself is variant-independent, but it starts a second interpreter
# (another ~25 s torch import under QEMU): the host covers it.
pytestmark = pytest.mark.host_only

SUITE = """
import pytest
import torch

import rvv_attn


def write(slot):
    k, v = torch.zeros(4, 1, 8), torch.zeros(4, 1, 8)
    rvv_attn.ops.decode_set_kv_buffer(k, v, torch.ones(1, 1, 8), torch.ones(1, 1, 8), torch.tensor([slot]))


@pytest.mark.variant_independent
def test_marked_but_writes_through_a_kernel():
    write(2)


@pytest.mark.variant_independent
def test_marked_and_refused_before_dispatch():
    with pytest.raises(RuntimeError, match="outside"):
        write(9)


@pytest.mark.variant_independent
def test_marked_and_uses_the_variant_fixture(kernel_variant):
    with pytest.raises(RuntimeError, match="outside"):
        write(9)


def test_unmarked_kernel_test(kernel_variant):
    write(2)
"""


POLICY_SUITE = """
import pytest
import torch

import rvv_attn


@pytest.mark.policy_independent
def test_marked_but_writes_through_a_kernel():
    k, v = torch.zeros(4, 1, 8), torch.zeros(4, 1, 8)
    rvv_attn.ops.decode_set_kv_buffer(k, v, torch.ones(1, 1, 8), torch.ones(1, 1, 8), torch.tensor([2]))


def test_unmarked():
    pass
"""


def run_suite(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(source)
    child_env = {k: v for k, v in os.environ.items() if k != "RVV_ATTN_VARIANT_INDEPENDENT"} | env
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", str(tmp_path)],
        cwd=tmp_path,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_marked_test_that_reaches_a_kernel_fails(tmp_path):
    child = run_suite(tmp_path, SUITE)
    assert child.returncode == 1, child.stdout + child.stderr
    assert "1 failed, 3 passed" in child.stdout, child.stdout
    assert "FAILED test_suite.py::test_marked_but_writes_through_a_kernel" in child.stdout
    assert "is marked variant_independent but looked up the kernel table" in child.stdout


def test_deselect_drops_only_the_marked_tests(tmp_path):
    child = run_suite(tmp_path, SUITE, RVV_ATTN_VARIANT_INDEPENDENT="deselect")
    assert child.returncode == 0, child.stdout + child.stderr
    assert "1 passed, 3 deselected" in child.stdout, child.stdout


def test_policy_independent_is_checked_and_only_the_agnostic_configurations_drop_it(tmp_path):
    undisturbed = run_suite(tmp_path, POLICY_SUITE, RVV_ATTN_QEMU_CPU="rv64,v=true,vlen=256")
    assert undisturbed.returncode == 1, undisturbed.stdout + undisturbed.stderr
    assert "1 failed, 1 passed" in undisturbed.stdout, undisturbed.stdout
    assert "is marked policy_independent but looked up the kernel table" in undisturbed.stdout
    agnostic = run_suite(tmp_path, POLICY_SUITE, RVV_ATTN_QEMU_CPU="rv64,v=true,vlen=256,rvv_ta_all_1s=on")
    assert agnostic.returncode == 0, agnostic.stdout + agnostic.stderr
    assert "1 passed, 1 deselected" in agnostic.stdout, agnostic.stdout


def test_a_test_cannot_be_both_rvv_and_variant_independent(tmp_path):
    source = "import pytest\n\n\n@pytest.mark.rvv\n@pytest.mark.variant_independent\ndef test_both():\n    pass\n"
    child = run_suite(tmp_path, source)
    assert child.returncode != 0
    assert "marked both rvv and variant_independent" in child.stdout + child.stderr


def test_an_unknown_selection_value_is_refused(tmp_path):
    child = run_suite(tmp_path, "def test_nothing():\n    pass\n", RVV_ATTN_VARIANT_INDEPENDENT="skip")
    assert child.returncode != 0
    assert "RVV_ATTN_VARIANT_INDEPENDENT=skip" in child.stdout + child.stderr
