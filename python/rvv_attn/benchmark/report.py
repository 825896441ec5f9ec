"""Rows of figures, the table (text and Markdown), the JSON document, and the comparison with the cycle model.

A row is one shape at one thread count. Beside the time per call (median and
spread) it has:

- ``ns_per_unit``: median time per unit of work (shapes.py: decode per KV
  token x KV head, extend per query-key pair x query head);
- ``kv_bytes_per_second``: the K/V bytes the call must read (shapes.py) over
  its median time, and ``of_copy_bandwidth``, that rate as a fraction of the
  copy probe's read + write rate at the same thread count (1.0 would be a
  kernel that only streams its cache);
- ``sdpa``: torch's scaled_dot_product_attention over the same K/V, gathered
  from the cache as a plain-torch backend does, and ``sdpa_over_rvv``;
- ``cycle_model`` (single-threaded rows with a clock, when bench/baseline.json
  is given and has the shape): the cycles per unit the scheduling model of
  this VLEN's core estimates (docs/benchmarks.md) next to the measured cycles
  per unit (median time per unit x clock), and measured / estimate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from .shapes import Shape
from .timing import Bandwidth, Spread, bytes_per_second, cycles_per_unit, per_unit_ns

SCHEMA = "rvv-attn-board-benchmark/1"
EMULATED_WARNING = (
    "EMULATED CPU ({reason}): these are the emulator's wall-clock times. They say nothing about how fast a "
    "board is; only the instruction counts of `nox -s bench` are meaningful under emulation."
)


def cycle_estimates(baseline: Mapping, variant: str) -> dict[str, tuple[str, float]]:
    """From a bench/baseline.json document: ``{row name: (core, estimated cycles per unit)}`` of ``variant``'s
    configuration (``vlen256``: the SpacemiT X60 model; ``portable``: scalar code on it)."""
    estimates = {}
    for row in baseline.get("rows", []):
        cycles = row.get("cycles") or {}
        if row.get("config") == variant and cycles.get("per_unit"):
            estimates[row["id"]] = (cycles["core"], float(cycles["per_unit"]))
    return estimates


def cycle_comparison(
    shape: Shape, threads: int, median: float, clock_mhz: float | None, estimates: Mapping[str, tuple[str, float]]
) -> dict | None:
    """Measured cycles per unit beside the model's estimate, for a single-threaded row whose shape has one.

    The model describes one core running one call: a row on more threads divides the same work between
    cores, so it is not compared.
    """
    found = estimates.get(shape.bench_id())
    if threads != 1 or not found or not clock_mhz:
        return None
    core, estimate = found
    measured = cycles_per_unit(median, shape.units(), clock_mhz * 1e6)
    return {
        "bench_id": shape.bench_id(),
        "core": core,
        "estimate_per_unit": estimate,
        "measured_per_unit": round(measured, 3),
        "measured_over_estimate": round(measured / estimate, 4),
    }


def make_row(
    shape: Shape,
    threads: int,
    rvv: Spread,
    sdpa: Spread | None,
    bandwidth: Bandwidth | None,
    clock_mhz: float | None = None,
    estimates: Mapping[str, tuple[str, float]] | None = None,
) -> dict:
    kv_rate = bytes_per_second(shape.kv_bytes_per_call(), rvv.median)
    return {
        "label": shape.label,
        "shape": asdict(shape),
        "heads": asdict(shape.heads),
        "threads": threads,
        "unit": shape.unit,
        "units": shape.units(),
        "kv_bytes_per_call": shape.kv_bytes_per_call(),
        "rvv": rvv.as_json(),
        "ns_per_unit": per_unit_ns(rvv.median, shape.units()),
        "kv_bytes_per_second": kv_rate,
        "of_copy_bandwidth": kv_rate / bandwidth.bytes_per_second if bandwidth else None,
        "sdpa": sdpa.as_json() if sdpa else None,
        "sdpa_over_rvv": sdpa.median / rvv.median if sdpa else None,
        "cycle_model": cycle_comparison(shape, threads, rvv.median, clock_mhz, estimates or {}),
    }


def document(
    environment: Mapping, plan: Mapping, bandwidth: Sequence[Bandwidth], rows: Sequence[dict], seconds: float
) -> dict:
    return {
        "schema": SCHEMA,
        "environment": dict(environment),
        "plan": dict(plan),
        "bandwidth": [b.as_json() for b in bandwidth],
        "rows": list(rows),
        "wall_seconds": round(seconds, 1),
        "definitions": __doc__.split("\n\n", 1)[1].strip(),
    }


def validate(doc: Mapping) -> None:
    """Raise ValueError naming the first thing a result file lacks (for files sent back by board owners)."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not an rvv-attn board benchmark result: schema {doc.get('schema')!r}, not {SCHEMA!r}")
    env = doc.get("environment", {})
    for key in ("version", "torch", "variant", "vlen", "cpu", "clock", "threads", "command", "date"):
        if key not in env:
            raise ValueError(f"the environment has no {key!r}")
    for row in doc.get("rows", []):
        for key in ("label", "threads", "rvv", "ns_per_unit", "kv_bytes_per_second", "unit"):
            if key not in row:
                raise ValueError(f"row {row.get('label', '?')} has no {key!r}")


