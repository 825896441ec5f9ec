"""Instruction-count benchmarks: the cases, the figures per unit of work, the lower bound, the guard.

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
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import ConfigError, DriverError
from .paths import PROJECT_ROOT
from .vlens import Variant, by_vlen, variants

BENCH_DIR = PROJECT_ROOT / "bench"
GUEST_SCRIPT = BENCH_DIR / "guest.py"
BASELINE_FILE = BENCH_DIR / "baseline.json"
RESULTS_DIR = BENCH_DIR / "results"
# The guard fails when any figure grows by more than this fraction.
TOLERANCE = 0.02
FIGURES = ("raw", "scalar", "vector", "vector_lmul1", "lmul1")

HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
DECODE_SPLITS = 8
NEW_TOKENS = 256
DTYPES = ("bf16", "int8-static", "int8-dynamic")
NATIVE = "torch-sdpa"
# The VLEN of the headline figures: the int8 extend rows, the guard's subset and the README's detail table.
HEADLINE_VLEN = 256
# Where torch's SDPA runs: the sysroot's torch has no vector code, so one VLEN is enough.
NATIVE_VLEN = HEADLINE_VLEN
PORTABLE = "portable"


@dataclass(frozen=True)
class Case:
    op: str  # "decode", "extend" or "varlen"
    dtype: str  # "bf16", "int8-static", "int8-dynamic"
    batch: int = 1  # varlen: images
    seq: int = 0  # decode: tokens in the sequence, the new one included
    prefix: int = 0  # extend: cached tokens before the new ones
    new: int = 0  # extend: new tokens per sequence; varlen: patches per image
    window: int = 0  # decode/extend: sliding_window_size (0: none)
    sinks: bool = False  # decode/extend: attention sinks given
    impl: str = "rvv-attn"  # or NATIVE
    heads: int = HEADS
    heads_kv: int = HEADS_KV
    head_dim: int = HEAD_DIM
    head_dim_v: int = HEAD_DIM
    splits: int = DECODE_SPLITS

    @property
    def id(self) -> str:
        shape = {"decode": f"B={self.batch} seq={self.seq}", "extend": f"B={self.batch} prefix={self.prefix}+{self.new}",
                 "varlen": f"images={self.batch} patches={self.new} H={self.heads} D={self.head_dim}"}[self.op]
        impl = f" {self.impl}" if self.impl != "rvv-attn" else ""
        options = (f" window={self.window}" if self.window else "") + (" sinks" if self.sinks else "")
        return f"{self.op}{impl} {self.dtype} {shape}{options}"

    @property
    def group(self) -> int:
        return self.heads // self.heads_kv

    def pairs_per_sequence(self) -> int:
        """Query-key pairs of one sequence: causal for extend (new token i sees prefix + i + 1 keys), all
        patches x patches for varlen."""
        if self.op == "varlen":
            return self.new * self.new
        return self.new * self.prefix + self.new * (self.new + 1) // 2

    def attended(self) -> int:
        """Decode: the tokens one step attends (the last ``window`` of them with a sliding window)."""
        return min(self.seq, self.window) if self.window else self.seq

    def units(self) -> int:
        if self.op == "decode":
            return self.batch * self.attended() * self.heads_kv
        return self.batch * self.pairs_per_sequence() * self.heads

    @property
    def unit(self) -> str:
        return "KV token x KV head" if self.op == "decode" else "query-key pair x query head"


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


@dataclass(frozen=True)
class Config:
    """One emulated process: a kernel variant at a QEMU VLEN, and the cases it measures."""

    variant: str  # "portable" or "vlen<N>"
    vlen: int  # the QEMU CPU's VLEN
    cases: tuple[Case, ...]

    @property
    def name(self) -> str:
        if all(c.impl == NATIVE for c in self.cases):
            return NATIVE
        return self.variant


def kernel_cases(int8_extend: bool = True) -> list[Case]:
    """Decode in every dtype and shape; extend in bf16 with and without a prefix, int8 (``int8_extend``) without.

    An extend with a 1024-token prefix is the costliest row to emulate (about 5.5 min at VLEN 128, 3 min for
    the portable build: QEMU works element by element), so only bf16 measures it; the int8 caches' extend
    path is measured at prefix 0 (20-40 s a row, so at HEADLINE_VLEN only: the kernel is bf16's, only its
    K/V loads differ), and their long-context cost by the decode rows.
    """
    cases = [Case("decode", dt, batch=b, seq=s) for dt in DTYPES for b in (1, 8) for s in (1024, 4096)]
    cases += [Case("extend", dt, prefix=0, new=NEW_TOKENS) for dt in DTYPES if int8_extend or dt == "bf16"]
    cases.append(Case("extend", "bf16", prefix=1024, new=NEW_TOKENS))
    return cases


def headline_cases() -> list[Case]:
    """The shapes of the headline figures (B=1, seq 4096 decode; prefix 1024 + 256 extend), bf16."""
    return [Case("decode", "bf16", seq=4096), Case("extend", "bf16", prefix=1024, new=NEW_TOKENS)]


def contract_cases() -> list[Case]:
    """SGLang main's options, at HEADLINE_VLEN: a 128-token window over 4096 tokens (beside a plain 128-token
    decode: the window should cost what its tokens cost), an extend with sinks (beside the plain one of
    kernel_cases), and a vision encoder's dense varlen attention. 4 images x 256 patches (ViT at 16x16
    patches) rather than 1024: emulating the 4x larger score tiles would cost ~10 min of the run.
    """
    return [Case("decode", "bf16", seq=4096, window=128), Case("decode", "bf16", seq=128),
            Case("extend", "bf16", prefix=0, new=NEW_TOKENS, sinks=True), vision_case()]


def vision_case(impl: str = "rvv-attn") -> Case:
    return Case("varlen", "bf16", batch=4, new=256, heads=16, heads_kv=16, head_dim=64, head_dim_v=64, impl=impl)


def full_configs() -> list[Config]:
    """Everything `nox -s bench` measures, one emulated process per configuration, in the order they start.

    Emulator CPU per process (README): VLEN 128 ~480 s, VLEN 256 ~400 s, portable ~310 s, SDPA ~150 s,
    VLEN 512 and 1024 ~110 s each; with 2 jobs this order ends in about 14 min.
    """
    native = tuple(Case(**{**asdict(c), "impl": NATIVE}) for c in headline_cases()) + (vision_case(NATIVE),)
    configs = [Config(PORTABLE, NATIVE_VLEN, tuple(kernel_cases(int8_extend=False))),
               Config(f"vlen{NATIVE_VLEN}", NATIVE_VLEN, native)]
    configs += [Config(v.name, v.vlen, tuple(kernel_cases(int8_extend=v.vlen == HEADLINE_VLEN) +
                                             (contract_cases() if v.vlen == HEADLINE_VLEN else [])))
                for v in variants()]
    return configs


def check_configs() -> list[Config]:
    """The guard's subset in `nox -t test`: one decode and one extend shape at VLEN 256."""
    cases = (Case("decode", "bf16", seq=1024), Case("extend", "bf16", prefix=0, new=NEW_TOKENS))
    return [Config(by_vlen(HEADLINE_VLEN).name, HEADLINE_VLEN, cases)]


