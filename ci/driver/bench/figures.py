"""Figures per unit of attention work from the plugin's counts, the lower bound, the guard.

A benchmark run executes bench/guest.py under the plugin-capable QEMU with
the insn_count plugin (bench/plugin/insn_count.c), once per configuration
(the portable build and each VLEN of toolchains/vlens.json, plus one for
torch's own SDPA), and turns the plugin's region counts into figures per unit
of attention work:

- decode: per KV token per KV head, units = B * seq * H_kv (with a sliding
  window W: B * min(seq, W) * H_kv, the tokens attended);
- extend: per query-key pair per query head, units = H * B * sum_i (prefix + i + 1)
  over the new tokens i (causal);
- varlen (flash_attn_varlen_func, dense): per query-key pair per query head,
  units = H * images * patches^2.

Figures of rvv-attn are the instructions executed inside the operator
library's address range; torch's SDPA has no such range, so its figure is
everything between the marks minus an empty pair of marks.

Figures (each per unit): ``raw`` instructions retired; ``scalar``; ``vector``
(arithmetic + loads/stores + vset*); ``vector_lmul1`` (vector in LMUL-1
equivalents: each instruction weighted by its register-group size, vset* 1);
``lmul1`` (scalar + vector_lmul1); ``lower_bound`` (see ``lower_bound``).

``outside_per_call`` (rvv-attn rows): raw instructions the call ran between the marks outside its library
(torch's dispatcher, and libc/libm functions the kernels call), less an empty pair of marks; a figure that
grows with the sequence means per-token work has left the library and is neither counted nor estimated.

``cycles`` (rvv-attn rows): the call's cycles estimated with LLVM's scheduling model of the core of its
VLEN (toolchains/vlens.json ``cycle_model``; ci/driver/bench/cycles.py says what the model leaves out), per unit;
``fma_floor``, the cycles its float32 FMAs alone need on that core at its cheapest LMUL, and the estimate's
ratio to it; ``kv_bytes_per_unit``, the K/V cache bytes the call must read per unit (a memory floor for a
reader who knows a board's bandwidth).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ConfigError, DriverError
from ..paths import PROJECT_ROOT
from .cases import NATIVE, PORTABLE, Case, Config, row_key

BASELINE_FILE = PROJECT_ROOT / "bench" / "baseline.json"
# The guard fails when any figure grows by more than this fraction.
TOLERANCE = 0.02
FIGURES = ("raw", "scalar", "vector", "vector_lmul1", "lmul1")


def _registers(elements: int, element_bits: int, vlen: int) -> float:
    return elements * element_bits / vlen


def _load_and_widen(elements: int, dtype: str, vlen: int) -> float:
    """Load ``elements`` of the storage dtype, then produce them as float32: one per result register."""
    bits = 16 if dtype == "bf16" else 8
    return _registers(elements, bits, vlen) + _registers(elements, 32, vlen)


def lower_bound(case: Case, vlen: int) -> float:
    """LMUL-1-equivalent vector instructions per unit that loads, widening and FMAs alone need.

    With L = VLEN/32 float32 lanes per register, G = H/H_kv, and
    lw(n) = n*bits/VLEN (load n elements of the cache dtype: 16 bits bf16, 8 int8) + n/L (widen to float32):

    - decode, per KV token per KV head: lw(D) + lw(Dv) for the token's K and V rows (loaded once for
      the whole group) + G*(D + Dv)/L FMAs (q.k for each of the G query heads, p*v into each accumulator);
    - extend, per query-key pair per query head: (D + Dv)/L FMAs + each query row's lw(D) spread over
      its pairs + each key's lw(D) + lw(Dv), loaded once per KV head, spread over its G*pairs.

    Softmax, scaling and the final normalisation are left out: the bound is what no kernel can avoid.
    At VLEN 256, bf16, D = Dv = 128, G = 4 this is 176 for decode and 32.07 for extend (prefix 1024 + 256).
    """
    lanes = vlen / 32
    d, dv, g = case.head_dim, case.head_dim_v, case.group
    if case.op == "decode":
        return _load_and_widen(d, case.dtype, vlen) + _load_and_widen(dv, case.dtype, vlen) + g * (d + dv) / lanes
    pairs = case.pairs_per_sequence()
    keys = case.prefix + case.new
    queries = case.new * _load_and_widen(d, "bf16", vlen) / pairs
    kv = keys * (_load_and_widen(d, case.dtype, vlen) + _load_and_widen(dv, case.dtype, vlen)) / (g * pairs)
    return (d + dv) / lanes + queries + kv


# ---- turning plugin output into figures -----------------------------------------------------------


def parse_regions(text: str) -> dict[int, dict]:
    """The plugin's JSON lines by label; a line reporting an error fails the run."""
    regions = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        data = json.loads(line)
        if "error" in data:
            raise DriverError(
                f"the insn_count plugin reported: {data['error']} (value {data['value']})",
                "the guest's marks are out of order; see bench/guest.py",
            )
        regions[int(data["label"])] = data
    return regions


