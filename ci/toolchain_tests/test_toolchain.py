"""The toolchain itself, with the real clang-19, QEMU, sysroot and cross build."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from driver.toolchain import build, torch_lines, vlens
from driver.toolchain import qemu as qemu_pin
from driver.toolchain import sysroot as sysroot_recipe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EM_RISCV = 243


def sh(*cmd: object, **kw) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_qemu_is_the_pinned_binary(qemu):
    pin = qemu_pin.QemuPin.load()
    assert qemu_pin.sha256_of(qemu) == pin.sha256
    upstream = pin.version.split(":")[-1].split("+")[0]
    assert f"version {upstream}" in sh(qemu, "--version")


def test_sysroot_is_complete_and_fixed_up(sysroot):
    manifest = sysroot_recipe.Manifest.for_line()
    assert sysroot_recipe.is_complete(sysroot, manifest.key())
    assert (sysroot / "lib").resolve() == (sysroot / "usr/lib").resolve()
    assert (sysroot / "lib/ld-linux-riscv64-lp64d.so.1").exists()
    libdir = sysroot / "usr/lib/riscv64-linux-gnu"
    assert (libdir / "libblas.so.3").resolve().exists() and (libdir / "liblapack.so.3").resolve().exists()
    pycs = list((sysroot / "usr/lib/python3/dist-packages/torch/__pycache__").glob("__init__.cpython-3*.pyc"))
    assert pycs, "torch is not byte-compiled: import torch under QEMU would take twice as long"
    assert not (sysroot / "tmp").exists(), "an empty /tmp in the sysroot shadows the host's under qemu -L"


def test_wheel_is_riscv64_with_every_variant_in_one_library(wheel, tmp_path):
    assert wheel.name.endswith("-py3-none-linux_riscv64.whl")
    with zipfile.ZipFile(wheel) as zf:
        (member,) = build.wheel_libraries(zf.namelist()).values()  # one: the active torch line's
        lib = Path(zf.extract(member, tmp_path))
    line = torch_lines.active_line()
    assert member.startswith(f"rvv_attn/torch-{line.torch}.")
    header = lib.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_RISCV
    # The installed library is stripped: its exported (dynamic) symbols remain.
    symbols = sh("llvm-nm-19", "-C", "-D", "--defined-only", lib)
    for name in ["portable"] + [v.name for v in vlens.variants()]:
        assert f"rvv_attn::{name}::kernel_table()" in symbols, f"variant {name} missing from the library"


def test_only_the_vlen_namespaces_contain_vector_instructions(cross_build_dir):
    """Code outside rvv_attn::vlen<N> runs on CPUs without V, or at any VLEN.

    Catches, among others, a template instantiated in a kernel file that the
    linker kept from a VLEN build for the whole library. Reads the unstripped
    library in the build tree, so every function, internal ones too, is named.
    """
    lib = cross_build_dir / "librvv_attn_ops.so"
    listing = sh("llvm-objdump-19", "-d", "-C", "--no-show-raw-insn", lib)
    current, offenders = "", set()
    vlen_ns = re.compile(r"rvv_attn::vlen\d+::")
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = header.group(1)
            continue
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1].strip().startswith("v") and not vlen_ns.search(current):
            offenders.add(current)
    assert not offenders, f"vector instructions outside the VLEN builds: {sorted(offenders)[:10]}"
    # The listing did name the kernels, and they do use vector instructions.
    assert "rvv_attn::vlen128::" in listing and re.search(r"\tvsetvli", listing)


def test_touching_one_kernel_file_recompiles_only_its_objects(cross_build_dir):
    source = ROOT / "csrc/kernels/kv_write.cpp"
    later = time.time() + 2
    os.utime(source, (later, later))
    plan = sh("ninja", "-C", cross_build_dir, "-n")
    compiled = re.findall(r"Building CXX object (\S+)", plan)
    assert compiled, plan
    assert all(c.endswith("kv_write.cpp.o") for c in compiled), compiled
    # Once per variant: portable and one per VLEN of the table.
    assert len(compiled) == 1 + len(vlens.variants())


def _compile_snippet(sysroot: Path, out: Path) -> Path:
    sh(
        "clang-19",
        "--target=riscv64-linux-gnu",
        f"--sysroot={sysroot}",
        "-march=rv64gcv",
        "-mabi=lp64d",
        "-O2",
        "-fuse-ld=lld",
        HERE / "tail_policy.c",
        "-o",
        out,
    )
    return out


def _run_snippet(qemu: Path, sysroot: Path, exe: Path, vlen: int, agnostic: bool) -> dict[str, float]:
    cpu = vlens.by_vlen(vlen).qemu_cpu(agnostic_ones=agnostic)
    out = sh(qemu, "-L", sysroot, "-cpu", cpu, exe)
    return {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", out)}


@pytest.mark.parametrize("vlen", [v.vlen for v in vlens.variants()])
def test_agnostic_lane_catches_a_kernel_that_reads_tail_lanes(qemu, sysroot, tmp_path, vlen):
    exe = _compile_snippet(sysroot, tmp_path / "tail_policy")
    default = _run_snippet(qemu, sysroot, exe, vlen, agnostic=False)
    # QEMU's default (undisturbed) hides the bug: both versions look right.
    assert default["agnostic"] == default["undisturbed"] == default["exact"]
    ones = _run_snippet(qemu, sysroot, exe, vlen, agnostic=True)
    # All-ones agnostic lanes expose it, and only in the buggy version.
    assert math.isnan(ones["agnostic"])
    assert ones["undisturbed"] == ones["exact"]


def test_lock_file_matches_the_sysroot(sysroot):
    marker = json.loads((sysroot / sysroot_recipe.MARKER).read_text())
    line = torch_lines.active_line()
    locked = sysroot_recipe.parse_lock(line.lock_file.read_text())
    assert marker["packages"] == len(locked)
    for pkg in ("python3-torch", "libtorch-dev", f"python{line.python}"):
        assert pkg in locked
    assert locked["python3-torch"].startswith(line.torch + ".")