def row_key(config_name: str, case: Case) -> str:
    return f"{config_name} | {case.id}"


# ---- turning plugin output into figures -----------------------------------------------------------


def parse_regions(text: str) -> dict[int, dict]:
    """The plugin's JSON lines by label; a line reporting an error fails the run."""
    regions = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        data = json.loads(line)
        if "error" in data:
            raise DriverError(f"the insn_count plugin reported: {data['error']} (value {data['value']})",
                             "the guest's marks are out of order; see bench/guest.py")
        regions[int(data["label"])] = data
    return regions


def _totals(counts: dict) -> dict[str, int]:
    vector = counts["vector_arith"] + counts["vector_mem"] + counts["vset"]
    vector_lmul1 = counts["vector_arith_lmul1"] + counts["vector_mem_lmul1"] + counts["vset"]
    return {"raw": counts["scalar"] + vector, "scalar": counts["scalar"], "vector": vector,
            "vector_lmul1": vector_lmul1, "lmul1": counts["scalar"] + vector_lmul1, "vset": counts["vset"]}


def measured_counts(case: Case, region: dict, empty: dict) -> dict[str, int]:
    """Absolute counts of one call: the library's for rvv-attn, the marked region less empty marks for torch."""
    if case.impl == NATIVE:
        whole, overhead = _totals(region["all"]), _totals(empty["all"])
        return {k: whole[k] - overhead[k] for k in whole}
    if region["unknown_vtype"]:
        raise DriverError(f"{case.id}: {region['unknown_vtype']} vector instructions ran before any vset*",
                         "the LMUL weighting would be a guess; check the plugin's vtype tracking")
    return _totals(region["lib"])


