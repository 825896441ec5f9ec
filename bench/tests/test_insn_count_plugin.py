"""The insn_count plugin on a program whose counts are known by construction (known_loop.S).

Needs the plugin-capable QEMU and the built plugin (RVV_ATTN_PLUGIN_QEMU,
RVV_ATTN_INSN_PLUGIN, set by `nox -s bench-check`); it fails, not skips,
without them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _require(name: str) -> str:
    value = os.environ.get(name)
    assert value, f"{name} is not set: run these tests through `./ci/nox -s bench-check`"
    return value


def _build(tmp_path: Path, trips: int) -> Path:
    program = tmp_path / f"known_loop_{trips}"
    subprocess.run(
        [
            "clang-19",
            "--target=riscv64-linux-gnu",
            "-march=rv64gcv",
            "-nostdlib",
            "-static",
            "-fuse-ld=lld",
            f"-DLOOP_TRIPS={trips}",
            str(HERE / "known_loop.S"),
            "-o",
            str(program),
        ],
        check=True,
    )
    return program


def _run(program: Path, vlen: int, tmp_path: Path) -> list[dict]:
    out = tmp_path / f"{program.name}-{vlen}.jsonl"
    out.unlink(missing_ok=True)  # the plugin appends
    cpu = f"rv64,v=true,vlen={vlen},elen=64,vext_spec=v1.0"
    proc = subprocess.run(
        [
            _require("RVV_ATTN_PLUGIN_QEMU"),
            "-cpu",
            cpu,
            "-plugin",
            f"{_require('RVV_ATTN_INSN_PLUGIN')},outfile={out}",
            str(program),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def expected_library_counts(trips: int) -> dict[str, int]:
    """From the program's text: per trip 4 scalar, 3 vset, 3 arith (LMUL 4, 1/2, 8), 3 mem (EMUL 4, 2, 8);
    plus 4 scalar around the loop (li, la = auipc + addi, ret)."""
    return {
        "scalar": 4 * trips + 4,
        "vector_arith": 3 * trips,
        "vector_mem": 3 * trips,
        "vset": 3 * trips,
        "vector_arith_lmul1": (4 + 1 + 8) * trips,
        "vector_mem_lmul1": (4 + 2 + 8) * trips,
    }


@pytest.mark.parametrize("trips", [1, 10, 1000])
@pytest.mark.parametrize("vlen", [128, 1024])
def test_exact_counts_and_lmul_weighting(tmp_path, trips, vlen):
    regions = _run(_build(tmp_path, trips), vlen, tmp_path)
    assert [r.get("label") for r in regions] == [7, 8], regions
    measured, empty = regions
    lib = expected_library_counts(trips)
    assert measured["lib"] == lib
    assert measured["unknown_vtype"] == 0
    # Outside the library: the jal into it and the 7 instructions of the end mark.
    outside = {k: measured["all"][k] - lib[k] for k in lib}
    assert outside == {
        "scalar": 8,
        "vector_arith": 0,
        "vector_mem": 0,
        "vset": 0,
        "vector_arith_lmul1": 0,
        "vector_mem_lmul1": 0,
    }
    assert empty["all"]["scalar"] == 7 and sum(empty["lib"].values()) == 0


def test_counts_do_not_depend_on_vlen_or_repetition(tmp_path):
    program = _build(tmp_path, 37)
    runs = [_run(program, vlen, tmp_path) for vlen in (128, 256, 128)]
    assert runs[0] == runs[1] == runs[2]


def test_marks_out_of_order_are_reported(tmp_path):
    source = tmp_path / "bad.S"
    source.write_text("""
    .option norvc
    .text
    .globl _start
_start:
    li a0, -21078
    li a1, 5
    li a2, 0x5204      /* an end mark with no region open */
    li a7, 62
    ecall
    li a0, 0
    li a7, 93
    ecall
""")
    program = tmp_path / "bad"
    subprocess.run(
        [
            "clang-19",
            "--target=riscv64-linux-gnu",
            "-march=rv64gcv",
            "-nostdlib",
            "-static",
            "-fuse-ld=lld",
            str(source),
            "-o",
            str(program),
        ],
        check=True,
    )
    (line,) = _run(program, 128, tmp_path)
    assert line == {"error": "end mark without a matching start mark", "value": 5}
