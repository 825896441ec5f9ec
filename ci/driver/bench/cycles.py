"""Cycle estimates for executed code from LLVM's scheduling models of real RVV cores (llvm-mca).

The counting plugin reports, per executed translation block of the kernel
library, its machine code, the vtype in force when it was entered and how
often it ran. Each distinct (code, entry vtype) goes once through
``llvm-mca -mcpu=<core>``, as a loop of itself: its cost is the steady-state
cycles of one iteration (total cycles of ``ITERATIONS`` iterations divided by
``ITERATIONS``). A run's estimate is the sum over blocks of count x cost.

What that model leaves out, by construction: cache misses and memory
bandwidth (every load hits), branch mispredictions, and stalls that cross a
block boundary (each block is timed as if it followed itself). For the
kernels' hot loops (one block each, run thousands of times) the steady state
is what matters; for short blocks run a few times it is rough.

Costs are cached on disk by (LLVM version, core, attributes, vtype, code), so
a benchmark run after a small kernel change only asks llvm-mca about the
blocks that changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommandFailed, MissingPrerequisite

LLVM_PACKAGE = "llvm-22"  # Debian's package (Debian 12 has it from its security archive)
LLVM_MCA = "llvm-mca-22"
LLVM_MC = "llvm-mc-22"
# For host.ensure_host_packages: the package and a file that shows it is installed.
LLVM_PACKAGES: dict[str, str] = {LLVM_PACKAGE: f"/usr/bin/{LLVM_MCA}"}
ITERATIONS = 100
# Tiny blocks timed as their own loop would have their loop-carried latencies
# amortised over too few instructions to matter; 100 iterations keep the
# pipeline ramp-up under 1% of a block of a few instructions.

# LMUL as the plugin encodes it (LMUL x 8) -> the name llvm-mca's RISC-V instruments use.
LMUL_NAMES = {1: "MF8", 2: "MF4", 4: "MF2", 8: "M1", 16: "M2", 32: "M4", 64: "M8"}
SEWS = (8, 16, 32, 64)


@dataclass(frozen=True)
class VType:
    """SEW in bits and LMUL x 8 (1 = mf8 ... 64 = m8), as in force when a block starts."""

    sew: int
    lmul8: int

    def __post_init__(self) -> None:
        if self.sew not in SEWS or self.lmul8 not in LMUL_NAMES:
            raise ValueError(f"vtype SEW {self.sew}, LMUL x 8 = {self.lmul8}: not a valid RVV vtype")

    def instruments(self) -> list[str]:
        """The comments that tell llvm-mca the vtype of vector instructions before any vset in the block."""
        return [f"# LLVM-MCA-RISCV-LMUL {LMUL_NAMES[self.lmul8]}", f"# LLVM-MCA-RISCV-SEW E{self.sew}"]

    @property
    def label(self) -> str:
        return f"e{self.sew}{LMUL_NAMES[self.lmul8].lower()}"


@dataclass(frozen=True)
class Block:
    """Executed machine code (one translation block) and the vtype at its entry (None: no vset seen yet)."""

    code: bytes
    vtype: VType | None = None


@dataclass(frozen=True)
class Core:
    """One scheduling model: llvm-mca's core name and the attributes of the code it is asked about."""

    cpu: str
    mattr: str

    def key(self) -> str:
        return f"{self.cpu} {self.mattr}"


def mattr_for(march: str) -> str:
    """``rv64gcv_zvl256b`` -> ``+m,+a,+f,+d,+c,+v,+zvl256b`` (llvm-mca's -mattr for code built with that -march)."""
    if not march.startswith("rv64"):
        raise ValueError(f"-march={march}: expected an rv64 string")
    base, *extensions = march[4:].split("_")
    singles = {"g": ["m", "a", "f", "d", "zicsr", "zifencei"]}
    attrs: list[str] = []
    for letter in base:
        for name in singles.get(letter, [letter]):
            if letter != "i" and name not in attrs:
                attrs.append(name)
    attrs += [e for e in extensions if e]
    return ",".join(f"+{a}" for a in attrs)