@dataclass
class Row:
    config: str
    variant: str
    vlen: int
    case: Case
    counts: dict[str, int]
    per_unit: dict[str, float] = field(default_factory=dict)
    lower_bound: float | None = None

    def __post_init__(self) -> None:
        units = self.case.units()
        self.per_unit = {k: round(v / units, 3) for k, v in self.counts.items()}
        if self.variant != PORTABLE and self.case.impl != NATIVE:
            self.lower_bound = round(lower_bound(self.case, self.vlen), 3)

    @property
    def key(self) -> str:
        return row_key(self.config, self.case)

    def as_json(self) -> dict:
        return {"key": self.key, "config": self.config, "variant": self.variant, "vlen": self.vlen,
                "case": asdict(self.case), "id": self.case.id, "unit": self.case.unit, "units": self.case.units(),
                "counts": self.counts, "per_unit": self.per_unit, "lower_bound": self.lower_bound}


def rows_for(config: Config, regions: dict[int, dict], empty_label: int = 0) -> list[Row]:
    if empty_label not in regions:
        raise DriverError(f"{config.name}: the plugin reported no empty region; the guest did not start measuring")
    rows = []
    for label, case in enumerate(config.cases, 1):
        if label not in regions:
            raise DriverError(f"{config.name}: no count for {case.id} (region {label}); the guest stopped early")
        rows.append(Row(config.name, config.variant, config.vlen, case,
                        measured_counts(case, regions[label], regions[empty_label])))
    return rows


def guest_cases(config: Config) -> list[dict]:
    return [{**asdict(c), "label": i, "id": c.id} for i, c in enumerate(config.cases, 1)]


# ---- running ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Runner:
    """How to start the guest: the plugin QEMU, the plugin, the sysroot and the staged wheel."""

    qemu: Path
    plugin: Path
    sysroot: Path
    stage: Path
    work: Path

    def command(self, config: Config, cases_file: Path, outfile: Path) -> list[str]:
        cpu = Variant(config.vlen).qemu_cpu()
        return [str(self.qemu), "-plugin", f"{self.plugin},outfile={outfile}", "-L", str(self.sysroot),
                "-cpu", cpu, str(self.sysroot / "usr/bin/python3"), str(GUEST_SCRIPT), str(cases_file),
                config.variant]

    def run(self, config: Config, env: dict[str, str], report: Callable[[str], None]) -> tuple[list[Row], float, float]:
        """Run one configuration; (rows, wall seconds, CPU seconds of the emulator)."""
        folder = self.work / config.name
        folder.mkdir(parents=True, exist_ok=True)
        cases_file, outfile, log_file = folder / "cases.json", folder / "regions.jsonl", folder / "guest.log"
        cases_file.write_text(json.dumps(guest_cases(config), indent=1))
        outfile.unlink(missing_ok=True)
        started = time.monotonic()
        cmd = self.command(config, cases_file, outfile)
        with log_file.open("w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    stdin=subprocess.DEVNULL, errors="replace")
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[bench "):
                    report(line.rstrip())
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            tail = "".join(log_file.read_text().splitlines(keepends=True)[-20:])
            raise DriverError(f"{config.name}: the benchmark guest exited with {code}; log {log_file}:\n{tail}")
        rows = rows_for(config, parse_regions(outfile.read_text()))
        return rows, time.monotonic() - started, usage.ru_utime + usage.ru_stime


def run_all(runner: Runner, configs: Sequence[Config], env: dict[str, str], jobs: int,
            report: Callable[[str], None]) -> list[Row]:
    """Run the configurations, ``jobs`` at a time; rows in the order of ``configs``."""
    def one(config: Config) -> list[Row]:
        report(f"{config.name}: {len(config.cases)} cases at VLEN {config.vlen} ...")
        rows, seconds, cpu = runner.run(config, env, report)
        # CPU time too: on a shared machine the wall time says more about the neighbours.
        report(f"{config.name}: done in {seconds:.0f} s ({cpu:.0f} s of CPU)")
        return rows

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, configs))
    return [row for rows in results for row in rows]


# ---- documents, comparison, table, plot ---------------------------------------------------------


def document(rows: Iterable[Row], meta: dict) -> dict:
    return {"meta": meta, "definitions": __doc__.split("\n\n", 1)[1].strip(),
            "rows": [r.as_json() for r in rows]}


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
        for fig in FIGURES:
            before, after = old["per_unit"][fig], row["per_unit"][fig]
            if after > before * (1 + tolerance) and after > before:
                regressions.append(f"{row['key']}: {fig} {before:g} -> {after:g} per unit "
                                   f"(+{_pct(before, after)})")
            elif after < before * (1 - tolerance):
                improvements.append(f"{row['key']}: {fig} {before:g} -> {after:g} per unit ({_pct(before, after)})")
    return regressions, improvements, unmeasured


