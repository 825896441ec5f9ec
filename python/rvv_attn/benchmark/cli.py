"""The command line: ``python -m rvv_attn.benchmark [--quick | --smoke] [--json PATH] [--plot PATH]``."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from .. import runtime_info
from . import machine, report, shapes
from .calls import make_calls
from .timing import Bandwidth, copy_bandwidth, spread, time_calls


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rvv_attn.benchmark",
        description="Time rvv-attn's operators and torch's SDPA by wall clock on this machine, at each thread "
        "count, beside its copy bandwidth (docs/board.md).",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="plan", const="quick", help="about a minute on a K1")
    size.add_argument(
        "--smoke", action="store_const", dest="plan", const="smoke", help="tiny shapes, for tests (seconds)"
    )
    p.set_defaults(plan="full")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every figure and the environment here")
    p.add_argument("--plot", type=Path, metavar="PATH", help="a PNG of decode time per unit (needs matplotlib)")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="append the tables as Markdown (a step summary)")
    p.add_argument(
        "--threads", type=_int_list, metavar="N,N", help="thread counts (default: 1, 2, 4, ... up to the CPUs)"
    )
    p.add_argument("--only", metavar="TEXT", help="only the shapes whose label contains TEXT, e.g. 'decode bf16'")
    p.add_argument("--no-sdpa", action="store_true", help="skip torch's SDPA beside each row")
    p.add_argument(
        "--cycle-model",
        type=Path,
        metavar="BASELINE",
        help="bench/baseline.json of the source tree: put the cycle model's estimate beside measured cycles",
    )
    p.add_argument("--clock-mhz", type=float, help="the core clock for measured cycles (default: cpufreq's maximum)")
    p.add_argument("--bandwidth-mib", type=int, help="the copy probe's buffer (default: the plan's, 8-512 MiB)")
    args = p.parse_args(argv)
    if args.bandwidth_mib is not None and args.bandwidth_mib < 1:
        p.error("--bandwidth-mib must be at least 1")
    if args.clock_mhz is not None and args.clock_mhz <= 0:
        p.error("--clock-mhz must be positive, e.g. 1600 for a K1 at 1.6 GHz")
    return args


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give thread counts >= 1, e.g. 1,4,8")
    return values


def environment(args: argparse.Namespace, argv: Sequence[str], clock_mhz: float | None, source: str) -> dict:
    """What the run records beside its figures: package, torch, variant, VLEN, CPU, clock, threads, command, date."""
    info = runtime_info()
    desc = machine.describe()
    cpus = desc["affinity"]
    return {
        "version": info["version"],
        "torch": info["torch"],
        "variant": info["active_variant"],
        "vlen": info["cpu_vlen"],
        "runtime_info": info,
        "cpu": desc["cpu"],
        "cpu_name": machine.cpu_name(desc),
        "clock": desc["clock"],
        "cycle_clock_mhz": clock_mhz,
        "cycle_clock_source": source,
        "threads": {
            "torch_default": torch.get_num_threads(),
            "affinity": cpus,
            "affinity_text": _ranges(cpus) if cpus else "unknown",
            "env": desc["thread_env"],
        },
        "machine": {k: desc[k] for k in ("machine", "kernel", "cpu_count")},
        "emulated": desc["emulated"],
        "python": sys.version.split()[0],
        "command": shlex.join(["python", "-m", "rvv_attn.benchmark", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def _ranges(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6'."""
    parts, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(f"{start}-{c}" if c != start else str(c))
            start = None
    return ",".join(parts)


def run(plan: shapes.Plan, sdpa: bool, clock_mhz: float | None, estimates: dict, progress) -> tuple[list, list]:
    """Time every shape at every thread count; (bandwidth probes, rows)."""
    threads_before = torch.get_num_threads()
    probes: dict[int, Bandwidth] = {}
    rows = []
    try:
        for n in plan.threads:
            torch.set_num_threads(n)
            probes[n] = copy_bandwidth(plan.bandwidth_mib * 2**20, n, plan.min_calls, plan.min_seconds, plan.max_calls)
            progress(f"copy {plan.bandwidth_mib} MiB, {n} threads: {probes[n].bytes_per_second / 1e9:.3g} GB/s")
        for shape in plan.shapes:
            calls = make_calls(shape)
            for n in plan.threads:
                torch.set_num_threads(n)
                timed = [time_calls(calls.rvv, plan.min_calls, plan.min_seconds, plan.max_calls)]
                if sdpa:
                    timed.append(time_calls(calls.sdpa, plan.min_calls, plan.min_seconds, plan.max_calls))
                spreads = [spread(t) for t in timed] + [None]
                row = report.make_row(shape, n, spreads[0], spreads[1], probes[n], clock_mhz, estimates)
                rows.append(row)
                progress(f"{shape.label}, {n} threads: {row['rvv']['median'] * 1e3:,.1f} ms")
            del calls  # the next shape's caches may be as large
    finally:
        torch.set_num_threads(threads_before)
    return list(probes.values()), rows


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    plan = shapes.plan(args.plan, machine.usable_cpus())
    if args.threads:
        plan = shapes.with_threads(plan, args.threads)
    if args.bandwidth_mib:
        plan = replace(plan, bandwidth_mib=args.bandwidth_mib)
    if args.only:
        plan = replace(plan, shapes=tuple(s for s in plan.shapes if args.only in s.label))
        if not plan.shapes:
            print(f"--only={args.only!r} matches no shape; labels look like 'llama3-8b decode bf16 ctx=4096'")
            return 2
    clock_mhz, source = machine.cycle_clock_mhz(machine.clock_info(), args.clock_mhz)
    env = environment(args, argv, clock_mhz, source)
    estimates = {}
    if args.cycle_model:
        try:
            estimates = report.cycle_estimates(json.loads(args.cycle_model.read_text()), env["variant"])
        except (OSError, ValueError) as err:
            print(f"--cycle-model {args.cycle_model}: {err}; give the source tree's bench/baseline.json")
            return 2
        # The estimates model riscv64 cores: another machine's cycles, or an emulator's, are not comparable.
        if env["emulated"] or env["machine"]["machine"] != "riscv64":
            estimates = {}
            env["cycle_model"] = "not compared: not a riscv64 board"
        else:
            env["cycle_model"] = f"{args.cycle_model} ({len(estimates)} rows of {env['variant']})"
    if env["emulated"]:
        print(report.EMULATED_WARNING.format(reason=env["emulated"]), flush=True)
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    probes, rows = run(plan, not args.no_sdpa, clock_mhz, estimates, progress)
    plan_record = {
        "name": plan.name,
        "threads": list(plan.threads),
        "bandwidth_mib": plan.bandwidth_mib,
        "min_calls": plan.min_calls,
        "min_seconds": plan.min_seconds,
        "max_calls": plan.max_calls,
        "sdpa": not args.no_sdpa,
    }
    doc = report.document(env, plan_record, probes, rows, time.monotonic() - started)
    print(report.text_report(doc), end="", flush=True)
    if args.json:
        report.write_json(doc, args.json)
        print(f"wrote {args.json}")
    if args.markdown:
        with args.markdown.open("a") as f:
            f.write(report.markdown_report(doc))
    if args.plot:
        if report.plot(doc, args.plot):
            print(f"wrote {args.plot}")
        else:
            print(f"--plot {args.plot}: matplotlib is not importable here; no plot written (pip install matplotlib)")
    return 0