def instruction_lengths(code: bytes) -> list[int]:
    """The sizes of the instructions in ``code``: 2 bytes for a compressed one, 4 otherwise (low bits 0b11)."""
    sizes = []
    at = 0
    while at < len(code):
        if code[at] & 0b11 != 0b11:
            size = 2
        elif code[at] & 0b11100 != 0b11100:
            size = 4
        else:
            raise ValueError(f"instruction at byte {at} is longer than 32 bits; RV64GCV has none")
        if at + size > len(code):
            raise ValueError(f"code ends inside an instruction at byte {at} ({len(code)} bytes)")
        sizes.append(size)
        at += size
    return sizes


def transfers_control(code: bytes) -> bool:
    """Whether the last instruction of ``code`` may go anywhere but the next one (jump, branch, ecall)."""
    sizes = instruction_lengths(code)
    last = int.from_bytes(code[len(code) - sizes[-1] :], "little")
    if sizes[-1] == 2:
        quadrant, funct3 = last & 3, (last >> 13) & 7
        if quadrant == 1:
            return funct3 in (5, 6, 7)  # c.j, c.beqz, c.bnez
        # c.jr, c.jalr (rs1 != 0) and c.ebreak (rs1 = 0, bit 12 set): funct3 100 with rs2 = 0
        return quadrant == 2 and funct3 == 4 and (last >> 2) & 0x1F == 0 and bool((last >> 7) & 0x1F or last >> 12 & 1)
    return last & 0x7F in (0x63, 0x6F, 0x67, 0x73)


def basic_blocks(profile: Sequence[Mapping]) -> dict[Block, int]:
    """The executions of a region's basic blocks, from the plugin's translation blocks.

    QEMU ends a translation block at every vset*; the plugin counts a block's entries only when it was not
    reached by falling through from the block before it. Each entered block is joined here with the blocks it
    falls through to, up to the first that ends in a jump or branch: that is the code one entry runs.
    """
    by_offset: dict[int, bytes] = {}
    for tb in profile:
        by_offset.setdefault(int(tb["offset"]), bytes.fromhex(tb["code"]))
    runs: dict[Block, int] = {}
    for tb in profile:
        if not tb["entries"]:
            continue
        offset, code = int(tb["offset"]), by_offset[int(tb["offset"])]
        chain = code
        while not transfers_control(code) and offset + len(code) in by_offset:
            offset += len(code)
            code = by_offset[offset]
            chain += code
        for vtype, count in tb["entries"]:
            block = Block(chain, VType(*vtype) if vtype else None)
            runs[block] = runs.get(block, 0) + int(count)
    return runs


def disassemble(code: bytes, mattr: str) -> list[str]:
    """``code`` as assembly text, one instruction per line (llvm-mc's disassembler)."""
    sizes = instruction_lengths(code)
    text = " ".join(f"0x{b:02x}" for b in code)
    proc = subprocess.run(
        [LLVM_MC, "--disassemble", "-triple=riscv64", f"-mattr={mattr}"], input=text, capture_output=True, text=True
    )
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip() and not line.lstrip().startswith(".")]
    if proc.returncode != 0 or len(lines) != len(sizes):
        raise CommandFailed(
            [LLVM_MC, "--disassemble", f"-mattr={mattr}"],
            proc.returncode,
            f"{len(sizes)} instructions in {code.hex()}, {len(lines)} decoded\n{proc.stderr}",
            "check that the block's code came from the kernel library's text",
        )
    return [" ".join(line.split()) for line in lines]


