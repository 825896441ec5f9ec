"""Running the benchmarks: bench/guest.py under the plugin QEMU, one process per configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import toolchain
from ..errors import DriverError
from ..paths import BUILD_DIR, PROJECT_ROOT, cache_root
from ..proc import log
from ..session import Session
from ..toolchain import build, host_packages
from ..toolchain.guest_commands import staged_guest_env
from ..toolchain.qemu import qemu_version
from ..toolchain.vlens import Variant, by_vlen
from . import cycles, plugin_qemu
from .cases import NATIVE, PORTABLE, Config, check_configs
from .figures import BASELINE_FILE, Row, document, guard, load_document, parse_regions, rows_for
from .render import detail_table

GUEST_SCRIPT = PROJECT_ROOT / "bench" / "guest.py"


def guest_cases(config: Config) -> list[dict]:
    """The guest's input: each case with the label of its plugin region (0 is the empty pair of marks)."""
    return [{**asdict(c), "label": i, "id": c.id} for i, c in enumerate(config.cases, 1)]


@dataclass(frozen=True)
class Runner:
    """How to start the guest: the plugin QEMU, the plugin, the sysroot and the staged wheel."""

    qemu: Path
    plugin: Path
    sysroot: Path
    stage: Path
    work: Path

    def plugin_env(self) -> dict[str, str]:
        """The environment of bench/tests: the plugin QEMU and the plugin they check."""
        return {"RVV_ATTN_PLUGIN_QEMU": str(self.qemu), "RVV_ATTN_INSN_PLUGIN": str(self.plugin)}

    def guest_env(self) -> dict[str, str]:
        return staged_guest_env(self.stage)

    def command(self, config: Config, cases_file: Path, outfile: Path, blocks: Path | None = None) -> list[str]:
        cpu = Variant(config.vlen).qemu_cpu()
        profile = f",blocks={blocks}" if blocks else ""
        return [
            str(self.qemu),
            "-plugin",
            f"{self.plugin},outfile={outfile}{profile}",
            "-L",
            str(self.sysroot),
            "-cpu",
            cpu,
            str(self.sysroot / "usr/bin/python3"),
            str(GUEST_SCRIPT),
            str(cases_file),
            config.variant,
        ]

    def run(self, config: Config, env: dict[str, str], report: Callable[[str], None]) -> tuple[list[Row], float, float]:
        """Run one configuration; (rows, wall seconds, CPU seconds of the emulator)."""
        folder = self.work / config.name
        folder.mkdir(parents=True, exist_ok=True)
        cases_file, outfile, log_file = folder / "cases.json", folder / "regions.jsonl", folder / "guest.log"
        blocks = folder / "blocks.jsonl"
        cases_file.write_text(json.dumps(guest_cases(config), indent=1))
        outfile.unlink(missing_ok=True)
        blocks.unlink(missing_ok=True)
        started = time.monotonic()
        cmd = self.command(config, cases_file, outfile, blocks)
        with log_file.open("w") as log:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                stdin=subprocess.DEVNULL,
                errors="replace",
            )
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
        estimate_cycles(rows, config, blocks.read_text() if blocks.exists() else "", cache_root() / "llvm-mca")
        return rows, time.monotonic() - started, usage.ru_utime + usage.ru_stime


def estimate_cycles(rows: Sequence[Row], config: Config, profile_lines: str, cache_dir: Path) -> None:
    """Each rvv-attn row's cycles on the scheduling model of its VLEN's core, from the block profile.

    The portable build runs at the headline VLEN, so its rows get that VLEN's core too (scalar code on it).
    """
    core_name = by_vlen(config.vlen).cycle_model
    if not core_name:
        return
    march = "rv64gc" if config.variant == PORTABLE else f"rv64gcv_zvl{config.vlen}b"
    core = cycles.Core(core_name, cycles.mattr_for(march))
    profiles = {int(p["label"]): p["blocks"] for p in map(json.loads, profile_lines.splitlines()) if p.get("blocks")}
    cache = cycles.CostCache(cache_dir)
    for label, row in enumerate(rows, 1):
        if row.case.impl == NATIVE:
            continue
        if label not in profiles:
            raise DriverError(f"{config.name}: no block profile for {row.case.id} (region {label})")
        total = cycles.estimate(cycles.basic_blocks(profiles[label]), core, cache)
        floor = row.case.fma_registers_per_unit(config.vlen) * cycles.fma_cycles(core)
        row.set_cycles(core_name, total, floor if config.variant != PORTABLE else None)


def run_all(
    runner: Runner, configs: Sequence[Config], env: dict[str, str], jobs: int, report: Callable[[str], None]
) -> list[Row]:
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


def prepare(session: Session) -> Runner:
    """Toolchain, the riscv64 wheel (staged apart from the test sessions'), the plugin QEMU and the plugin."""
    _pinned_qemu, root = toolchain.ensure()
    stage = build.stage_wheel(toolchain.cross_build(session, root), BUILD_DIR / "stage-bench")
    session.install(*plugin_qemu.BUILD_REQUIREMENTS)
    host_packages.ensure_host_packages(cycles.LLVM_PACKAGES)  # llvm-mca and llvm-mc for the cycle model
    counting = plugin_qemu.ensure_plugin_qemu(Path(session.bin) / "python")
    plugin = plugin_qemu.build_plugin(counting, BUILD_DIR / "bench-plugin")
    log(f"counting with {qemu_version(counting.binary)} and {plugin}")
    return Runner(counting.binary, plugin, root, stage, BUILD_DIR / "bench")


def measure(runner: Runner, configs: Sequence[Config], jobs: int) -> dict:
    """Run ``configs``, ``jobs`` at a time, and return the result document."""
    started = time.monotonic()
    log(f"running {len(configs)} benchmark processes, {jobs} at a time; logs in {runner.work}")
    rows = run_all(runner, configs, runner.guest_env(), jobs, log)
    log(f"{len(rows)} rows in {time.monotonic() - started:.0f} s")
    return document(rows, run_meta(runner.qemu, time.monotonic() - started))


def run_meta(qemu: Path, seconds: float) -> dict:
    """What a result file records beside the figures: commit, QEMU version, threads, wall time, date."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True)
        return proc.stdout.strip()

    dirty = "+changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return {
        "commit": git("rev-parse", "--short", "HEAD") + dirty,
        "qemu": qemu_version(qemu),
        "threads": 1,
        "wall_seconds": round(seconds),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def check(runner: Runner, out: Path) -> None:
    """The guard's subset of `nox -t test`: measure it, write ``out`` (bench.json), print its figures, and fail
    if a figure grew or a row has no baseline."""
    rows = run_all(runner, check_configs(), runner.guest_env(), 1, log)
    doc = document(rows, run_meta(runner.qemu, 0.0))
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(detail_table(doc), file=sys.stderr)
    guard(load_document(BASELINE_FILE), doc, require_every_row=True, report=log)
