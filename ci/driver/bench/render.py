"""Rendering result documents: markdown tables, the plot, and the tables of docs/benchmarks.md.

The checked-in results are ``bench/baseline.json`` (every count, with the
commit and QEMU version that measured it) and its renderings, which the docs
show: ``bench/results/bench.md`` (every figure of every configuration) and
``bench/results/bench.png`` (the plot). A run that does not update the
baseline writes its own bench.json, bench.md and bench.png under
build/results/bench/.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from ..paths import PROJECT_ROOT
from ..proc import log
from ..session import Session
from ..toolchain.vlens import variants
from .cases import DECODE_SPLITS, DTYPES, HEAD_DIM, HEADLINE_VLEN, HEADS, HEADS_KV, NATIVE, PORTABLE, kernel_cases
from .figures import BASELINE_FILE

# The baseline's renderings, committed because the docs link and embed them.
BASELINE_RENDERINGS = PROJECT_ROOT / "bench" / "results"
DOCS_PAGE = PROJECT_ROOT / "docs" / "benchmarks.md"
TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"
PLOT_NAME = "bench.png"


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def summary_table(doc: dict) -> str:
    """Raw instructions per unit: one row per case, one column per configuration."""
    configs = list(dict.fromkeys(r["config"] for r in doc["rows"] if r["case"]["impl"] != NATIVE))
    by = {(r["id"], r["config"]): r for r in doc["rows"]}
    ids = list(dict.fromkeys(r["id"] for r in doc["rows"]))
    head = ["case (raw instructions per unit)"] + [c if c == PORTABLE else f"VLEN {c[4:]}" for c in configs]
    rows = []
    for case_id in ids:
        native = [r for r in doc["rows"] if r["id"] == case_id and r["case"]["impl"] == NATIVE]
        if native:
            r = native[0]
            cells = [
                _fmt(r["per_unit"]["raw"]) if c == r["config"] or c == f"vlen{r['vlen']}" else "-" for c in configs
            ]
        else:
            cells = [_fmt(by[(case_id, c)]["per_unit"]["raw"]) if (case_id, c) in by else "-" for c in configs]
        rows.append([case_id, *cells])
    return "\n".join(_table(head, rows))


def detail_table(doc: dict, vlen: int | None = None) -> str:
    """Every figure per unit, one row per measured (configuration, case); only ``vlen``'s if given."""
    head = [
        "configuration",
        "case",
        "unit",
        "raw",
        "scalar",
        "vector",
        "vector (LMUL-1 eq.)",
        "LMUL-1 eq. total",
        "lower bound",
        "LMUL-1 eq. / bound",
        "cycles (core)",
        "FMA floor",
        "cycles / floor",
        "KV bytes",
        "outside the library per call",
    ]
    rows = []
    for r in doc["rows"]:
        if vlen is not None and (r["vlen"] != vlen or r["variant"] == PORTABLE):
            continue
        pu, lb = r["per_unit"], r["lower_bound"]
        ratio = f"{pu['lmul1'] / lb:.2f}x" if lb else "-"
        config = r["config"] if r["case"]["impl"] != NATIVE else f"{NATIVE} (VLEN {r['vlen']})"
        rows.append(
            [
                config,
                r["id"],
                r["unit"],
                _fmt(pu["raw"]),
                _fmt(pu["scalar"]),
                _fmt(pu["vector"]),
                _fmt(pu["vector_lmul1"]),
                _fmt(pu["lmul1"]),
                _fmt(lb),
                ratio,
                *_cycle_cells(r.get("cycles")),
                _fmt(r.get("outside_per_call")),
            ]
        )
    return "\n".join(_table(head, rows))


def _cycle_cells(cycles: dict | None) -> list[str]:
    if not cycles:
        return ["-", "-", "-", "-"]
    ratio = f"{cycles['of_floor']:.2f}x" if cycles.get("of_floor") else "-"
    return [
        f"{_fmt(cycles['per_unit'])} ({cycles['core']})",
        _fmt(cycles.get("fma_floor")),
        ratio,
        _fmt(cycles.get("kv_bytes_per_unit")),
    ]