# ---- rendering --------------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"


def _num(x: float | None, fmt: str = "{:.3g}") -> str:
    """Three significant digits, or whole numbers with separators from 1,000 up (never 1.08e+03)."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if fmt == "{:.3g}" and abs(x) >= 1000 else fmt.format(x)


def _cycles(row: Mapping, key: str) -> str:
    model = row.get("cycle_model")
    if not model:
        return "-"
    return f"{model[key]:.3g}" if key == "measured_over_estimate" else f"{model[key]:,.1f}"


# (header, cell) of the rows' table; the same columns in the text and the Markdown renderings.
COLUMNS: tuple[tuple[str, Callable[[Mapping], str]], ...] = (
    ("shape", lambda r: r["label"]),
    ("thr", lambda r: str(r["threads"])),
    ("median ms", lambda r: _ms(r["rvv"]["median"])),
    ("min..max ms", lambda r: f"{_ms(r['rvv']['min'])}..{_ms(r['rvv']['max'])}"),
    ("ns/unit", lambda r: _num(r["ns_per_unit"])),
    ("K/V GB/s", lambda r: _num(r["kv_bytes_per_second"] / 1e9)),
    ("of copy", lambda r: _num(r["of_copy_bandwidth"], "{:.0%}") if r["of_copy_bandwidth"] is not None else "-"),
    ("SDPA ms", lambda r: _ms((r.get("sdpa") or {}).get("median"))),
    ("SDPA/rvv", lambda r: _num(r.get("sdpa_over_rvv"), "{:.2g}x")),
    ("cyc/unit", lambda r: _cycles(r, "measured_per_unit")),
    ("model", lambda r: _cycles(r, "estimate_per_unit")),
    ("meas/model", lambda r: _cycles(r, "measured_over_estimate")),
)
BANDWIDTH_COLUMNS: tuple[tuple[str, Callable[[Mapping], str]], ...] = (
    ("memory copy (torch copy_)", lambda b: f"{b['buffer_bytes'] // 2**20} MiB buffer"),
    ("thr", lambda b: str(b["threads"])),
    ("median ms", lambda b: _ms(b["time"]["median"])),
    ("min..max ms", lambda b: f"{_ms(b['time']['min'])}..{_ms(b['time']['max'])}"),
    ("GB/s (read + write)", lambda b: _num(b["bytes_per_second"] / 1e9)),
)


def _text_table(columns, records) -> list[str]:
    cells = [[h for h, _ in columns]] + [[cell(r) for _, cell in columns] for r in records]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip()

    return [line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])]


def _markdown_table(columns, records) -> list[str]:
    head = [h for h, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in records]


def header_lines(doc: Mapping) -> list[str]:
    env = doc["environment"]
    clock = env.get("cycle_clock_mhz")
    lines = [
        f"rvv-attn {env['version']} board benchmark ({doc['plan']['name']}), {env['date']}",
        f"  kernels: variant {env['variant']} (CPU VLEN {env['vlen']}); torch {env['torch']}; python {env['python']}",
        f"  CPU: {env['cpu_name']}; {env['machine']['cpu_count']} CPUs, affinity {env['threads']['affinity_text']}",
        f"  clock: {env['clock'] or 'not reported'}; cycles use {f'{clock:g} MHz' if clock else 'no clock'}"
        f" ({env['cycle_clock_source']})",
        f"  threads timed: {', '.join(map(str, doc['plan']['threads']))}; thread env: {env['threads']['env'] or '-'}",
        f"  command: {env['command']}",
    ]
    if env.get("emulated"):
        lines = ["", "!" * 100, EMULATED_WARNING.format(reason=env["emulated"]), "!" * 100, "", *lines]
    return lines


def footer_lines(doc: Mapping) -> list[str]:
    lines = [
        "units: decode per KV token x KV head, extend per query-key pair x query head (docs/benchmarks.md); "
        "median ms = time per call; K/V GB/s = the K/V bytes the call must read / median time; of copy = that, "
        "as a fraction of the copy probe's read + write rate at the same threads; SDPA = torch's "
        "scaled_dot_product_attention over the same K/V gathered from the cache; cyc/unit = median time per unit "
        "x clock, beside the cycle model's estimate (1 thread; bench/baseline.json)",
        f"{len(doc['rows'])} rows in {doc['wall_seconds']:g} s",
    ]
    if doc["environment"].get("emulated"):
        lines.append(EMULATED_WARNING.format(reason=doc["environment"]["emulated"]))
    return lines


def text_report(doc: Mapping) -> str:
    lines = header_lines(doc) + [""]
    lines += _text_table(BANDWIDTH_COLUMNS, doc["bandwidth"]) + [""]
    lines += _text_table(COLUMNS, doc["rows"]) + [""]
    return "\n".join(lines + footer_lines(doc)) + "\n"


def markdown_report(doc: Mapping) -> str:
    """For a GitHub step summary or an issue: the header as a list, then both tables."""
    env = doc["environment"]
    lines = ["## rvv-attn board benchmark", ""]
    if env.get("emulated"):
        lines += [f"> **{EMULATED_WARNING.format(reason=env['emulated'])}**", ""]
    lines += [f"- {line.strip()}" for line in header_lines({**doc, "environment": {**env, "emulated": None}})]
    lines += [""] + _markdown_table(BANDWIDTH_COLUMNS, doc["bandwidth"]) + [""]
    lines += _markdown_table(COLUMNS, doc["rows"]) + [""] + footer_lines(doc)[:1]
    return "\n".join(lines) + "\n"


def write_json(doc: Mapping, path: Path) -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")


def plot(doc: Mapping, path: Path) -> bool:
    """ns per unit against context for each decode series at one thread, rvv-attn solid and SDPA dashed; False
    when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict[str, list[tuple[int, float, float | None]]] = {}
    for row in doc["rows"]:
        s = row["shape"]
        if row["threads"] != 1 or s["op"] != "decode" or s["window"]:
            continue
        name = f"{s['model']} {s['dtype']}"
        sdpa = row["sdpa"]["median"] / row["units"] * 1e9 if row.get("sdpa") else None
        series.setdefault(name, []).append((s["seq"], row["ns_per_unit"], sdpa))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, points in sorted(series.items()):
        points.sort()
        contexts = [p[0] for p in points]
        (line,) = ax.plot(contexts, [p[1] for p in points], marker="o", label=f"rvv-attn {name}")
        if all(p[2] is not None for p in points):
            ax.plot(contexts, [p[2] for p in points], ls="--", color=line.get_color(), label=f"SDPA {name}")
    env = doc["environment"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ns per KV token x KV head (1 thread)")
    title = f"decode, {env['cpu_name'][:60]}, {env['variant']}"
    ax.set_title(title + (" (EMULATED)" if env.get("emulated") else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
