"""The cycle estimator (ci/driver/bench/cycles.py) against the scheduling models' own figures.

Loops whose cycles follow from a model's published per-instruction throughput
(llvm-mca's instruction info, read from the model's tables) must come out of
the estimator (llvm-mca's timeline, one block as its own loop) within a few
percent: independent FMAs at every LMUL, with unit-stride and with indexed
loads. Needs llvm-mc-22 and llvm-mca-22 (installed by `nox -s bench-check`);
it fails, not skips, without them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci"))

from driver.bench import cycles  # noqa: E402

# Each VLEN's core (the bench's table), and the code the kernels are built for.
CORES = {
    vlen: cycles.Core(cpu, cycles.mattr_for(f"rv64gcv_zvl{vlen}b"))
    for vlen, cpu in [(128, "sifive-p670"), (256, "spacemit-x60"), (512, "sifive-x280"), (1024, "sifive-x390")]
}
LMULS = {1: 8, 2: 16, 4: 32, 8: 64}  # LMUL -> LMUL x 8
# Within this of the model's throughput: the pipeline's ramp-up and drain over 100 iterations of a short block.
TOLERANCE = 0.04


def _assemble(asm: list[str], mattr: str) -> bytes:
    proc = subprocess.run(
        [cycles.LLVM_MC, "-triple=riscv64", f"-mattr={mattr}", "--show-encoding"],
        input="\n".join(asm) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    code = b""
    for match in re.finditer(r"encoding: \[([^\]]*)\]", proc.stdout):
        code += bytes(int(b, 16) for b in match.group(1).split(","))
    return code


def _static(asm: list[str], core: cycles.Core, vtype: cycles.VType) -> tuple[float, float]:
    """The model's static figures for ``asm`` at ``vtype``: block reciprocal throughput and the largest latency.

    The block throughput is the cycles the busiest resource is held, summed from the model's tables without
    simulating anything (the instruction table's own RThroughput column leaves out some models' multi-cycle
    holds of a unit, so it is not used).
    """
    source = "\n".join([*vtype.instruments(), *asm]) + "\n"
    report = cycles.mca_report(source, core, "--timeline=false", "--resource-pressure=false")
    region = report["CodeRegions"][0]
    latency = max(i["Latency"] for i in region["InstructionInfoView"]["InstructionList"])
    return float(region["SummaryView"]["BlockRThroughput"]), float(latency)


def _groups(lmul: int, count: int, first: int = 0) -> list[str]:
    """``count`` register groups of size ``lmul``, as names (v0 is left alone: it is the mask register)."""
    step = max(1, lmul)
    return [f"v{first + step * (i + 1)}" for i in range(count)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return cycles.CostCache(tmp_path_factory.mktemp("mca"))


def test_llvm_22_is_there():
    assert cycles.llvm_version().split()[-1].startswith("22."), cycles.llvm_version()


@pytest.mark.parametrize("lmul", sorted(LMULS))
@pytest.mark.parametrize("vlen", sorted(CORES))
def test_independent_fmas_cost_the_models_throughput(vlen, lmul, cache):
    core, vtype = CORES[vlen], cycles.VType(32, LMULS[lmul])
    # Three register groups per FMA (accumulator, two sources), as many FMAs as fit beside v0.
    fmas = max(1, 31 // (3 * lmul)) if lmul < 8 else 1
    regs = _groups(lmul, 3 * fmas)
    asm = [f"vfmacc.vv {regs[3 * i]}, {regs[3 * i + 1]}, {regs[3 * i + 2]}" for i in range(fmas)]
    block = cycles.Block(_assemble(asm, core.mattr), vtype)
    rthroughput, latency = _static(asm[:1], core, vtype)
    # Each accumulator is carried from one iteration to the next: an iteration takes the FMAs' issue time
    # (count x reciprocal throughput) or one FMA's latency, whichever is longer.
    expected = max(fmas * rthroughput, latency)
    assert cache.costs([block], core)[block] == pytest.approx(expected, rel=TOLERANCE)


@pytest.mark.parametrize("lmul", sorted(LMULS))
@pytest.mark.parametrize("load", ["vle32.v {d}, (a1)", "vluxei32.v {d}, (a1), {i}"], ids=["unit-stride", "indexed"])
@pytest.mark.parametrize("vlen", sorted(CORES))
def test_independent_loads_cost_the_models_throughput(vlen, load, lmul, cache):
    """Loads that no later instruction waits for: the block costs its busiest resource's cycles."""
    core, vtype = CORES[vlen], cycles.VType(32, LMULS[lmul])
    loads = min(24 // lmul, 32 // lmul - 2)  # the register groups beside v0 and the index group
    regs = _groups(lmul, loads + 1)
    asm = [load.format(d=regs[k], i=regs[-1]) for k in range(loads)]
    block = cycles.Block(_assemble(asm, core.mattr), vtype)
    throughput, _ = _static(asm, core, vtype)
    assert cache.costs([block], core)[block] == pytest.approx(throughput, rel=TOLERANCE)


def test_an_estimate_is_count_times_cost_and_the_cache_answers_the_second_time(tmp_path):
    core = CORES[256]
    fma = cycles.Block(
        _assemble(["vfmacc.vv v8, v16, v24", "vfmacc.vv v10, v18, v26"], core.mattr), cycles.VType(32, 8)
    )
    scalar = cycles.Block(_assemble(["addi a0, a0, 4", "addi a1, a1, 4", "bnez a2, -8"], core.mattr))
    cache = cycles.CostCache(tmp_path / "mca")
    costs = cache.costs([fma, scalar], core)
    assert cycles.estimate({fma: 1000, scalar: 10}, core, cache) == pytest.approx(
        1000 * costs[fma] + 10 * costs[scalar]
    )
    # The second time nothing runs: a cache whose tool would fail still answers.
    again = cycles.CostCache(tmp_path / "mca", version=cache.version)
    original, cycles.LLVM_MCA = cycles.LLVM_MCA, "/nonexistent/llvm-mca"
    try:
        assert again.costs([fma, scalar], core) == costs
    finally:
        cycles.LLVM_MCA = original


def test_the_entry_vtype_changes_the_cost_of_the_same_code(cache):
    core = CORES[256]
    code = _assemble(["vfmacc.vv v8, v16, v24", "vfmacc.vv v9, v17, v25"], core.mattr)
    m1, m8 = cycles.Block(code, cycles.VType(32, 8)), cycles.Block(code, cycles.VType(32, 64))
    costs = cache.costs([m1, m8], core)
    assert costs[m8] > 2 * costs[m1]
