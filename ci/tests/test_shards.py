"""Splitting one configuration's suite over several processes (ci/driver/testing/shards.py), without QEMU."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.testing import shards, testrun


def _tree(root: Path, *files: str) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_folders_expand_to_their_test_files_and_options_stay_in_order(tmp_path):
    _tree(tmp_path, "tests/test_b.py", "tests/test_a.py", "tests/helpers.py", "tests/sub/test_c.py")
    sel = shards.split_selection(["-x", "tests", "-k", "decode and not slow", "-q"], root=tmp_path)
    assert sel is not None
    assert sel.files == ["tests/sub/test_c.py", "tests/test_a.py", "tests/test_b.py"]
    assert sel.options == ["-x", "-k", "decode and not slow", "-q"]


def test_a_node_id_or_no_file_keeps_one_process(tmp_path):
    _tree(tmp_path, "tests/test_a.py")
    assert shards.split_selection(["tests/test_a.py::test_one"], root=tmp_path) is None
    assert shards.split_selection(["-k", "nothing"], root=tmp_path) is None


def test_a_file_named_twice_runs_once(tmp_path):
    _tree(tmp_path, "tests/test_a.py", "tests/test_b.py")
    sel = shards.split_selection(["tests/test_a.py", "tests"], root=tmp_path)
    assert sel is not None and sel.files == ["tests/test_a.py", "tests/test_b.py"]


def test_deal_balances_by_the_last_times_and_keeps_every_file_once():
    files = ["a", "b", "c", "d", "e"]
    seconds = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 10.0, "e": 5.0}
    groups = shards.deal(files, seconds, 2)
    assert sorted(f for g in groups for f in g) == files
    loads = sorted(sum(seconds[f] for f in g) for g in groups)
    # Heaviest first, each to the lighter group: a | b, c joins b (60 < 100), d joins a, e joins the first of
    # two equal groups: {a, d, e} 115 and {b, c} 110, within the lightest file of each other.
    assert loads == [110.0, 115.0]
    assert all(g == sorted(g) for g in groups)  # each group in the given order


def test_deal_without_times_spreads_evenly_and_never_makes_empty_groups():
    groups = shards.deal(["a", "b", "c", "d"], {}, 2)
    assert sorted(len(g) for g in groups) == [2, 2]
    assert shards.deal(["a"], {}, 4) == [["a"]]


def test_an_unknown_file_weighs_the_median_of_the_known_ones():
    groups = shards.deal(["big", "small", "new"], {"big": 90.0, "small": 10.0}, 2)
    # "new" weighs the median (90, the upper middle of two), as much as "big": they go to different processes.
    assert not any({"big", "new"} <= set(g) for g in groups)
    assert sorted(f for g in groups for f in g) == ["big", "new", "small"]


def _junit(path: Path, cases: dict[str, float], failures: int = 0, deselected: int = 0) -> None:
    suite = ET.Element(
        "testsuite",
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped="0",
        time=str(sum(cases.values())),
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="deselected", value=str(deselected))
    for name, secs in cases.items():
        module, _, test = name.partition("::")
        ET.SubElement(suite, "testcase", classname=module, name=test, time=str(secs))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path)


def test_merged_reports_count_like_one_run(tmp_path):
    _junit(tmp_path / "1.xml", {"tests.test_a::t1": 2.0, "tests.test_a::t2": 3.0}, deselected=1)
    _junit(tmp_path / "2.xml", {"tests.test_b::t1": 4.0}, failures=1, deselected=2)
    merged = tmp_path / "junit.xml"
    shards.merge_junit([tmp_path / "1.xml", tmp_path / "2.xml", tmp_path / "missing.xml"], merged)
    outcome = testrun.parse_junit(merged)
    assert (outcome.passed, outcome.failed, outcome.deselected) == (2, 1, 3)
    assert outcome.seconds == pytest.approx(9.0)
    assert testrun.seconds_per_file(merged) == {"tests/test_a.py": 5.0, "tests/test_b.py": 4.0}


def test_shards_run_at_once_and_each_keeps_its_log(tmp_path):
    def command_for(files, junit):
        code = f"import sys, time; time.sleep(1); print('ran', {files!r}); sys.exit({1 if 'bad' in files else 0})"
        return [sys.executable, "-c", code], {}

    seen: list[str] = []
    results = shards.run_shards([["good"], ["bad"]], command_for, tmp_path, seen.append, progress_every=0)
    assert sorted(r.returncode for r in results) == [0, 1]
    # Both ran in parallel: together well under the 2 s they would take one after the other.
    assert max(r.seconds for r in results) < 1.9
    assert "ran ['bad']" in (tmp_path / "pytest-shard2.log").read_text()
    assert any("FAILED (exit 1)" in line for line in seen)


def test_summary_lines_take_the_failures_or_the_final_line(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text(
        "tests/test_a.py ..F [100%]\n=== short test summary info ===\nFAILED tests/test_a.py::t - x\n"
        "=== 1 failed, 2 passed in 3.00s ===\n"
    )
    assert shards.summary_lines(log, failures=True)[1].startswith("FAILED")
    assert shards.summary_lines(log, failures=False) == ["=== 1 failed, 2 passed in 3.00s ==="]
    assert shards.progress(log) == "100%"


def test_jobs_come_off_the_front_of_the_pytest_arguments():
    assert shards.take_jobs(["--jobs=3", "tests", "-x"], 2) == (3, ["tests", "-x"])
    assert shards.take_jobs(["tests"], 2) == (2, ["tests"])
    with pytest.raises(ConfigError, match="--jobs=0"):
        shards.take_jobs(["--jobs=0"], 2)