def cycles_table(doc: dict) -> str:
    """Estimated cycles per unit: one row per case, one column per configuration (each on its VLEN's core)."""
    rows_with = [r for r in doc["rows"] if r.get("cycles")]
    configs = list(dict.fromkeys(r["config"] for r in rows_with))
    by = {(r["id"], r["config"]): r["cycles"] for r in rows_with}
    cores = {r["config"]: r["cycles"]["core"] for r in rows_with}
    head = ["case (estimated cycles per unit)"] + [
        f"{c if c == PORTABLE else 'VLEN ' + c[4:]} ({cores[c]})" for c in configs
    ]
    ids = list(dict.fromkeys(r["id"] for r in rows_with))
    rows = [[i, *(_fmt(by[(i, c)]["per_unit"]) if (i, c) in by else "-" for c in configs)] for i in ids]
    return "\n".join(_table(head, rows))


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    partial = meta.get("partial_update")
    measured = f"Commit {meta.get('commit', '?')}" + (
        f" ({partial['rows']} rows re-measured at {partial['commit']})" if partial else ""
    )
    return (
        "\n\n".join(
            [
                "# rvv-attn instruction counts",
                f"{measured}, {meta.get('qemu', '?')}, one thread, H={HEADS}, H_kv={HEADS_KV}, "
                f"D=Dv={HEAD_DIM}, decode with {DECODE_SPLITS} KV splits, shuffled cache slots. "
                "Figures are instructions per KV token per KV head (decode) or per query-key pair per query head "
                "(extend); rvv-attn's are counted inside its library, torch's SDPA over the whole call.",
                "## Raw instructions per unit",
                summary_table(doc),
                "## Estimated cycles per unit",
                cycles_table(doc) if any(r.get("cycles") for r in doc["rows"]) else "(no cycle estimates in this run)",
                "## Every figure",
                doc["definitions"],
                detail_table(doc),
            ]
        )
        + "\n"
    )


def _headline_rows(doc: dict, op: str, dtype: str) -> list[dict]:
    headline = {
        c.id
        for c in kernel_cases()
        if (c.op == "decode" and c.batch == 1 and c.seq == 4096) or (c.op == "extend" and c.prefix == 1024)
    }
    return sorted(
        (
            r
            for r in doc["rows"]
            if r["case"]["op"] == op
            and r["case"]["dtype"] == dtype
            and r["id"] in headline
            and r["variant"] != PORTABLE
        ),
        key=lambda r: r["vlen"],
    )


