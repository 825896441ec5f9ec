"""Unit tests of the benchmark driver and the plugin-QEMU recipe (no QEMU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.bench import cases, figures, plugin_qemu, render, run
from driver.errors import ConfigError, DriverError
from driver.toolchain.private_apt import PrivateApt
from driver.toolchain.qemu import QemuPin

# ---- units and the lower bound ----------------------------------------------------------------------


def test_units_of_work():
    assert cases.Case("decode", "bf16", batch=8, seq=4096).units() == 8 * 4096 * 8
    extend = cases.Case("extend", "bf16", prefix=1024, new=256)
    # new token i sees 1024 + i + 1 keys
    assert extend.pairs_per_sequence() == sum(1024 + i + 1 for i in range(256))
    assert extend.units() == extend.pairs_per_sequence() * 32


def test_units_of_sglang_mains_options():
    # A window's units are the tokens it attends, so its figures compare with a decode of that length.
    windowed = cases.Case("decode", "bf16", seq=4096, window=128)
    assert windowed.units() == cases.Case("decode", "bf16", seq=128).units() == 128 * 8
    assert cases.Case("decode", "bf16", seq=100, window=128).units() == 100 * 8
    vision = cases.vision_case()
    assert vision.units() == 4 * 256 * 256 * 16
    assert vision.id == "varlen bf16 images=4 patches=256 H=16 D=64"
    assert windowed.id == "decode bf16 B=1 seq=4096 window=128"
    assert cases.Case("extend", "bf16", prefix=0, new=256, sinks=True).id == "extend bf16 B=1 prefix=0+256 sinks"
    # The options' rows run at the headline VLEN only, and the vision shape beside torch's SDPA.
    configs = cases.full_configs()
    with_contract = [c for c in configs if any(case.op == "varlen" for case in c.cases)]
    assert sorted(c.name for c in with_contract) == sorted([cases.NATIVE, f"vlen{cases.HEADLINE_VLEN}"])


def test_decode_lower_bound_matches_the_hand_count():
    # VLEN 256, bf16, D = Dv = 128, G = 4: K and V rows each 8 loads + 16 widening results, 4 heads x 128 FMAs
    # for q.k and for p*v at 8 lanes.
    assert figures.lower_bound(cases.Case("decode", "bf16", seq=4096), 256) == 8 + 16 + 8 + 16 + 64 + 64
    assert figures.lower_bound(cases.Case("decode", "int8-static", seq=4096), 256) == 4 + 16 + 4 + 16 + 128


def test_lower_bound_halves_with_each_doubling_of_vlen():
    for case in (cases.Case("decode", "bf16", seq=1024), cases.Case("extend", "int8-dynamic", prefix=1024, new=256)):
        bounds = [figures.lower_bound(case, v) for v in (128, 256, 512, 1024)]
        assert all(a == pytest.approx(2 * b) for a, b in zip(bounds, bounds[1:]))


def test_extend_lower_bound_is_the_fmas_plus_amortized_loads():
    case = cases.Case("extend", "bf16", prefix=1024, new=256)
    fmas = (128 + 128) / 8
    bound = figures.lower_bound(case, 256)
    assert fmas < bound < fmas + 0.2
    assert bound == pytest.approx(32.073, abs=0.001)


def test_full_matrix_covers_the_issue():
    configs = cases.full_configs()
    names = [c.name for c in configs]
    assert names == ["portable", "torch-sdpa", "vlen128", "vlen256", "vlen512", "vlen1024"]
    contract = {c.id for c in cases.contract_cases()}
    other_models = {c.id for c in cases.long_and_mla_cases()}
    for config in configs[:1] + configs[2:]:
        # The rows of SGLang main's options (test_units_of_sglang_mains_options) are apart from the matrix.
        assert other_models <= {c.id for c in config.cases}, config.name
        kernel = [c for c in config.cases if c.id not in contract | other_models]
        assert {(c.batch, c.seq, c.dtype) for c in kernel if c.op == "decode"} == {
            (b, s, dt) for b in (1, 8) for s in (1024, 4096) for dt in cases.DTYPES
        }
        extend = {(c.dtype, c.prefix, c.new) for c in kernel if c.op == "extend"}
        # At the headline VLEN only: int8 extend without a prefix, fp8 extend over a 1024-token one (its cache is
        # read for the prefix alone).
        quantized = {(dt, 0, 256) for dt in cases.DTYPES if dt.startswith("int8")} | {("fp8", 1024, 256)}
        headline = quantized if config.name == "vlen256" else set()
        assert extend == {("bf16", 0, 256), ("bf16", 1024, 256)} | headline
        assert all(c.heads == 32 and c.heads_kv == 8 and c.head_dim == c.head_dim_v == 128 for c in kernel)
    assert [c.id for c in configs[1].cases] == [
        "decode torch-sdpa bf16 B=1 seq=4096",
        "extend torch-sdpa bf16 B=1 prefix=1024+256",
        "varlen torch-sdpa bf16 images=4 patches=256 H=16 D=64",
    ]


def test_long_context_and_mla_rows_are_named_by_their_shapes():
    long, mla = cases.long_and_mla_cases()
    assert long.id == "decode bf16 B=1 seq=32768" and long.units() == 32768 * 8
    assert mla.id == "decode bf16 B=1 seq=4096 MLA H=16/1 D=576/512"
    # One latent head: a unit is a token, each read once as a 576-wide bf16 row that holds V too.
    assert mla.units() == 4096 and mla.group == 16
    assert mla.kv_bytes_per_unit() == 576 * 2
    assert mla.fma_registers_per_unit(256) == 16 * (576 + 512) / 8
    # The Llama-like rows keep the names the baseline is keyed by.
    assert cases.Case("decode", "bf16", seq=4096).id == "decode bf16 B=1 seq=4096"


def test_check_subset_is_in_the_full_matrix():
    full = {cases.row_key(c.name, case) for c in cases.full_configs() for case in c.cases}
    check = [cases.row_key(c.name, case) for c in cases.check_configs() for case in c.cases]
    assert len(check) == 2 and set(check) <= full


# ---- plugin output --------------------------------------------------------------------------------

COUNTS = {
    "scalar": 100,
    "vector_arith": 40,
    "vector_mem": 20,
    "vset": 10,
    "vector_arith_lmul1": 160,
    "vector_mem_lmul1": 50,
}


def _region(label: int, lib: dict, all_: dict, unknown: int = 0) -> str:
    return json.dumps({"label": label, "vcpus": 1, "unknown_vtype": unknown, "all": all_, "lib": lib})


def test_rows_take_library_counts_for_kernels_and_whole_region_less_marks_for_torch():
    empty = {k: 0 for k in COUNTS} | {"scalar": 30}
    whole = {k: v * 3 for k, v in COUNTS.items()}
    text = "\n".join([_region(0, {k: 0 for k in COUNTS}, empty), _region(1, COUNTS, whole), _region(2, COUNTS, whole)])
    kernel = cases.Case("decode", "bf16", seq=1024)
    native = cases.Case("decode", "bf16", seq=1024, impl=cases.NATIVE)
    rows = figures.rows_for(cases.Config("vlen256", 256, (kernel, native)), figures.parse_regions(text))
    assert rows[0].counts == {"raw": 170, "scalar": 100, "vector": 70, "vector_lmul1": 220, "lmul1": 320, "vset": 10}
    assert rows[0].per_unit["raw"] == round(170 / (1024 * 8), 3)
    assert rows[0].lower_bound == 176
    assert rows[1].counts["raw"] == 3 * 170 - 30 and rows[1].lower_bound is None
    # What the kernel's call ran outside the library: the whole region less the library less the marks.
    assert rows[0].outside_per_call == 3 * 170 - 170 - 30 and rows[1].outside_per_call is None


def test_plugin_errors_and_missing_regions_fail_the_run():
    with pytest.raises(DriverError, match="end mark without"):
        figures.parse_regions('{"error": "end mark without a matching start mark", "value": 3}')
    config = cases.Config("vlen256", 256, (cases.Case("decode", "bf16", seq=1024),))
    with pytest.raises(DriverError, match="no count for decode bf16"):
        figures.rows_for(config, {0: json.loads(_region(0, COUNTS, COUNTS))})
    with pytest.raises(DriverError, match="before any vset"):
        figures.rows_for(
            config,
            figures.parse_regions("\n".join([_region(0, COUNTS, COUNTS), _region(1, COUNTS, COUNTS, unknown=4)])),
        )


# ---- the guard ------------------------------------------------------------------------------------


def _doc(**per_unit: float) -> dict:
    values = {f: 100.0 for f in figures.FIGURES} | per_unit
    return {"rows": [{"key": "vlen256 | decode bf16 B=1 seq=1024", "per_unit": values}]}


def test_guard_fails_on_growth_over_two_percent_only():
    base = _doc()
    assert figures.compare(base, _doc(raw=102.0)) == ([], [], [])
    regressions, _, _ = figures.compare(base, _doc(raw=102.1))
    assert len(regressions) == 1 and "raw 100 -> 102.1" in regressions[0] and "2.1%" in regressions[0]
    regressions, improvements, _ = figures.compare(base, _doc(scalar=50.0))
    assert regressions == [] and "scalar 100 -> 50" in improvements[0]


def test_guard_fails_on_a_figure_growing_from_zero_and_reports_rows_missing_from_the_baseline():
    regressions, _, _ = figures.compare(_doc(vector=0.0), _doc(vector=0.5))
    assert regressions and "vector 0 -> 0.5" in regressions[0]
    assert figures.compare({"rows": []}, _doc()) == ([], [], ["vlen256 | decode bf16 B=1 seq=1024"])


def test_posargs():
    assert cases.parse_posargs([]) == cases.Options()
    assert cases.parse_posargs(["--update-baseline", "--jobs=3"]) == cases.Options(True, 3)
    assert cases.parse_posargs(["--only=decode, vlen128"]).only == ("decode", "vlen128")
    for bad in (["--jobs=0"], ["--jobs=x"], ["--fast"], ["--only="]):
        with pytest.raises(ConfigError):
            cases.parse_posargs(bad)


def test_docs_tables_are_replaced_between_the_markers():
    doc = {"meta": {}, "definitions": "", "rows": []}
    text = f"intro\n{render.TABLE_START}\nold table\n{render.TABLE_END}\noutro\n"
    new = render.update_docs_tables(text, doc)
    assert new.startswith("intro\n") and new.endswith("\noutro\n") and "old table" not in new
    with pytest.raises(ConfigError):
        render.update_docs_tables("no markers", doc)


def test_checked_in_baseline_covers_the_guard_and_only_known_rows():
    baseline = figures.load_document(figures.BASELINE_FILE)
    keys = {r["key"] for r in baseline["rows"]}
    assert {cases.row_key(c.name, case) for c in cases.check_configs() for case in c.cases} <= keys
    assert keys <= {cases.row_key(c.name, case) for c in cases.full_configs() for case in c.cases}


# ---- plugin-capable QEMU recipe -----------------------------------------------------------------------


def test_plugin_qemu_is_the_pinned_version_from_its_source_package():
    pin = QemuPin.load()
    assert plugin_qemu.upstream_version("1:10.0.13+ds-0+deb13u1") == "10.0.13"
    cmd = plugin_qemu.configure_command(Path("/src"), Path("/py"), pin)
    assert cmd[0] == "/src/configure" and "--python=/py" in cmd
    assert {"--target-list=riscv64-linux-user", "--enable-plugins", "--disable-system"} <= set(cmd)
    assert plugin_qemu.cache_dir(pin).name == pin.version.replace(":", "_")


def test_source_apt_uses_a_deb_src_line():
    apt = PrivateApt(Path("/c"), "http://mirror.example/debian", kind="deb-src")
    assert apt.sources_line().startswith("deb-src [arch=amd64 signed-by=")
    assert PrivateApt(Path("/c"), "http://m/debian").sources_line().startswith("deb [")


def test_only_selects_rows_by_name_and_a_partial_update_replaces_just_those():
    picked = cases.select(cases.full_configs(), ["vlen128 | decode int8"])
    assert [c.name for c in picked] == ["vlen128"]
    assert {c.id.split(" B=")[0] for c in picked[0].cases} == {"decode int8-static", "decode int8-dynamic"}
    with pytest.raises(ConfigError, match="matches no benchmark row"):
        cases.select(cases.full_configs(), ["no such row"])
    baseline = {"meta": {"commit": "a"}, "rows": [{"key": "x", "v": 1}, {"key": "y", "v": 2}]}
    run = {"meta": {"commit": "b", "date": "d"}, "rows": [{"key": "y", "v": 3}]}
    merged = figures.merge_into(baseline, run)
    assert merged["rows"] == [{"key": "x", "v": 1}, {"key": "y", "v": 3}]
    assert merged["meta"]["commit"] == "a" and merged["meta"]["partial_update"]["commit"] == "b"


def test_an_update_that_re_measures_every_row_is_the_run_itself():
    baseline = {"meta": {"commit": "a"}, "rows": [{"key": "x", "v": 1}]}
    run = {"meta": {"commit": "b", "date": "d"}, "rows": [{"key": "x", "v": 2}, {"key": "z", "v": 3}]}
    merged = figures.merge_into(baseline, run)
    assert merged["meta"] == run["meta"] and merged["rows"] == run["rows"]


# ---- the guard's verdict and the baseline update ------------------------------------------------------


def test_guard_reports_improvements_and_fails_on_regressions_or_rows_missing_when_required():
    lines = []
    figures.guard(_doc(), _doc(scalar=50.0), require_every_row=True, report=lines.append)
    assert lines[0].startswith("improved: ") and "no figure grew by more than 2%" in lines[-1]
    with pytest.raises(DriverError, match=r"1 figures grew by more than 2% against baseline.json:\n  .*raw"):
        figures.guard(_doc(), _doc(raw=110.0), require_every_row=False, report=lines.append)
    lines.clear()
    figures.guard({"rows": []}, _doc(), require_every_row=False, report=lines.append)
    assert "1 rows have no baseline figures" in lines[0] and "--update-baseline --only=" in lines[0]
    with pytest.raises(ConfigError, match="no baseline figures"):
        figures.guard({"rows": []}, _doc(), require_every_row=True, report=lines.append)


def test_an_update_without_only_is_the_run_and_with_only_merges_into_the_file(tmp_path):
    run = {"meta": {"commit": "b", "date": "d"}, "definitions": "", "rows": [{"key": "y", "v": 3}]}
    assert figures.updated_baseline(run, ()) is run
    missing = tmp_path / "none.json"
    assert figures.updated_baseline(run, ("y",), missing)["rows"] == run["rows"]
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"meta": {"commit": "a"}, "rows": [{"key": "x", "v": 1}, {"key": "y", "v": 2}]}))
    merged = figures.updated_baseline(run, ("y",), path)
    assert merged["rows"] == [{"key": "x", "v": 1}, {"key": "y", "v": 3}]


def test_write_baseline_checks_the_docs_page_before_writing_anything(tmp_path):
    doc = figures.empty_document({"commit": "c"})
    baseline, renderings, page = tmp_path / "baseline.json", tmp_path / "results", tmp_path / "benchmarks.md"
    with pytest.raises(ConfigError, match="no .*benchmarks.md"):
        render.write_baseline(doc, baseline, renderings, page)
    page.write_text("no markers\n")
    with pytest.raises(ConfigError, match="benchmarks.md has no <!-- bench-table:start -->"):
        render.write_baseline(doc, baseline, renderings, page)
    assert not baseline.exists() and not renderings.exists()
    page.write_text(f"intro\n{render.TABLE_START}\n{render.TABLE_END}\n")
    written = render.write_baseline(doc, baseline, renderings, page)
    assert written == [baseline, renderings / "bench.md", page]
    assert json.loads(baseline.read_text()) == doc and "At VLEN 256:" in page.read_text()


def test_the_checked_in_results_are_renderings_of_the_baseline_not_a_copy():
    baseline = figures.load_document(figures.BASELINE_FILE)
    assert not (render.BASELINE_RENDERINGS / "bench.json").exists()
    assert (render.BASELINE_RENDERINGS / "bench.md").read_text() == render.markdown(baseline)
    assert (render.BASELINE_RENDERINGS / render.PLOT_NAME).exists()


def test_guest_cases_label_each_case_after_the_empty_region():
    config = cases.check_configs()[0]
    labelled = run.guest_cases(config)
    assert [c["label"] for c in labelled] == [1, 2] and labelled[0]["id"] == config.cases[0].id


# ---- cycles ---------------------------------------------------------------------------------------


def test_fma_work_and_kv_bytes_per_unit_follow_the_shapes():
    decode = cases.Case("decode", "bf16", seq=4096)
    # G = 4 query heads per KV head, D + Dv = 256 FMAs each, 8 float32 lanes at VLEN 256.
    assert decode.fma_registers_per_unit(256) == 4 * 256 / 8
    assert decode.fma_registers_per_unit(1024) == 4 * 256 / 32
    assert decode.kv_bytes_per_unit() == 256 * 2
    assert cases.Case("decode", "int8-static", seq=4096).kv_bytes_per_unit() == 256
    assert cases.Case("decode", "int8-dynamic", seq=4096).kv_bytes_per_unit() == 256 + 8  # a float32 scale each
    extend = cases.Case("extend", "bf16", prefix=1024, new=256)
    assert extend.fma_registers_per_unit(256) == 256 / 8
    # Every key's K and V rows once per KV head, over the pairs of its 4 query heads.
    assert extend.kv_bytes_per_unit() == pytest.approx(1280 * 512 / (4 * extend.pairs_per_sequence()))


def test_a_rows_cycles_are_per_unit_with_their_floor_and_the_guard_compares_them_on_the_same_core():
    row = figures.Row("vlen256", "vlen256", 256, cases.Case("decode", "bf16", seq=1024), {"raw": 8192})
    row.set_cycles("spacemit-x60", 8192 * 300.0, 150.0)
    assert row.cycles["per_unit"] == 300.0 and row.cycles["of_floor"] == 2.0
    assert row.as_json()["cycles"]["core"] == "spacemit-x60"
    base = _doc()
    base["rows"][0]["cycles"] = {"core": "spacemit-x60", "per_unit": 300.0}
    grown = _doc()
    grown["rows"][0]["cycles"] = {"core": "spacemit-x60", "per_unit": 306.1}
    regressions, _, _ = figures.compare(base, grown)
    assert len(regressions) == 1 and "spacemit-x60 cycles 300 -> 306.1" in regressions[0]
    # Another core, or a baseline from before the cycle model: nothing to compare them with.
    grown["rows"][0]["cycles"]["core"] = "sifive-p670"
    assert figures.compare(base, grown) == ([], [], [])
    assert figures.compare(_doc(), grown) == ([], [], [])


def test_the_cycles_table_names_each_configurations_core():
    row = figures.Row("vlen256", "vlen256", 256, cases.Case("decode", "bf16", seq=1024), {"raw": 8192})
    row.set_cycles("spacemit-x60", 8192 * 412.0, 128.0)
    table = render.cycles_table({"rows": [row.as_json()]})
    assert "VLEN 256 (spacemit-x60)" in table.splitlines()[0]
    assert "| decode bf16 B=1 seq=1024 | 412.0 |" in table


def test_the_guard_compares_instructions_outside_the_library_per_call():
    base, grown = _doc(), _doc()
    base["rows"][0]["outside_per_call"] = 20_000
    grown["rows"][0]["outside_per_call"] = 25_000  # e.g. a libm call per token came back
    regressions, _, _ = figures.compare(base, grown)
    assert len(regressions) == 1 and "outside the library per call 20000 -> 25000" in regressions[0]
    # A baseline from before the figure: nothing to compare it with.
    assert figures.compare(_doc(), grown) == ([], [], [])