def _totals(counts: dict) -> dict[str, int]:
    vector = counts["vector_arith"] + counts["vector_mem"] + counts["vset"]
    vector_lmul1 = counts["vector_arith_lmul1"] + counts["vector_mem_lmul1"] + counts["vset"]
    return {
        "raw": counts["scalar"] + vector,
        "scalar": counts["scalar"],
        "vector": vector,
        "vector_lmul1": vector_lmul1,
        "lmul1": counts["scalar"] + vector_lmul1,
        "vset": counts["vset"],
    }


def measured_counts(case: Case, region: dict, empty: dict) -> dict[str, int]:
    """Absolute counts of one call: the library's for rvv-attn, the marked region less empty marks for torch."""
    if case.impl == NATIVE:
        whole, overhead = _totals(region["all"]), _totals(empty["all"])
        return {k: whole[k] - overhead[k] for k in whole}
    if region["unknown_vtype"]:
        raise DriverError(
            f"{case.id}: {region['unknown_vtype']} vector instructions ran before any vset*",
            "the LMUL weighting would be a guess; check the plugin's vtype tracking",
        )
    return _totals(region["lib"])


def outside_library(region: dict, empty: dict) -> int:
    """Instructions a call of rvv-attn ran between the marks but outside its library: torch's dispatcher
    and whatever the kernels called in libc or libm (less the marks' own, an empty pair's count)."""
    return _totals(region["all"])["raw"] - _totals(region["lib"])["raw"] - _totals(empty["all"])["raw"]


@dataclass
class Row:
    config: str
    variant: str
    vlen: int
    case: Case
    counts: dict[str, int]
    per_unit: dict[str, float] = field(default_factory=dict)
    lower_bound: float | None = None
    cycles: dict | None = None
    outside_per_call: int | None = None

    def __post_init__(self) -> None:
        units = self.case.units()
        self.per_unit = {k: round(v / units, 3) for k, v in self.counts.items()}
        if self.variant != PORTABLE and self.case.impl != NATIVE:
            self.lower_bound = round(lower_bound(self.case, self.vlen), 3)

    def set_cycles(self, core: str, total: float, floor_per_unit: float | None) -> None:
        """The cycle estimate of the call on ``core`` (see ci/driver/bench/cycles.py) and its FMA floor per unit."""
        per_unit = total / self.case.units()
        self.cycles = {
            "core": core,
            "total": round(total),
            "per_unit": round(per_unit, 3),
            "fma_floor": round(floor_per_unit, 3) if floor_per_unit else None,
            "of_floor": round(per_unit / floor_per_unit, 3) if floor_per_unit else None,
            "kv_bytes_per_unit": round(self.case.kv_bytes_per_unit(), 3),
        }

    @property
    def key(self) -> str:
        return row_key(self.config, self.case)

    def as_json(self) -> dict:
        return {
            "key": self.key,
            "config": self.config,
            "variant": self.variant,
            "vlen": self.vlen,
            "case": asdict(self.case),
            "id": self.case.id,
            "unit": self.case.unit,
            "units": self.case.units(),
            "counts": self.counts,
            "per_unit": self.per_unit,
            "lower_bound": self.lower_bound,
            "cycles": self.cycles,
            "outside_per_call": self.outside_per_call,
        }


def rows_for(config: Config, regions: dict[int, dict], empty_label: int = 0) -> list[Row]:
    if empty_label not in regions:
        raise DriverError(f"{config.name}: the plugin reported no empty region; the guest did not start measuring")
    rows = []
    for label, case in enumerate(config.cases, 1):
        if label not in regions:
            raise DriverError(f"{config.name}: no count for {case.id} (region {label}); the guest stopped early")
        rows.append(
            Row(
                config.name,
                config.variant,
                config.vlen,
                case,
                measured_counts(case, regions[label], regions[empty_label]),
                outside_per_call=None
                if case.impl == NATIVE
                else outside_library(regions[label], regions[empty_label]),  # one call per region
            )
        )
    return rows


# ---- documents and the guard ------------------------------------------------------------------


def document(rows: Iterable[Row], meta: dict) -> dict:
    return {**empty_document(meta), "rows": [r.as_json() for r in rows]}