def plot(doc: dict, path: Path) -> None:
    """Per unit vs VLEN, one line per operator and dtype (headline shapes): raw instructions with their
    bound dashed (top), estimated cycles on each VLEN's core with the FMA floor dotted (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(11, 8.5))
    for column, op in enumerate(("decode", "extend")):
        unit = "per KV token per KV head" if op == "decode" else "per query-key pair per query head"
        shape = "B=1, 4096 tokens" if op == "decode" else "prefix 1024 + 256 new, causal"
        for kind, ax in zip(("instructions", "cycles"), grid[:, column]):
            for dtype in DTYPES:
                rows = _headline_rows(doc, op, dtype)
                if kind == "cycles":
                    rows = [r for r in rows if r.get("cycles")]
                if not rows:
                    continue
                x = [r["vlen"] for r in rows]
                if kind == "instructions":
                    measured, bound, style = (
                        [r["per_unit"]["raw"] for r in rows],
                        [r["lower_bound"] for r in rows],
                        "--",
                    )
                    bound_label = f"lower bound {dtype}"
                else:
                    measured = [r["cycles"]["per_unit"] for r in rows]
                    bound, style, bound_label = [r["cycles"]["fma_floor"] for r in rows], ":", f"FMA floor {dtype}"
                (line,) = ax.plot(x, measured, "o-", label=f"rvv-attn {dtype}")
                ax.plot(x, bound, style, color=line.get_color(), label=bound_label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks([v.vlen for v in variants()], [str(v.vlen) for v in variants()])
            ax.set_xlabel("VLEN (bits)" if kind == "instructions" else "VLEN (bits); each on its core model")
            ax.set_ylabel(f"{'instructions' if kind == 'instructions' else 'estimated cycles'} {unit}")
            ax.set_title(f"{op} ({shape}): {kind}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "not in this run", ha="center", transform=ax.transAxes)
    cores = ", ".join(f"{v.vlen}: {core}" for v in variants() if (core := _core_of(doc, v.vlen)) is not None)
    fig.suptitle(
        "rvv-attn: instructions retired (raw; bound in LMUL-1 equivalents, dashed)\n"
        f"and cycles estimated by llvm-mca ({cores or 'no estimates in this run'}; FMA floor dotted)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _core_of(doc: dict, vlen: int) -> str | None:
    for r in doc["rows"]:
        if r["vlen"] == vlen and r["variant"] != PORTABLE and r.get("cycles"):
            return r["cycles"]["core"]
    return None


def docs_section(doc: dict) -> str:
    return "\n\n".join(
        [TABLE_START, summary_table(doc), f"At VLEN {HEADLINE_VLEN}:", detail_table(doc, vlen=HEADLINE_VLEN), TABLE_END]
    )


def update_docs_tables(text: str, doc: dict, page: str = "docs/benchmarks.md") -> str:
    """Replace the marked benchmark section of the docs page ``text`` with this run's tables."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ConfigError(
            f"{page} has no {TABLE_START} ... {TABLE_END} section to update",
            "put the two markers back around the tables; the update replaces what is between them",
        )
    return text[:start] + docs_section(doc) + text[end + len(TABLE_END) :]


def write_results(doc: dict, folder: Path) -> list[Path]:
    """bench.json and bench.md; the plot (bench.png) is drawn by ``python -m driver.bench plot`` in a
    Python that has matplotlib (the session's venv, not nox's)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "bench.json", folder / "bench.md"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(markdown(doc))
    return paths


def write_baseline(
    doc: dict, path: Path = BASELINE_FILE, renderings: Path = BASELINE_RENDERINGS, page: Path = DOCS_PAGE
) -> list[Path]:
    """``doc`` becomes the baseline: bench/baseline.json, its bench.md and the docs page's tables.

    The page is read first, so a page without the markers fails before anything is written. The plot is
    the caller's (``python -m driver.bench plot``, into ``renderings / PLOT_NAME``).
    """
    try:
        text = update_docs_tables(page.read_text(), doc, page.name)
    except FileNotFoundError as err:
        raise ConfigError(
            f"no {page} to update the benchmark tables of",
            "the tables live between the bench-table markers of docs/benchmarks.md",
        ) from err
    path.write_text(json.dumps(doc, indent=1) + "\n")
    renderings.mkdir(parents=True, exist_ok=True)
    (renderings / "bench.md").write_text(markdown(doc))
    page.write_text(text)
    return [path, renderings / "bench.md", page]


def plot_in_session(session: Session, document: Path, out: Path) -> None:
    """Draw the plot of ``document`` with the session's Python (it has matplotlib; the driver's may not)."""
    session.run(
        "python",
        "-m",
        "driver.bench",
        "plot",
        str(document),
        str(out),
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def write_run(session: Session, doc: dict, folder: Path) -> None:
    """A run's bench.json, bench.md and bench.png in ``folder``."""
    paths = write_results(doc, folder)
    plot_in_session(session, paths[0], folder / PLOT_NAME)
    log("wrote " + ", ".join(str(p) for p in paths) + f" and {PLOT_NAME}")


def update_baseline(session: Session, doc: dict) -> None:
    """``doc`` becomes the baseline: write_baseline, then the plot beside bench.md."""
    written = write_baseline(doc)
    plot_in_session(session, written[0], BASELINE_RENDERINGS / PLOT_NAME)
    log(
        f"baseline written: {', '.join(str(p.relative_to(PROJECT_ROOT)) for p in written)} and "
        f"bench/results/{PLOT_NAME}; commit them with the change that explains them"
    )
