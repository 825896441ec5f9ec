"""The board benchmark (``python -m rvv_attn.benchmark``): its arithmetic, the machine facts, the report, a run.

The arithmetic and rendering tests run no kernel (variant_independent); the
calls are checked against torch's SDPA, which the benchmark times beside
them, and the smoke plan runs end to end in this process.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rvv_attn.benchmark import calls, cli, machine, report, shapes, timing

BASELINE = Path(__file__).resolve().parents[1] / "bench" / "baseline.json"

K1_ISA = (
    "rv64imafdcv_zicbom_zicboz_zicntr_zicond_zicsr_zifencei_zihintpause_zihpm_zfh_zfhmin_zca_zcd_zba_zbb_zbc_zbs"
    "_zkt_zve32f_zve32x_zve64d_zve64f_zve64x_zvfh_zvfhmin_zvkt_sscofpmf_sstc_svinval_svnapot_svpbmt"
)
# A Banana Pi BPI-F3's /proc/cpuinfo (first two processors).
K1_CPUINFO = f"""processor\t: 0
hart\t\t: 0
model name\t: Spacemit(R) X60
isa\t\t: {K1_ISA}
mmu\t\t: sv39
uarch\t\t: spacemit,x60
mvendorid\t: 0x710
marchid\t\t: 0x8000000058000001
mimpid\t\t: 0x1000000049772200

