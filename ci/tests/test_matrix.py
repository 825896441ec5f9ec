"""The emulated matrix of `nox -t test` (ci/driver/testing/matrix.py) and the summary's timings (no QEMU)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.testing import matrix, testrun
from driver.testing.beside import nested_nox_command, sessions_beside
from driver.testing.repro import Config
from driver.toolchain import vlens


def test_every_vlen_and_the_test_runs_agnostic_lanes_are_configurations():
    labels = [c.label for c in matrix.configurations()]
    assert labels[: len(vlens.variants())] == [v.name for v in vlens.variants()]
    assert labels[len(vlens.variants()) :] == [f"vlen{v}-agnostic" for v in vlens.agnostic_lane_in_test_tag()]
    assert vlens.agnostic_lane_in_test_tag(), "`nox -t test` must run at least one VLEN with all-ones agnostic lanes"
    # --configs may still name any VLEN with either policy (CI's lanes included).
    known = {c.label for c in matrix.known_configurations()}
    assert {f"vlen{v}-agnostic" for v in vlens.agnostic_lane()} <= known
    assert len(known) == 2 * len(vlens.variants())
    # The same labels (and results folders) as the single sessions of each configuration.
    assert matrix.label(Config(512)) == "test-vlen512"
    assert matrix.label(Config(1024, True)) == "test-vlen1024-agnostic"


def test_exactly_one_undisturbed_configuration_runs_the_variant_independent_tests():
    runs = [c for c in matrix.configurations() if matrix.runs_variant_independent(c)]
    assert [(c.vlen, c.agnostic) for c in runs] == [(vlens.variant_independent_lane(), False)]
    envs = {c.label: matrix.selection_env(c)["RVV_ATTN_VARIANT_INDEPENDENT"] for c in matrix.configurations()}
    assert sorted(envs.values()).count("run") == 1
    assert set(envs.values()) == {"run", "deselect"}


def test_no_configuration_of_the_matrix_runs_the_portable_build_but_test_vlen128_does(tmp_path):
    from driver.testing import testrun

    assert {matrix.selection_env(c)["RVV_ATTN_TEST_PORTABLE"] for c in matrix.configurations()} == {"0"}
    lane = vlens.by_vlen(vlens.portable_lane())
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3").touch()
    _, env = testrun.emulated_pytest(Path("/q"), tmp_path, tmp_path, lane, ["tests"], tmp_path / "j.xml")
    assert env["RVV_ATTN_TEST_PORTABLE"] == "1"


def test_the_test_runs_agnostic_lanes_are_some_of_cis(tmp_path):
    table = tmp_path / "vlens.json"
    table.write_text(json.dumps({"vlens": [{"vlen": 128}, {"vlen": 256}], "agnostic_lane": [128, 256]}))
    assert vlens.agnostic_lane_in_test_tag(table) == (128, 256)  # absent: all of CI's
    other = tmp_path / "other.json"  # the table's readers cache by path
    other.write_text(
        json.dumps({"vlens": [{"vlen": 128}, {"vlen": 256}], "agnostic_lane": [256], "test_agnostic_lane": [128]})
    )
    with pytest.raises(ValueError, match=r"test_agnostic_lane \(128,\) in other.json is not a subset"):
        vlens.agnostic_lane_in_test_tag(other)


def test_variant_independent_lane_must_be_in_the_table(tmp_path):
    table = tmp_path / "vlens.json"
    table.write_text(json.dumps({"vlens": [{"vlen": 128}, {"vlen": 256}], "variant_independent_lane": 512}))
    with pytest.raises(ValueError, match="variant_independent_lane 512"):
        vlens.variant_independent_lane(table)
    table.write_text(json.dumps({"vlens": [{"vlen": 128}, {"vlen": 256}]}))
    assert vlens.variant_independent_lane(table) == 128  # absent: the smallest VLEN


def test_options_are_split_from_pytest_arguments():
    opts = matrix.parse_posargs(["--jobs=3", "--configs=vlen256,vlen1024-agnostic", "tests/test_runtime.py", "-x"])
    assert opts.jobs == 3
    assert [c.label for c in opts.configs] == ["vlen256", "vlen1024-agnostic"]
    assert opts.pytest_args == ["tests/test_runtime.py", "-x"]
    default = matrix.parse_posargs([])
    assert default.pytest_args == ["tests"] and default.jobs == 0
    assert default.configs == matrix.configurations()


def test_the_host_side_sessions_run_beside_the_whole_matrix_only_unless_named():
    # Two processes: the host builds in one, the sessions on the riscv64 cross build and its wheel in the other.
    assert matrix.parse_posargs([]).beside == (
        ("test-host", "sanitize"),
        ("test-toolchain", "install-test-quick", "bench-check"),
    )
    # Every session of `-t test`'s host side is in exactly one of them.
    assert (
        sorted(matrix.BESIDE)
        == sorted(set(matrix.BESIDE))
        == sorted(["test-host", "test-toolchain", "sanitize", "install-test-quick", "bench-check"])
    )
    # A narrowed run is one that differs from the default list of configurations, not only in its length.
    same_count = [c.label for c in matrix.known_configurations()[-len(matrix.configurations()) :]]
    assert matrix.parse_posargs([f"--configs={','.join(same_count)}"]).beside == ()
    assert matrix.parse_posargs(["--configs=vlen256"]).beside == ()  # a narrowed run: just those configurations
    assert matrix.parse_posargs(["tests/test_runtime.py"]).beside == ()
    assert matrix.parse_posargs(["--beside=none"]).beside == ()
    assert matrix.parse_posargs(["--configs=vlen256", "--beside=bench-check"]).beside == (("bench-check",),)
    # Each --beside is one more process. SGLang's share may be named (a torch line's quick run does), but is
    # never beside by default.
    named = matrix.parse_posargs(["--configs=vlen256", "--beside=test-host,bench-check", "--beside=test-sglang-quick"])
    assert named.beside == (("test-host", "bench-check"), ("test-sglang-quick",))
    assert matrix.default_jobs(named.beside) == (os.cpu_count() or 1) + 1
    with pytest.raises(ConfigError, match="test-sglang"):
        matrix.parse_posargs(["--beside=test-sglang"])


def test_sessions_beside_run_while_the_block_runs_and_their_output_is_printed(tmp_path, capsys):
    reports: list[str] = []
    marker = tmp_path / "started"
    cmd = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(marker)!r}).touch(); print('beside says hi')"]
    with sessions_beside(["bench-check"], reports.append, tmp_path / "beside.log", cmd) as beside:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:  # it runs while the block does
            time.sleep(0.05)
        assert marker.exists() and beside.returncode is None
    assert beside.returncode == 0 and not beside.failed
    assert "beside says hi" in capsys.readouterr().out
    assert reports[-1].startswith("nox -s bench-check beside them: ok in")
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    with sessions_beside(["sanitize"], reports.append, tmp_path / "b2.log", failing) as beside:
        pass
    assert beside.returncode == 3 and beside.failed and "failed (exit 3)" in reports[-1]
    with sessions_beside([], reports.append) as nothing:
        pass
    assert not nothing.failed


def test_sessions_beside_stop_when_the_pool_fails(tmp_path):
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with sessions_beside(["sanitize"], lambda _: None, tmp_path / "b.log", cmd) as beside:
            raise KeyboardInterrupt
    assert beside.returncode is None and time.monotonic() - started < 30


def test_the_nested_nox_is_this_interpreter_on_the_noxfile():
    cmd = nested_nox_command(["sanitize", "bench-check"])
    assert cmd[:3] == [sys.executable, "-m", "nox"] and cmd[-3:] == ["--sessions", "sanitize", "bench-check"]
    assert Path(cmd[cmd.index("--noxfile") + 1]).is_file()


@pytest.mark.parametrize(
    "bad",
    [["--jobs=0"], ["--jobs=two"], ["--configs=vlen2048"], ["--configs="], ["--beside=lint"], ["--beside="]],
)
def test_bad_options_are_refused(bad):
    with pytest.raises(ConfigError):
        matrix.parse_posargs(bad)


def test_order_is_longest_first_and_unmeasured_configurations_by_their_usual_cost():
    configs = matrix.configurations()
    static = [c.label for c in matrix.order(configs, {})]
    # The portable lane (two builds' tests) first, then the agnostic lanes, the larger VLENs before the smaller.
    assert static[0] == f"vlen{vlens.portable_lane()}"
    agnostic = [label for label in static if label.endswith("-agnostic")]
    assert static[1 : 1 + len(agnostic)] == agnostic
    measured = {"test-vlen256": 300.0, "test-vlen512": 100.0, "test-vlen128": 200.0}
    ordered = [c.label for c in matrix.order([Config(128), Config(256), Config(512)], measured)]
    assert ordered == ["vlen256", "vlen128", "vlen512"]
    # A configuration never measured goes before the measured ones (its cost is unknown).
    assert matrix.order([Config(256), Config(1024)], {"test-vlen256": 10.0})[0] == Config(1024)


def test_recorded_seconds_come_from_the_last_summaries(tmp_path):
    for label, seconds in (("test-vlen128", 210.5), ("test-host", None)):
        (tmp_path / label).mkdir()
        (tmp_path / label / "summary.json").write_text(json.dumps({"label": label, "wall_seconds": seconds}))
    (tmp_path / "test-vlen512").mkdir()
    (tmp_path / "test-vlen512" / "summary.json").write_text("not json")
    assert matrix.recorded_seconds(tmp_path) == {"test-vlen128": 210.5}


def _fake_pytest(fail: set[str], crash: set[str]):
    """Commands that write JUnit XML as pytest does (one passing or failing case), or crash without any."""

    def command_for(config, junit, out_dir):
        if config.label in crash:
            return ["sh", "-c", "echo Segmentation fault; exit 139"], {"PATH": "/usr/bin:/bin"}
        failed = config.label in fail
        case = (
            '<testcase classname="tests.test_a" name="test_x" time="2.5"><failure message="assert 1 == 2"/></testcase>'
            if failed
            else '<testcase classname="tests.test_a" name="test_x" time="2.5"/>'
        )
        case += '<testcase classname="tests.test_b" name="test_y" time="0.5"/>'
        xml = f'<testsuites><testsuite tests="2" failures="{int(failed)}" time="3">{case}</testsuite></testsuites>'
        return ["sh", "-c", f"printf '%s' '{xml}' > {junit}; exit {int(failed)}"], {"PATH": "/usr/bin:/bin"}

    return command_for


@pytest.fixture
def results_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(testrun, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(matrix, "BUILD_DIR", tmp_path)
    return tmp_path


def test_each_configuration_gets_its_own_log_junit_and_summary(results_in_tmp):
    configs = [Config(128), Config(256), Config(1024, True)]
    results = matrix.run(configs, _fake_pytest(set(), set()), jobs=2, report=lambda _: None)
    assert [r.config for r in results] == configs  # reported in the order asked for, whatever ran first
    for c in configs:
        folder = results_in_tmp / "results" / matrix.label(c)
        assert (folder / "pytest.log").exists() and (folder / "junit.xml").exists()
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["label"] == matrix.label(c) and summary["returncode"] == 0
        assert summary["variant_independent"] == ("run" if matrix.runs_variant_independent(c) else "deselected")
    assert all(matrix.ok(r) for r in results)


def test_the_report_names_the_failing_configuration_and_test(results_in_tmp):
    configs = [Config(128), Config(512), Config(1024, True)]
    results = matrix.run(configs, _fake_pytest({"vlen512"}, {"vlen1024-agnostic"}), jobs=2, report=lambda _: None)
    assert [matrix.ok(r) for r in results] == [True, False, False]
    text = "\n".join(matrix.report_lines(results, 12.0, 2))
    assert "FAIL test-vlen512" in text and "ok   test-vlen128" in text
    assert "test-vlen512: tests/test_a.py::test_x: assert 1 == 2" in text
    assert "test-vlen1024-agnostic: exit 139 without a failing test" in text and "Segmentation fault" in text
    # The summary session sees the same.
    rows = testrun.summary_table(0)
    assert any(r.startswith("FAIL test-vlen512") for r in rows)
    assert any(r.startswith("FAIL test-vlen1024-agnostic") and "no report (exit code 139)" in r for r in rows)


def test_a_configuration_that_ran_no_test_is_not_ok(results_in_tmp):
    def empty(config, junit, out_dir):
        xml = '<testsuites><testsuite tests="0" time="0"></testsuite></testsuites>'
        return ["sh", "-c", f"printf '%s' '{xml}' > {junit}"], {"PATH": "/usr/bin:/bin"}

    (result,) = matrix.run([Config(256)], empty, jobs=1, report=lambda _: None)
    assert result.returncode == 0 and not matrix.ok(result)


# ---- the summary's timings ---------------------------------------------------------------------


def test_slowest_files_add_up_their_cases(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite tests="4">'
        '<testcase classname="tests.test_a" name="t1" time="1.5"/>'
        '<testcase classname="tests.test_a" name="t2" time="2.0"/>'
        '<testcase classname="tests.test_b.TestGroup" name="t3" time="4.0"/>'
        '<testcase classname="tests.test_c" name="t4" time="0.1"/>'
        "</testsuite></testsuites>"
    )
    assert testrun.slowest_files(junit, 2) == [("tests/test_b.py", 4.0), ("tests/test_a.py", 3.5)]
    assert testrun.slowest_files(tmp_path / "absent.xml") == []


def test_session_clock_records_wall_time_and_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(testrun, "BUILD_DIR", tmp_path)
    since = time.time() - 1
    with testrun.session_clock("test-host"):
        pass
    with pytest.raises(RuntimeError), testrun.session_clock("bench-check"):
        raise RuntimeError("failed")
    rows = testrun.session_table(since, now=since + 125)
    assert rows[0].startswith("ok   test-host") and rows[1].startswith("FAIL bench-check")
    assert rows[2].split()[:2] == ["total", "(wall)"] and rows[2].endswith("2 min 05 s")
    assert testrun.session_table(time.time() + 10) == []  # sessions of an earlier invocation are not shown


@pytest.mark.parametrize("seconds,text", [(42.4, "42 s"), (60, "1 min 00 s"), (3725, "62 min 05 s")])
def test_durations_read_as_minutes_and_seconds(seconds, text):
    assert testrun.duration(seconds) == text


def test_the_single_vlen_sessions_leave_the_test_tag_to_test_emulated():
    noxfile = (Path(__file__).resolve().parents[2] / "noxfile.py").read_text()
    assert '@_session(name="test-emulated", tags=["test"], timed=True)' in noxfile
    assert '@_session(name=f"test-{variant.name}", timed=True, doc=' in noxfile  # no tag: -t test would run it twice
    assert 'tags=["agnostic"]' in noxfile


def test_byte_compile_starts_with_the_largest_trees(tmp_path):
    from driver.toolchain import sysroot

    for name, files in (("small", 1), ("large", 5), ("medium", 3)):
        for i in range(files):
            (tmp_path / name / "sub").mkdir(parents=True, exist_ok=True)
            (tmp_path / name / "sub" / f"m{i}.py").write_text("")
    trees = [tmp_path / n for n in ("small", "large", "medium")]
    assert [t.name for t in sysroot.largest_first(trees)] == ["large", "medium", "small"]


def test_only_a_stage_unpacked_from_a_wheel_counts_as_having_metadata(tmp_path):
    from driver.toolchain import build

    (tmp_path / "rvv_attn").mkdir()
    assert not build.stage_has_metadata(tmp_path)  # what stage_tree alone leaves
    (tmp_path / "rvv_attn-0.2.0.dist-info").mkdir()
    assert build.stage_has_metadata(tmp_path)


def test_one_more_configuration_at_once_while_sessions_run_beside(monkeypatch):
    monkeypatch.setattr(matrix.os, "cpu_count", lambda: 2)
    assert matrix.default_jobs() == 2
    assert matrix.default_jobs(()) == 2
    assert matrix.default_jobs((matrix.BESIDE,)) == 3
    # Two processes beside (a torch line's quick run) still add one: that pool holds a single configuration.
    assert matrix.default_jobs((("test-host",), ("test-sglang-quick",))) == 3


def test_each_process_beside_writes_its_own_log():
    assert matrix.beside_log(1).name == "beside.log"
    assert matrix.beside_log(2).name == "beside-2.log" and matrix.beside_log(2).parent == matrix.beside_log(1).parent
