"""The table of RVV variants (toolchains/vlens.json) and what follows from each VLEN."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..paths import TOOLCHAINS_DIR

VLENS_FILE = TOOLCHAINS_DIR / "vlens.json"
# QEMU cannot emulate a larger VLEN, and RVV 1.0 requires at least 128 for V.
MIN_VLEN, MAX_VLEN = 128, 1024


@dataclass(frozen=True)
class Variant:
    vlen: int
    board: str = ""
    cycle_model: str = ""  # llvm-mca's -mcpu for this VLEN's cycle estimates

    @property
    def name(self) -> str:
        """Variant id, the same string the C++ namespace and the dispatcher use."""
        return f"vlen{self.vlen}"

    @property
    def march(self) -> str:
        return f"rv64gcv_zvl{self.vlen}b"

    def qemu_cpu(self, agnostic_ones: bool = False) -> str:
        """The ``-cpu`` string for qemu-riscv64.

        ``agnostic_ones`` fills tail and masked-off lanes with all ones
        (what real hardware may do) instead of leaving them undisturbed.
        """
        cpu = f"rv64,v=true,vlen={self.vlen},elen=64,vext_spec=v1.0"
        if agnostic_ones:
            cpu += ",rvv_ta_all_1s=on,rvv_ma_all_1s=on"
        return cpu


def parse_table(text: str) -> tuple[Variant, ...]:
    data = json.loads(text)
    variants = []
    for row in data["vlens"]:
        vlen = int(row["vlen"])
        if vlen & (vlen - 1) or not MIN_VLEN <= vlen <= MAX_VLEN:
            raise ValueError(f"VLEN {vlen} in {VLENS_FILE.name} must be a power of two in [{MIN_VLEN}, {MAX_VLEN}]")
        variants.append(Variant(vlen, row.get("board", ""), row.get("cycle_model", "")))
    if len({v.vlen for v in variants}) != len(variants):
        raise ValueError(f"duplicate VLEN in {VLENS_FILE.name}")
    return tuple(sorted(variants, key=lambda v: v.vlen))


@cache
def variants(path: Path = VLENS_FILE) -> tuple[Variant, ...]:
    return parse_table(path.read_text())


@cache
def agnostic_lane(path: Path = VLENS_FILE) -> tuple[int, ...]:
    """VLENs that CI's emulated job also checks with all-ones agnostic lanes, on every push."""
    lane = tuple(json.loads(path.read_text()).get("agnostic_lane", []))
    known = {v.vlen for v in variants(path)}
    if not set(lane) <= known:
        raise ValueError(f"agnostic_lane {lane} in {path.name} names a VLEN the table does not list")
    return lane


@cache
def agnostic_lane_in_test_tag(path: Path = VLENS_FILE) -> tuple[int, ...]:
    """The agnostic lanes `nox -t test` runs too: a subset of ``agnostic_lane``.

    Each costs one more emulated configuration (VLEN 1024's ~400 s of one core, 128's ~290 s), and `-t test`
    has a time budget; CI runs every lane of ``agnostic_lane``, and `nox -t agnostic` all four VLENs.
    """
    lane = tuple(json.loads(path.read_text()).get("test_agnostic_lane", agnostic_lane(path)))
    if not set(lane) <= set(agnostic_lane(path)):
        raise ValueError(f"test_agnostic_lane {lane} in {path.name} is not a subset of agnostic_lane")
    return lane


def portable_lane(path: Path = VLENS_FILE) -> int:
    """The one VLEN whose emulated test session also runs the portable build.

    The portable build executes no vector instruction, so its results cannot depend on VLEN or on the tail
    policy: one emulated run (the smallest VLEN, undisturbed) covers it on riscv64, as test-host does natively
    and install-test-quick on a CPU without V. The other sessions spend their time on their own RVV variant.
    """
    return min(v.vlen for v in variants(path))


@cache
def variant_independent_lane(path: Path = VLENS_FILE) -> int:
    """The VLEN whose undisturbed configuration of `nox -t test` runs the tests marked variant_independent.

    Those tests cannot reach a kernel (the suite checks it), so one emulated configuration, besides the host,
    covers them; the fastest one (VLEN 256: one RVV build, no portable build, moderate emulation cost) takes them.
    """
    vlen = int(json.loads(path.read_text()).get("variant_independent_lane", min(v.vlen for v in variants(path))))
    if vlen not in {v.vlen for v in variants(path)}:
        raise ValueError(f"variant_independent_lane {vlen} in {path.name} names a VLEN the table does not list")
    return vlen


def by_vlen(vlen: int) -> Variant:
    for v in variants():
        if v.vlen == vlen:
            return v
    known = ", ".join(str(v.vlen) for v in variants())
    raise ValueError(f"VLEN {vlen} is not in {VLENS_FILE.name} (known: {known})")


def parse_vlens_option(value: str, allow_all: bool = True) -> list[int]:
    """A ``--vlens=`` value: VLENs of the table, comma-separated, or ``all``; a ValueError names the known ones."""
    if allow_all and value == "all":
        return [v.vlen for v in variants()]
    return [by_vlen(int(item)).vlen for item in value.split(",") if item]


def github_matrix() -> str:
    """The CI matrix as JSON, so the workflow's VLEN list comes from the same table."""
    rows = [{"vlen": v.vlen, "policy": "undisturbed"} for v in variants()]
    rows += [{"vlen": vlen, "policy": "agnostic"} for vlen in agnostic_lane()]
    return json.dumps({"include": rows})
