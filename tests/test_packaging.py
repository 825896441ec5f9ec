"""What a user of the installed package sees: version, the torch guard, CPU detection, where it was imported from."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

import rvv_attn
from rvv_attn._torch_guard import major_minor, pick_library, shipped_libraries

EXPECTED_VARIANT = os.environ.get("RVV_ATTN_EXPECT_VARIANT", "")
ON_RISCV = platform.machine() == "riscv64"


def test_runtime_info_names_the_expected_variant_and_the_cpu_extensions():
    info = rvv_attn.runtime_info()
    if EXPECTED_VARIANT:  # emulated runs: the session says which CPU QEMU emulates
        expected_vlen = int(os.environ["RVV_ATTN_EXPECT_VLEN"])
        assert info["active_variant"] == EXPECTED_VARIANT
        assert info["cpu_vlen"] == expected_vlen
        assert ("v" in info["cpu_extensions"]) == (expected_vlen > 0)
    if ON_RISCV:
        # QEMU's user mode implements riscv_hwprobe, as Linux >= 6.4 does.
        assert info["cpu_detection"] == "riscv_hwprobe"
    else:
        assert info["cpu_detection"].startswith("none")
        assert info["cpu_extensions"] == [] and info["cpu_vlen"] == 0
    assert set(info["cpu_extensions"]) <= {"v", "zvfh", "zvfbfmin"}
    # Sub-extensions of V are only reported together with V.
    assert not info["cpu_extensions"] or info["cpu_extensions"][0] == "v"


def test_at_hwcap_fallback_sees_the_same_v_and_vlen():
    extensions, vlen, source = rvv_attn.ops.cpu_features("hwcap")
    info = rvv_attn.runtime_info()
    assert source == ("AT_HWCAP" if ON_RISCV else "none (not riscv64 Linux)")
    assert int(vlen) == info["cpu_vlen"]
    # AT_HWCAP has single-letter extensions only: V, never Zvfh/Zvfbfmin.
    assert list(extensions) == (["v"] if info["cpu_vlen"] else [])


@pytest.mark.variant_independent
def test_unknown_probe_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"probe must be 'auto' or 'hwcap', got 'cpuid'"):
        rvv_attn.ops.cpu_features("cpuid")


def test_version_and_torch_record_match_the_installed_metadata():
    info = rvv_attn.runtime_info()
    assert rvv_attn.__version__ == metadata.version("rvv-attn") == info["version"]
    assert major_minor(info["built_against_torch"]) == major_minor(torch.__version__)


@pytest.mark.variant_independent
def test_installed_package_is_imported_from_the_venv():
    venv = os.environ.get("RVV_ATTN_EXPECT_INSTALLED_IN")
    if not venv:
        pytest.skip("not the install test (RVV_ATTN_EXPECT_INSTALLED_IN unset)")
    package = Path(rvv_attn.__file__).resolve()
    assert Path(venv).resolve() in package.parents, f"rvv_attn imported from {package}, not from {venv}"
    assert "PYTHONPATH" not in os.environ
    assert sys.prefix != sys.base_prefix  # running in the venv


TWO_LINES = {"2.6.0": Path("torch-2.6.0/lib.so"), "2.14.1": Path("torch-2.14.1/lib.so")}


@pytest.mark.variant_independent
@pytest.mark.parametrize(
    ("running", "built"),
    [
        ("2.6.0", "2.6.0"),
        ("2.6.0+debian", "2.6.0"),
        ("2.6.3", "2.6.0"),
        ("2.14.1+debian", "2.14.1"),
        ("2.14.0a0", "2.14.1"),
    ],
)
def test_torch_guard_picks_the_library_of_the_same_major_minor(running, built):
    assert pick_library("0.1", TWO_LINES, running) == (built, TWO_LINES[built])


@pytest.mark.variant_independent
@pytest.mark.parametrize("running", ["2.7.0", "2.5.1+debian", "3.6.0", "2.13.0", "2.1.4"])
def test_torch_guard_names_every_shipped_line_and_what_to_do(running):
    with pytest.raises(ImportError) as err:
        pick_library("0.2.dev3", TWO_LINES, running)
    message = str(err.value)
    assert f"for torch 2.6 and torch 2.14 (built against torch 2.6.0, 2.14.1), but this Python has torch {running}" in (
        message
    )
    assert "rvv_attn 0.2.dev3" in message and "python3-torch" in message and "--no-binary rvv-attn" in message


@pytest.mark.variant_independent
def test_shipped_libraries_are_the_torch_folders_that_hold_a_library(tmp_path):
    for folder in ("torch-2.6.0", "torch-2.14.1", "torch-next", "other"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "librvv_attn_ops.so").write_bytes(b"")
    (tmp_path / "torch-2.7.0").mkdir()  # no library in it
    assert shipped_libraries(tmp_path) == {
        "2.14.1": tmp_path / "torch-2.14.1" / "librvv_attn_ops.so",
        "2.6.0": tmp_path / "torch-2.6.0" / "librvv_attn_ops.so",
    }


def test_the_loaded_library_is_the_one_for_this_torch():
    info = rvv_attn.runtime_info()
    assert rvv_attn.library_path.parent.name == f"torch-{info['built_against_torch']}"
    assert info["built_against_torch"] in info["torch_lines"]
    assert any(str(rvv_attn.library_path) in p for p in torch.ops.loaded_libraries)


@pytest.mark.variant_independent
def test_torch_guard_rejects_a_string_that_is_not_a_version():
    with pytest.raises(ValueError, match="not a torch version: 'debian'"):
        major_minor("debian")


@pytest.mark.host_only
def test_import_under_another_torch_minor_fails_before_loading_the_library():
    """End to end, in a fresh interpreter whose torch reports another minor version."""
    other = f"{major_minor(torch.__version__)[0]}.{major_minor(torch.__version__)[1] + 1}.0"
    code = "\n".join(
        [
            "import torch",
            f"torch.__version__ = {other!r}",
            "try:",
            "    import rvv_attn",
            "except ImportError as err:",
            "    print('ImportError:', err)",
            "    print('loaded:', any('librvv_attn_ops' in p for p in torch.ops.loaded_libraries))",
            "    raise SystemExit(3)",
        ]
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 3, child.stdout + child.stderr
    built = rvv_attn.runtime_info()["built_against_torch"]
    assert f"(built against torch {built}), but this Python has torch {other}" in child.stdout
    assert "loaded: False" in child.stdout


@pytest.mark.rvv
@pytest.mark.policy_independent
def test_riscv_hwprobe_reports_zvfh_when_the_cpu_has_it():
    """A second qemu-riscv64 whose CPU adds Zvfh: riscv_hwprobe reports it, AT_HWCAP cannot.

    Started from inside the guest (QEMU passes execve of a host binary
    through); once per emulated run, at the table's first VLEN and the
    undisturbed policy (feature probing runs no vector instruction), because the
    child imports torch again.
    """
    this = int(os.environ["RVV_ATTN_EXPECT_VLEN"])
    if this != 128:
        pytest.skip("checked once per emulated run, at VLEN 128")
    if not os.environ.get("RVV_ATTN_QEMU"):
        pytest.skip("needs qemu-riscv64 to add Zvfh to the CPU; on a board the CPU has what it has")
    cpu = os.environ["RVV_ATTN_QEMU_CPU"] + ",zvfh=true"
    code = "import rvv_attn; print(rvv_attn.ops.cpu_features()); print(rvv_attn.ops.cpu_features('hwcap'))"
    child = subprocess.run(
        [os.environ["RVV_ATTN_QEMU"], "-L", os.environ["RVV_ATTN_SYSROOT"], "-cpu", cpu, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    probed, hwcap = child.stdout.splitlines()[-2:]
    assert probed == f"(['v', 'zvfh'], {this}, 'riscv_hwprobe')"
    assert hwcap == f"(['v'], {this}, 'AT_HWCAP')"