def compare(baseline: dict, current: dict, tolerance: float = TOLERANCE) -> tuple[list[str], list[str], list[str]]:
    """(regressions, improvements, unmeasured): figures per unit that grew (shrank) by more than
    ``tolerance``, and rows of ``current`` the baseline has no figures for.
    """
    base = {r["key"]: r for r in baseline["rows"]}
    regressions, improvements, unmeasured = [], [], []
    for row in current["rows"]:
        old = base.get(row["key"])
        if old is None:
            unmeasured.append(row["key"])
            continue
        pairs = [(fig, old["per_unit"][fig], row["per_unit"][fig]) for fig in FIGURES]
        # Cycles on the same core, once both sides have them (a baseline from before the cycle model has none).
        if (old.get("cycles") or {}).get("core") and old["cycles"]["core"] == (row.get("cycles") or {}).get("core"):
            pairs.append((f"{old['cycles']['core']} cycles", old["cycles"]["per_unit"], row["cycles"]["per_unit"]))
        # Per call, not per unit: work outside the library should not grow with the sequence at all.
        if old.get("outside_per_call") is not None and row.get("outside_per_call") is not None:
            outside = "instructions outside the library per call"
            pairs.append((outside, old["outside_per_call"], row["outside_per_call"]))
        for fig, before, after in pairs:
            if after > before * (1 + tolerance) and after > before:
                regressions.append(f"{row['key']}: {fig} {before:g} -> {after:g} per unit (+{_pct(before, after)})")
            elif after < before * (1 - tolerance):
                improvements.append(f"{row['key']}: {fig} {before:g} -> {after:g} per unit ({_pct(before, after)})")
    return regressions, improvements, unmeasured


def _pct(before: float, after: float) -> str:
    if before == 0:
        return "new"
    return (
        f"{(after - before) / before * 100:+.1f}%".lstrip("+")
        if after < before
        else f"{(after - before) / before * 100:.1f}%"
    )


def empty_document(meta: dict) -> dict:
    """A result document without rows; ``definitions`` is the text of this module after its first line."""
    return {"meta": meta, "definitions": __doc__.split("\n\n", 1)[1].strip(), "rows": []}


def load_document(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(
            f"no benchmark baseline at {path}",
            "run `./ci/nox -s bench -- --update-baseline` and commit bench/baseline.json",
        ) from err


def merge_into(baseline: dict, run: dict) -> dict:
    """The baseline with the run's rows in place of the rows they measure again (a partial re-run)."""
    fresh = {r["key"]: r for r in run["rows"]}
    unknown = set(fresh) - {r["key"] for r in baseline["rows"]}
    rows = [fresh.get(r["key"], r) for r in baseline["rows"]] + [r for r in run["rows"] if r["key"] in unknown]
    if all(r["key"] in fresh for r in baseline["rows"]):
        return {**baseline, "meta": run["meta"], "rows": rows}  # every row re-measured: the run's own document
    meta = {
        **baseline["meta"],
        "partial_update": {k: run["meta"][k] for k in ("commit", "date")} | {"rows": len(fresh)},
    }
    return {**baseline, "meta": meta, "rows": rows}


def updated_baseline(run: dict, only: Sequence[str], path: Path = BASELINE_FILE) -> dict:
    """The baseline after ``--update-baseline``: the run itself, or with ``--only`` the baseline at ``path``
    (empty if there is none yet) with the run's rows in place of theirs."""
    if not only:
        return run
    base = load_document(path) if path.exists() else empty_document(run["meta"])
    return merge_into(base, run)


def guard(
    baseline: dict,
    current: dict,
    require_every_row: bool,
    report: Callable[[str], None],
    baseline_name: str = BASELINE_FILE.name,
) -> None:
    """Report improvements; fail if a figure grew by more than TOLERANCE, or (``require_every_row``) if a
    row of ``current`` has no baseline figures."""
    regressions, improvements, unmeasured = compare(baseline, current)
    for line in improvements:
        report(f"improved: {line}")
    if unmeasured:
        message = (
            f"{len(unmeasured)} rows have no baseline figures ({', '.join(unmeasured[:4])}"
            f"{', ...' if len(unmeasured) > 4 else ''}); add them with `nox -s bench -- --update-baseline "
            "--only=...`"
        )
        if require_every_row:
            raise ConfigError(message)
        report(message)
    if regressions:
        raise DriverError(
            f"{len(regressions)} figures grew by more than {TOLERANCE:.0%} against "
            f"{baseline_name}:\n  " + "\n  ".join(regressions)
        )
    report(
        f"no figure grew by more than {TOLERANCE:.0%} against {baseline_name} ({len(current['rows'])} rows compared)"
    )