def _pct(before: float, after: float) -> str:
    if before == 0:
        return "new"
    return f"{(after - before) / before * 100:+.1f}%".lstrip("+") if after < before else \
        f"{(after - before) / before * 100:.1f}%"


def empty_document(meta: dict) -> dict:
    return {"meta": meta, "definitions": __doc__.split("\n\n", 1)[1].strip(), "rows": []}


def load_document(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"no benchmark baseline at {path}",
                          "run `./ci/nox -s bench -- --update-baseline` and commit bench/baseline.json") from err


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def summary_table(doc: dict) -> str:
    """Raw instructions per unit: one row per case, one column per configuration."""
    configs = list(dict.fromkeys(r["config"] for r in doc["rows"] if r["case"]["impl"] != NATIVE))
    by = {(r["id"], r["config"]): r for r in doc["rows"]}
    ids = list(dict.fromkeys(r["id"] for r in doc["rows"]))
    head = ["case (raw instructions per unit)"] + [c if c == PORTABLE else f"VLEN {c[4:]}" for c in configs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case_id in ids:
        native = [r for r in doc["rows"] if r["id"] == case_id and r["case"]["impl"] == NATIVE]
        if native:
            r = native[0]
            cells = [_fmt(r["per_unit"]["raw"]) if c == r["config"] or c == f"vlen{r['vlen']}" else "-"
                     for c in configs]
        else:
            cells = [_fmt(by[(case_id, c)]["per_unit"]["raw"]) if (case_id, c) in by else "-" for c in configs]
        lines.append(f"| {case_id} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(doc: dict, vlen: int | None = None) -> str:
    """Every figure per unit, one row per measured (configuration, case); only ``vlen``'s if given."""
    head = ["configuration", "case", "unit", "raw", "scalar", "vector", "vector (LMUL-1 eq.)",
            "LMUL-1 eq. total", "lower bound", "LMUL-1 eq. / bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["rows"]:
        if vlen is not None and (r["vlen"] != vlen or r["variant"] == PORTABLE):
            continue
        pu, lb = r["per_unit"], r["lower_bound"]
        ratio = f"{pu['lmul1'] / lb:.2f}x" if lb else "-"
        config = r["config"] if r["case"]["impl"] != NATIVE else f"{NATIVE} (VLEN {r['vlen']})"
        lines.append("| " + " | ".join([config, r["id"], r["unit"], _fmt(pu["raw"]), _fmt(pu["scalar"]),
                                         _fmt(pu["vector"]), _fmt(pu["vector_lmul1"]), _fmt(pu["lmul1"]),
                                         _fmt(lb), ratio]) + " |")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    partial = meta.get("partial_update")
    measured = f"Commit {meta.get('commit', '?')}" + (
        f" ({partial['rows']} rows re-measured at {partial['commit']})" if partial else "")
    return "\n\n".join([
        "# rvv-attn instruction counts",
        f"{measured}, {meta.get('qemu', '?')}, one thread, H={HEADS}, H_kv={HEADS_KV}, "
        f"D=Dv={HEAD_DIM}, decode with {DECODE_SPLITS} KV splits, shuffled cache slots. "
        "Figures are instructions per KV token per KV head (decode) or per query-key pair per query head "
        "(extend); rvv-attn's are counted inside its library, torch's SDPA over the whole call.",
        "## Raw instructions per unit", summary_table(doc),
        "## Every figure", doc["definitions"], detail_table(doc),
    ]) + "\n"


def plot(doc: dict, path: Path) -> None:
    """Raw instructions per unit vs VLEN, one line per operator and dtype (headline shapes), bounds dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    headline = {c.id for c in kernel_cases() if (c.op == "decode" and c.batch == 1 and c.seq == 4096)
                or (c.op == "extend" and c.prefix == 1024)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, op in zip(axes, ("decode", "extend")):
        for dtype in DTYPES:
            rows = sorted((r for r in doc["rows"] if r["case"]["op"] == op and r["case"]["dtype"] == dtype
                           and r["id"] in headline and r["variant"] != PORTABLE), key=lambda r: r["vlen"])
            if not rows:
                continue
            line, = ax.plot([r["vlen"] for r in rows], [r["per_unit"]["raw"] for r in rows], "o-",
                            label=f"rvv-attn {dtype}")
            ax.plot([r["vlen"] for r in rows], [r["lower_bound"] for r in rows], "--", color=line.get_color(),
                    label=f"lower bound {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([v.vlen for v in variants()], [str(v.vlen) for v in variants()])
        ax.set_xlabel("VLEN (bits)")
        unit = "per KV token per KV head" if op == "decode" else "per query-key pair per query head"
        ax.set_ylabel(f"instructions {unit}")
        shape = "B=1, 4096 tokens" if op == "decode" else "prefix 1024 + 256 new, causal"
        ax.set_title(f"{op} ({shape})")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not in this run", ha="center", transform=ax.transAxes)
    fig.suptitle("rvv-attn: instructions retired (raw); lower bound in LMUL-1 equivalents, dashed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


README_START = "<!-- bench-table:start -->"
README_END = "<!-- bench-table:end -->"


def readme_section(doc: dict) -> str:
    return "\n\n".join([README_START, summary_table(doc), f"At VLEN {HEADLINE_VLEN}:",
                        detail_table(doc, vlen=HEADLINE_VLEN), README_END])


def update_readme(text: str, doc: dict) -> str:
    """Replace the marked benchmark section of the README with this run's tables."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ConfigError(f"README.md has no {README_START} ... {README_END} section to update")
    return text[:start] + readme_section(doc) + text[end + len(README_END):]


# ---- session plumbing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    update_baseline: bool = False
    jobs: int = 0  # 0: as many as there are cores
    only: tuple[str, ...] = ()  # substrings of row keys; empty: everything


def parse_posargs(args: Sequence[str]) -> Options:
    update, jobs, only = False, 0, ()
    for arg in args:
        if arg == "--update-baseline":
            update = True
        elif arg.startswith("--only="):
            only = tuple(s.strip() for s in arg.split("=", 1)[1].split(",") if s.strip())
            if not only:
                raise ConfigError("--only needs one or more comma-separated parts of row names, e.g. --only=decode")
        elif arg.startswith("--jobs="):
            value = arg.split("=", 1)[1]
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"--jobs must be a positive integer, got {value!r}")
            jobs = int(value)
        else:
            raise ConfigError(f"unknown bench option {arg!r}", "options: --update-baseline, --jobs=N, --only=a,b")
    return Options(update, jobs, only)


def select(configs: Sequence[Config], only: Sequence[str]) -> list[Config]:
    """The configurations and cases whose row key (``"<config> | <case id>"``) contains one of ``only``."""
    if not only:
        return list(configs)
    picked = []
    for config in configs:
        cases = tuple(c for c in config.cases if any(part in row_key(config.name, c) for part in only))
        if cases:
            picked.append(Config(config.variant, config.vlen, cases))
    if not picked:
        raise ConfigError(f"--only={','.join(only)} matches no benchmark row",
                          "row names look like 'vlen256 | decode bf16 B=1 seq=4096'")
    return picked


def merge_into(baseline: dict, run: dict) -> dict:
    """The baseline with the run's rows in place of the rows they measure again (a partial re-run)."""
    fresh = {r["key"]: r for r in run["rows"]}
    unknown = set(fresh) - {r["key"] for r in baseline["rows"]}
    rows = [fresh.get(r["key"], r) for r in baseline["rows"]] + [r for r in run["rows"] if r["key"] in unknown]
    if all(r["key"] in fresh for r in baseline["rows"]):
        return {**baseline, "meta": run["meta"], "rows": rows}  # every row re-measured: the run's own document
    meta = {**baseline["meta"], "partial_update": {k: run["meta"][k] for k in ("commit", "date")} |
            {"rows": len(fresh)}}
    return {**baseline, "meta": meta, "rows": rows}


def run_meta(qemu: Path, seconds: float) -> dict:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True)
        return proc.stdout.strip()

    from .plugin_qemu import qemu_version

    dirty = "+changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return {"commit": git("rev-parse", "--short", "HEAD") + dirty, "qemu": qemu_version(qemu),
            "threads": 1, "wall_seconds": round(seconds), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def write_results(doc: dict, folder: Path) -> list[Path]:
    """bench.json and bench.md; the plot (bench.png) is drawn by ``python -m driver.bench plot`` in a
    Python that has matplotlib (the session's venv, not nox's)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "bench.json", folder / "bench.md"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(markdown(doc))
    return paths


def write_baseline(doc: dict, path: Path = BASELINE_FILE, readme: Path = PROJECT_ROOT / "README.md") -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")
    readme.write_text(update_readme(readme.read_text(), doc))


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "plot":
        raise SystemExit("usage: python -m driver.bench plot <bench.json> <out.png>")
    plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