processor\t: 1
hart\t\t: 1
model name\t: Spacemit(R) X60
uarch\t\t: spacemit,x60
"""
# What qemu-riscv64's user mode writes for /proc/cpuinfo: 10.0.13 (the pinned one), and before uarch was added.
QEMU_CPUINFO = "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdcv_zicsr\nmmu\t\t: sv48\nuarch\t\t: qemu\n\n"
OLDER_QEMU_CPUINFO = "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdcv_zicsr\nmmu\t\t: sv48\n\n"


def _spread(median: float, low: float | None = None, high: float | None = None) -> timing.Spread:
    return timing.Spread(5, median, median, median, low or median, high or median)


# ---- shapes: work, bytes, names ----------------------------------------------------------------------------


@pytest.mark.variant_independent
def test_thread_counts_double_up_to_the_cpu_count():
    assert shapes.thread_counts(8) == [1, 2, 4, 8]
    assert shapes.thread_counts(6) == [1, 2, 4, 6]
    assert shapes.thread_counts(1) == [1]
    assert shapes.plan("quick", 8).threads == (1, 8) and shapes.plan("quick", 1).threads == (1,)
    assert shapes.plan("full", 8).threads == (1, 2, 4, 8)


@pytest.mark.variant_independent
def test_units_and_kv_bytes_follow_the_shapes():
    llama = shapes.Shape("llama3-8b", "decode", "bf16", seq=4096)
    assert llama.units() == 4096 * 8
    assert llama.kv_bytes_per_call() == 4096 * 8 * (128 + 128) * 2
    windowed = shapes.Shape("llama3-8b", "decode", "bf16", seq=4096, window=128)
    assert windowed.units() == 128 * 8 and windowed.kv_bytes_per_call() == 128 * 8 * 512
    # MLA: one latent head; the K row (576 bf16) holds V, so it is read once.
    mla = shapes.Shape("deepseek-v2-lite", "decode", "bf16", seq=4096)
    assert mla.units() == 4096 and mla.kv_bytes_per_call() == 4096 * 576 * 2
    assert shapes.Shape("llama3-8b", "decode", "int8-dynamic", seq=10).kv_row_bytes() == 256 + 8
    assert shapes.Shape("qwen2.5-7b", "decode", "int8-static", seq=10).kv_bytes_per_call() == 10 * 4 * 256
    extend = shapes.Shape("llama3-8b", "extend", "bf16", prefix=1024, new=256)
    assert extend.units() == 32 * (256 * 1024 + 256 * 257 // 2)
    assert extend.kv_bytes_per_call() == 1280 * 8 * 512
    with pytest.raises(ValueError, match="unknown model"):
        shapes.Shape("gpt-5", "decode", "bf16", seq=1)


@pytest.mark.variant_independent
def test_bench_ids_name_the_same_shapes_as_the_cycle_model_baseline():
    """The cycle comparison looks rows up by name in bench/baseline.json: each name found there must describe
    the same shape, and the quick plan must reach the rows measured for it."""
    rows = {r["id"]: r["case"] for r in json.loads(BASELINE.read_text())["rows"] if r["config"] == "vlen256"}
    found = []
    for shape in shapes.quick_shapes() + shapes.full_shapes():
        case = rows.get(shape.bench_id())
        if case is None:
            continue
        found.append(shape.bench_id())
        h = shape.heads
        mine = (shape.op, shape.dtype, shape.batch, shape.window, h.heads, h.heads_kv, h.head_dim, h.head_dim_v)
        theirs = tuple(case[k] for k in ("op", "dtype", "batch", "window", "heads", "heads_kv", "head_dim"))
        assert mine == (*theirs, case["head_dim_v"]), shape.label
        assert case.get("v_in_k", False) == h.v_in_k
        assert (case["seq"], case["prefix"], case["new"]) == (
            (shape.seq, 0, 0) if shape.op == "decode" else (0, shape.prefix, shape.new)
        )
    quick = {s.bench_id() for s in shapes.quick_shapes()}
    assert {
        "decode bf16 B=1 seq=1024",
        "decode bf16 B=1 seq=4096",
        "decode bf16 B=1 seq=32768",
        "decode int8-static B=1 seq=4096",
        "decode bf16 B=1 seq=4096 window=128",
        "decode bf16 B=1 seq=4096 MLA H=16/1 D=576/512",
        "extend bf16 B=1 prefix=1024+256",
    } <= quick & set(found)


# ---- timing arithmetic -------------------------------------------------------------------------------------


@pytest.mark.variant_independent
def test_spread_gives_median_quartiles_and_extremes():
    s = timing.spread([0.004, 0.001, 0.002, 0.003])
    assert (s.calls, s.median, s.min, s.max) == (4, 0.0025, 0.001, 0.004)
    assert (s.p25, s.p75) == pytest.approx((0.00175, 0.00325)) and s.iqr == pytest.approx(0.0015)
    one = timing.spread([0.5])
    assert one.p25 == one.p75 == one.median == 0.5
    with pytest.raises(ValueError):
        timing.spread([])


@pytest.mark.variant_independent
def test_time_calls_warms_up_then_times_between_the_bounds():
    now = [0.0]
    called = []

    def clock() -> float:
        return now[0]

    def fn() -> None:
        called.append(1)
        now[0] += 0.25

    # At least 3 calls; continue to 1 s (4 calls of 0.25 s); the warm-up call is not timed.
    times = timing.time_calls(fn, 3, 1.0, 100, clock)
    assert times == [0.25] * 4 and len(called) == 5
    called.clear()
    assert len(timing.time_calls(fn, 2, 100.0, 6, clock)) == 6  # max_calls caps a long min_seconds
    assert len(timing.time_calls(fn, 7, 0.0, 3, clock)) == 7  # min_calls wins over max_calls


@pytest.mark.variant_independent
def test_per_unit_figures():
    assert timing.per_unit_ns(1e-3, 1000) == pytest.approx(1000.0)
    assert timing.cycles_per_unit(1e-3, 1000, 1.6e9) == pytest.approx(1600.0)
    assert timing.bytes_per_second(2e9, 0.5) == 4e9
    probe = timing.Bandwidth(1, 2**20, _spread(1e-3))
    assert probe.bytes_per_second == pytest.approx(2 * 2**20 / 1e-3)  # read + write
    assert probe.as_json()["time"]["median"] == 1e-3


@pytest.mark.variant_independent
def test_the_copy_probe_times_a_copy_of_the_buffer():
    probe = timing.copy_bandwidth(2**20, 1, 2, 0.0, 2)
    assert probe.time.calls == 2 and probe.buffer_bytes == 2**20
    assert 0 < probe.time.min <= probe.time.median <= probe.time.max
    assert probe.bytes_per_second == pytest.approx(2 * 2**20 / probe.time.median)


# ---- the machine -------------------------------------------------------------------------------------------


@pytest.mark.variant_independent
def test_cpuinfo_of_a_k1_and_of_qemu_and_the_emulation_verdict():
    k1 = machine.parse_cpuinfo(K1_CPUINFO)
    assert k1["processors"] == 2 and k1["uarch"] == "spacemit,x60" and k1["model name"] == "Spacemit(R) X60"
    assert machine.emulation({}, k1, "riscv64") is None
    assert machine.cpu_name({"cpu": k1}).startswith("Spacemit(R) X60 (spacemit,x60), isa rv64imafdcv_zicbom")
    assert machine.emulation({}, machine.parse_cpuinfo(QEMU_CPUINFO), "riscv64") == "/proc/cpuinfo says uarch qemu"
    older = machine.emulation({}, machine.parse_cpuinfo(OLDER_QEMU_CPUINFO), "riscv64")
    assert "no uarch or mvendorid line" in older
    assert machine.emulation({"RVV_ATTN_QEMU_CPU": "rv64,v=true"}, k1, "riscv64") == "RVV_ATTN_QEMU_CPU=rv64,v=true"
    assert machine.emulation({"RVV_ATTN_EMULATED": "qemu-riscv64"}, {}, "x86_64").startswith("RVV_ATTN_EMULATED")
    # The host's portable build runs natively.
    assert machine.emulation({}, machine.parse_cpuinfo("processor : 0\nmodel name : Xeon\n"), "x86_64") is None


@pytest.mark.variant_independent
def test_clock_comes_from_cpufreq_or_the_command_line(tmp_path):
    (tmp_path / "cpuinfo_max_freq").write_text("1600000\n")
    (tmp_path / "scaling_cur_freq").write_text("614400\n")
    (tmp_path / "scaling_governor").write_text("schedutil\n")
    clock = machine.clock_info(tmp_path)
    assert clock == {"cpuinfo_max_freq_mhz": 1600.0, "scaling_cur_freq_mhz": 614.4, "governor": "schedutil"}
    assert machine.cycle_clock_mhz(clock, None) == (1600.0, "cpuinfo_max_freq (cpu0, assumed under load)")
    assert machine.cycle_clock_mhz(clock, 1800.0) == (1800.0, "--clock-mhz")
    assert machine.cycle_clock_mhz({}, None)[0] is None and "--clock-mhz" in machine.cycle_clock_mhz({}, None)[1]
    assert machine.clock_info(tmp_path / "absent") == {}
    assert machine.thread_env({"OMP_NUM_THREADS": "4", "GOMP_CPU_AFFINITY": "0-3", "HOME": "/"}) == {
        "GOMP_CPU_AFFINITY": "0-3",
        "OMP_NUM_THREADS": "4",
    }


# ---- rows, the cycle model, the table, the JSON -----------------------------------------------------------

BASELINE_SAMPLE = {
    "rows": [
        {"config": "vlen256", "id": "decode bf16 B=1 seq=4096", "cycles": {"core": "spacemit-x60", "per_unit": 290}},
        {"config": "vlen128", "id": "decode bf16 B=1 seq=4096", "cycles": {"core": "sifive-p670", "per_unit": 400}},
        {"config": "torch-sdpa", "id": "decode torch-sdpa bf16 B=1 seq=4096", "cycles": None},
    ]
}


@pytest.mark.variant_independent
def test_measured_cycles_beside_the_models_estimate_single_threaded_only():
    estimates = report.cycle_estimates(BASELINE_SAMPLE, "vlen256")
    assert estimates == {"decode bf16 B=1 seq=4096": ("spacemit-x60", 290.0)}
    shape = shapes.Shape("llama3-8b", "decode", "bf16", seq=4096)
    median = 32768 * 580 / 1.6e9  # 580 cycles per unit at 1.6 GHz
    row = report.make_row(shape, 1, _spread(median), _spread(4 * median), None, 1600.0, estimates)
    assert row["cycle_model"]["measured_per_unit"] == pytest.approx(580.0)
    assert row["cycle_model"]["measured_over_estimate"] == pytest.approx(2.0)
    assert row["sdpa_over_rvv"] == pytest.approx(4.0) and row["of_copy_bandwidth"] is None
    assert report.make_row(shape, 8, _spread(median), None, None, 1600.0, estimates)["cycle_model"] is None
    assert report.make_row(shape, 1, _spread(median), None, None, None, estimates)["cycle_model"] is None
    qwen = shapes.Shape("qwen2.5-7b", "decode", "bf16", seq=4096)
    assert report.make_row(qwen, 1, _spread(median), None, None, 1600.0, estimates)["cycle_model"] is None


def _doc(emulated: str | None = None) -> dict:
    shape = shapes.Shape("llama3-8b", "decode", "bf16", seq=4096)
    probe = timing.Bandwidth(1, 256 * 2**20, _spread(0.1))  # 5.37 GB/s read + write
    median = shape.kv_bytes_per_call() / 2.684e9  # half the probe's rate
    row = report.make_row(shape, 1, _spread(median, 0.9 * median, 1.2 * median), _spread(3 * median), probe)
    env = {
        "version": "0.2.0",
        "torch": "2.6.0",
        "variant": "vlen256",
        "vlen": 256,
        "cpu": {"uarch": "spacemit,x60"},
        "cpu_name": "Spacemit(R) X60",
        "clock": {"cpuinfo_max_freq_mhz": 1600.0},
        "cycle_clock_mhz": 1600.0,
        "cycle_clock_source": "cpuinfo_max_freq",
        "threads": {"affinity_text": "0-7", "env": {}},
        "machine": {"cpu_count": 8},
        "emulated": emulated,
        "python": "3.13.5",
        "command": "python -m rvv_attn.benchmark --quick",
        "date": "2026-12-07 10:00:00 UTC",
    }
    return report.document(env, {"name": "quick", "threads": [1]}, [probe], [row], 12.0)


@pytest.mark.variant_independent
def test_the_table_has_a_row_per_measurement_and_the_bandwidth_row(tmp_path):
    doc = _doc()
    text = report.text_report(doc)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("shape "))
    row = lines[header + 2].split()
    assert row[:4] == ["llama3-8b", "decode", "bf16", "ctx=4096"]
    # thread, median, min..max, ns/unit, K/V GB/s, of copy (half of the probe's rate), SDPA 3x
    assert row[4] == "1" and row[8] == "2.68" and row[9] == "50%" and row[11] == "3x"
    assert "memory copy (torch copy_)" in text and "256 MiB buffer" in text and "5.37" in text
    assert "EMULATED" not in text and "variant vlen256 (CPU VLEN 256)" in text
    md = report.markdown_report(doc)
    assert "| shape | thr | median ms |" in md and "| llama3-8b decode bf16 ctx=4096 | 1 |" in md
    report.validate(doc)
    path = tmp_path / "result.json"
    report.write_json(doc, path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))


@pytest.mark.variant_independent
def test_an_emulated_run_says_so_loudly_and_a_bad_file_is_refused():
    doc = _doc(emulated="RVV_ATTN_QEMU_CPU=rv64,v=true,vlen=256")
    text = report.text_report(doc)
    assert text.count("EMULATED CPU (RVV_ATTN_QEMU_CPU=rv64,v=true,vlen=256)") == 2  # above and below the table
    assert "> **EMULATED CPU" in report.markdown_report(doc)
    with pytest.raises(ValueError, match="schema"):
        report.validate({"schema": "other"})
    broken = _doc()
    del broken["environment"]["clock"]
    with pytest.raises(ValueError, match="no 'clock'"):
        report.validate(broken)


@pytest.mark.variant_independent
@pytest.mark.parametrize(
    "bad, message",
    [
        (["--threads", "0"], "thread counts >= 1"),
        (["--quick", "--smoke"], "not allowed with"),
        (["--clock-mhz", "-5"], "--clock-mhz must be positive"),
        (["--bandwidth-mib", "0"], "--bandwidth-mib must be at least 1"),
    ],
)
def test_bad_options_are_refused_with_what_to_give(bad, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(bad)
    assert message in capsys.readouterr().err


# ---- the calls and a run -----------------------------------------------------------------------------------


def test_each_benchmark_call_computes_what_sdpa_computes_over_the_same_cache(kernel_variant):
    """The rows time real attention: every smoke shape's operator call agrees with torch's SDPA."""
    for shape in shapes.smoke_shapes():
        timed = calls.make_calls(shape)
        timed.rvv()
        timed.sdpa()
        got, want = timed.rvv_output.float(), timed.sdpa_output.float()
        assert torch.isfinite(got).all(), shape.label
        # bf16 outputs; int8 rows dequantized the same way on both sides.
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), (shape.label, (got - want).abs().max())


def test_the_smoke_plan_prints_the_table_and_writes_the_json(tmp_path, capsys):
    out, md = tmp_path / "bench.json", tmp_path / "summary.md"
    assert cli.main(["--smoke", "--threads", "1", "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    report.validate(doc)
    assert len(doc["rows"]) == len(shapes.smoke_shapes()) and len(doc["bandwidth"]) == 1
    assert all(math.isfinite(r["ns_per_unit"]) and r["ns_per_unit"] > 0 for r in doc["rows"])
    assert all(r["sdpa"]["calls"] >= 2 for r in doc["rows"])
    env = doc["environment"]
    assert env["variant"] == env["runtime_info"]["active_variant"] and env["command"].endswith("--markdown " + str(md))
    for shape in shapes.smoke_shapes():
        assert shape.label in text
    assert ("EMULATED CPU" in text) == bool(env["emulated"])
    assert md.read_text().startswith("## rvv-attn board benchmark")


@pytest.mark.host_only
def test_the_module_runs_as_a_command(tmp_path):
    """``python -m rvv_attn.benchmark`` in a fresh interpreter (under emulation a child cannot be started)."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "rvv_attn.benchmark", "--smoke", "--threads", "1", "--no-sdpa", "--json", str(out)]
    child = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "llama3-8b decode bf16 ctx=40" in child.stdout and json.loads(out.read_text())["rows"][0]["sdpa"] is None