def region_source(regions: Sequence[tuple[str, VType | None, Sequence[str]]]) -> str:
    """One llvm-mca input with a named region per block, each preceded by its entry vtype's instruments."""
    out: list[str] = []
    for name, vtype, asm in regions:
        out.append(f"# LLVM-MCA-BEGIN {name}")
        if vtype is not None:
            out += vtype.instruments()
        out += asm
        out.append(f"# LLVM-MCA-END {name}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class RegionCost:
    name: str
    cycles_per_iteration: float
    instructions: int
    block_rthroughput: float


def mca_report(source: str, core: Core, *options: str) -> dict:
    """llvm-mca's JSON report of ``source`` for ``core`` (``options`` added to its command line)."""
    cmd = [LLVM_MCA, "-mtriple=riscv64", f"-mcpu={core.cpu}", f"-mattr={core.mattr}", "--json", *options]
    proc = subprocess.run(cmd, input=source, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CommandFailed(cmd, proc.returncode, proc.stderr)
    return json.loads(proc.stdout)


def run_mca(source: str, core: Core, iterations: int = ITERATIONS) -> list[RegionCost]:
    """Every region of ``source`` through llvm-mca for ``core``: its steady-state cycles per iteration."""
    # A call's cost is its jump: the callee's instructions are blocks of their own (mca's default charges a call
    # 100 cycles of latency). A fence has no scheduling class in some models: it is timed as free, and is rare.
    report = mca_report(
        source,
        core,
        f"-iterations={iterations}",
        "--call-latency=1",
        "--skip-unsupported-instructions=lack-sched",
        "--resource-pressure=false",
        "--instruction-info=false",
    )
    costs = []
    for region in report["CodeRegions"]:
        summary = region["SummaryView"]
        costs.append(
            RegionCost(
                region.get("Name", ""),
                summary["TotalCycles"] / summary["Iterations"],
                summary["Instructions"] // summary["Iterations"],
                float(summary["BlockRThroughput"]),
            )
        )
    return costs


def llvm_version() -> str:
    try:
        proc = subprocess.run([LLVM_MCA, "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        proc = None
    if proc is None or proc.returncode != 0:
        raise MissingPrerequisite(
            f"{LLVM_MCA} is not installed", f"apt-get install {LLVM_PACKAGE}, or run nox -s setup"
        )
    return next((line.strip() for line in proc.stdout.splitlines() if "version" in line), proc.stdout.strip())


class CostCache:
    """Each block's cycles per iteration on a core, computed once and kept on disk."""

    def __init__(self, folder: Path, version: str | None = None) -> None:
        self.folder = folder
        self.version = version if version is not None else llvm_version()
        folder.mkdir(parents=True, exist_ok=True)

    def _key(self, block: Block, core: Core) -> str:
        what = f"{self.version}\n{core.key()}\n{block.vtype.label if block.vtype else '-'}\n{block.code.hex()}"
        return hashlib.sha256(what.encode()).hexdigest()

    def costs(self, blocks: Iterable[Block], core: Core) -> dict[Block, float]:
        """Cycles per iteration of every block on ``core``; the ones not cached go through llvm-mca at once."""
        wanted = list(dict.fromkeys(blocks))
        found: dict[Block, float] = {}
        missing: list[Block] = []
        for block in wanted:
            path = self.folder / f"{self._key(block, core)}.json"
            try:
                found[block] = float(json.loads(path.read_text())["cycles_per_iteration"])
            except (OSError, ValueError, KeyError):
                missing.append(block)
        if missing:
            regions = [(f"b{i}", b.vtype, disassemble(b.code, core.mattr)) for i, b in enumerate(missing)]
            results = run_mca(region_source(regions), core)
            if len(results) != len(missing):
                raise CommandFailed(
                    [LLVM_MCA, f"-mcpu={core.cpu}"], 0, f"{len(results)} regions reported for {len(missing)} blocks"
                )
            for block, result in zip(missing, results):
                found[block] = result.cycles_per_iteration
                path = self.folder / f"{self._key(block, core)}.json"
                entry = {"cycles_per_iteration": result.cycles_per_iteration, "core": core.key(), "llvm": self.version}
                partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                partial.write_text(json.dumps(entry) + "\n")
                partial.replace(path)  # whole or not at all: two benchmark processes may share the cache
        return found


def estimate(executions: Mapping[Block, int], core: Core, cache: CostCache) -> float:
    """Cycles of a run: the sum over its blocks of (times executed) x (cycles per iteration on ``core``)."""
    costs = cache.costs(executions, core)
    return sum(count * costs[block] for block, count in executions.items())


@functools.cache
def fma_cycles(core: Core) -> float:
    """Cycles per LMUL-1 worth of float32 ``vfmacc.vf`` at the core's best LMUL: the FMA floor's unit.

    From the model's resource tables (block reciprocal throughput of one instruction), per register of work,
    the cheapest of LMUL 1, 2, 4 and 8: a floor no instruction choice can go under.
    """
    best = None
    for lmul8, group in ((8, "v8"), (16, "v8"), (32, "v8"), (64, "v8")):
        vtype = VType(32, lmul8)
        source = "\n".join([*vtype.instruments(), f"vfmacc.vf {group}, fa0, v16"]) + "\n"
        report = mca_report(source, core, "--timeline=false", "--resource-pressure=false", "--instruction-info=false")
        per_register = report["CodeRegions"][0]["SummaryView"]["BlockRThroughput"] / (lmul8 // 8)
        best = per_register if best is None else min(best, per_register)
    return float(best)
