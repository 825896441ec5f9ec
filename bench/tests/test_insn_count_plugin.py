"""The insn_count plugin on a program whose counts are known by construction (known_loop.S).

Needs the plugin-capable QEMU and the built plugin (RVV_ATTN_PLUGIN_QEMU,
RVV_ATTN_INSN_PLUGIN, set by `nox -s bench-check`); it fails, not skips,
without them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "ci"))  # the driver's cycle model


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


def _run(program: Path, vlen: int, tmp_path: Path, blocks: Path | None = None) -> list[dict]:
    out = tmp_path / f"{program.name}-{vlen}.jsonl"
    out.unlink(missing_ok=True)  # the plugin appends
    options = f"outfile={out}" + (f",blocks={blocks}" if blocks else "")
    cpu = f"rv64,v=true,vlen={vlen},elen=64,vext_spec=v1.0"
    proc = subprocess.run(
        [
            _require("RVV_ATTN_PLUGIN_QEMU"),
            "-cpu",
            cpu,
            "-plugin",
            f"{_require('RVV_ATTN_INSN_PLUGIN')},{options}",
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


# The loop of known_loop.S as written there, for llvm-mca: the cost the trace's loop block must get.
KNOWN_LOOP_BODY = """vsetvli t1, zero, e32, m4, ta, ma
vle32.v v8, (a1)
vfadd.vv v8, v8, v8
vle16.v v4, (a1)
vsetvli t1, zero, e8, mf2, ta, ma
vadd.vv v1, v1, v1
li t2, 0x13
vsetvl t1, zero, t2
vadd.vv v16, v16, v16
vse32.v v16, (a1)
flw ft0, 0(a1)
addi t0, t0, -1
bnez t0, -48"""


def _profile(tmp_path: Path, trips: int, vlen: int = 256) -> tuple[dict, list[dict]]:
    blocks = tmp_path / f"blocks-{trips}.jsonl"
    blocks.unlink(missing_ok=True)
    counts = _run(_build(tmp_path, trips), vlen, tmp_path, blocks)
    return counts[0], [json.loads(line) for line in blocks.read_text().splitlines()]


@pytest.mark.parametrize("trips", [1, 10, 1000])
def test_the_block_profile_accounts_for_every_library_instruction(tmp_path, trips):
    from driver.bench import cycles

    counts, profiles = _profile(tmp_path, trips)
    assert [p["label"] for p in profiles] == [7, 8]
    measured, empty = profiles
    assert empty["blocks"] == []
    # Every translation block's runs, and every basic block's entries, add up to the counted instructions.
    executed = sum(b["runs"] * len(cycles.instruction_lengths(bytes.fromhex(b["code"]))) for b in measured["blocks"])
    assert executed == sum(counts["lib"][k] for k in ("scalar", "vector_arith", "vector_mem", "vset"))
    entered = cycles.basic_blocks(measured["blocks"])
    assert sum(runs * len(cycles.instruction_lengths(b.code)) for b, runs in entered.items()) == executed
    # The loop is one basic block (several translation blocks: QEMU ends one at each vset*), entered from its
    # back branch with the vtype its last vsetvl set (e32, m8): trips - 1 times, the first trip falls in from
    # the code before it.
    loop = _assemble_loop()
    assert {b.vtype: runs for b, runs in entered.items() if b.code == loop} == (
        {cycles.VType(32, 64): trips - 1} if trips > 1 else {}
    )


def _assemble_loop() -> bytes:
    from driver.bench import cycles

    proc = subprocess.run(
        [cycles.LLVM_MC, "-triple=riscv64", "-mattr=+v,+f,+d", "--show-encoding", "-riscv-no-aliases"],
        input=KNOWN_LOOP_BODY + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return b"".join(
        bytes(int(x, 16) for x in m.group(1).split(",")) for m in re.finditer(r"encoding: \[([^\]]*)\]", proc.stdout)
    )


def test_an_estimate_from_the_trace_is_the_loops_cost_times_its_trips(tmp_path):
    from driver.bench import cycles

    trips = 1000
    _, (measured, _) = _profile(tmp_path, trips)
    core = cycles.Core("spacemit-x60", cycles.mattr_for("rv64gcv"))
    loop = {b: runs for b, runs in cycles.basic_blocks(measured["blocks"]).items() if b.code == _assemble_loop()}
    assert list(loop.values()) == [trips - 1]
    (per_trip,) = cycles.run_mca(
        cycles.region_source([("loop", cycles.VType(32, 64), KNOWN_LOOP_BODY.splitlines())]), core
    )
    estimate = cycles.estimate(loop, core, cycles.CostCache(tmp_path / "mca"))
    assert estimate == pytest.approx((trips - 1) * per_trip.cycles_per_iteration, rel=1e-9)
