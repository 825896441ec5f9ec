"""The steps the nox sessions share (builds, release, warm, the VLEN sessions), run against a recording stand-in
for the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver import toolchain
from driver.errors import ConfigError
from driver.release import artefacts as release
from driver.session import reported_errors
from driver.testing import vlen_sessions
from driver.toolchain import build, build_steps, torch_lines, vlens
from driver.warm import targets as warm


class Recorder:
    """What the steps use of nox.Session: run and install record their arguments."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = str(bin_dir)
        self.runs: list[tuple[tuple[str, ...], dict]] = []
        self.installs: list[tuple[str, ...]] = []

    def run(self, *args: str, **kwargs) -> str:
        self.runs.append((args, kwargs))
        return ""

    def install(self, *args: str, **kwargs) -> None:
        self.installs.append(args)


@pytest.fixture
def session(tmp_path: Path) -> Recorder:
    return Recorder(tmp_path / "venv-bin")


@pytest.fixture
def no_host_packages(monkeypatch):
    monkeypatch.setattr(build_steps.host_packages, "ensure_host_packages", lambda *a, **k: None)


def _tree(tmp_path: Path) -> build.CrossTree:
    return build.CrossTree(tmp_path / "build", tmp_path / "wheels", tmp_path / "stage")


def test_stage_for_uses_the_full_build_when_it_is_current(session, tmp_path, monkeypatch, no_host_packages):
    full = _tree(tmp_path)
    monkeypatch.setattr(build_steps.build, "build_tools_present", lambda _: True)
    monkeypatch.setattr(build_steps.build, "cross_tree", lambda only=None: full)
    monkeypatch.setattr(build_steps.build, "is_current", lambda tree, ninja: tree is full)
    monkeypatch.setattr(build_steps.build, "newest_wheel", lambda folder: folder / "w.whl")
    monkeypatch.setattr(build_steps.build, "stage_wheel", lambda wheel, stage: stage)
    recorded = []
    monkeypatch.setattr(build_steps.build, "record_variants", lambda stage, vs: recorded.append(list(vs)) or stage)
    assert build_steps.stage_for(session, tmp_path, [vlens.by_vlen(256)]) == full.stage
    assert recorded == [list(vlens.variants())] and session.runs == [] and session.installs == []


def test_stage_for_runs_ninja_alone_in_a_configured_one_vlen_tree(session, tmp_path, monkeypatch, no_host_packages):
    tree = _tree(tmp_path)
    tree.build.mkdir()
    (tree.build / "build.ninja").write_text("")
    monkeypatch.setattr(build_steps.build, "build_tools_present", lambda _: False)
    monkeypatch.setattr(build_steps.build, "cross_tree", lambda only=None: tree)
    monkeypatch.setattr(build_steps.build, "is_current", lambda tree, ninja: False)
    monkeypatch.setattr(build_steps.build, "stage_has_metadata", lambda stage: True)
    monkeypatch.setattr(build_steps.build, "stage_tree", lambda t: t.stage)
    monkeypatch.setattr(build_steps.build, "record_variants", lambda stage, vs: stage)
    assert build_steps.stage_for(session, tmp_path, [vlens.by_vlen(256)]) == tree.stage
    assert session.installs == [tuple(build.BUILD_REQUIREMENTS)]
    assert [args for args, _ in session.runs] == [("ninja", "-C", str(tree.build))]


def test_cross_build_runs_pip_wheel_with_the_compiler_cache(session, tmp_path, monkeypatch, no_host_packages):
    monkeypatch.setattr(build_steps.build, "build_tools_present", lambda _: True)
    monkeypatch.setattr(build_steps.build, "newest_wheel", lambda folder: folder / "w.whl")
    wheel = build_steps.cross_build(session, Path("/sysroot"), tmp_path / "wheels", only=[vlens.by_vlen(128)])
    assert wheel == tmp_path / "wheels" / "w.whl"
    ((args, kwargs),) = session.runs
    assert args[:4] == ("python", "-m", "pip", "wheel") and args[-1] == str(build.PROJECT_ROOT)
    assert "cmake.define.RVV_ATTN_VLENS=128" in args and "CCACHE_DIR" in kwargs["env"]


def test_the_release_wheel_is_built_from_the_unpacked_sdist_once_per_torch_line():
    trees = set()
    for line in torch_lines.lines():
        args = release.wheel_from_sdist_args(
            Path(f"/sysroot-{line.suite}"), Path("/src/rvv_attn-1.0"), Path("/raw"), line
        )
        assert args[-1] == "/src/rvv_attn-1.0" and str(build.PROJECT_ROOT) not in args
        assert f"cmake.define.RVV_ATTN_VLENS={';'.join(str(v.vlen) for v in vlens.variants())}" in args
        assert f"cmake.define.RVV_ATTN_SYSROOT=/sysroot-{line.suite}" in args
        trees |= {a for a in args if a.startswith("build-dir=")}
    assert len(trees) == len(torch_lines.lines())  # a tree of its own per line: both stay incremental


def test_checked_artefacts_want_one_of_each_and_the_tag(tmp_path, monkeypatch):
    monkeypatch.setattr(release, "check_release_wheel", lambda wheel, version, lines=None: None)
    with pytest.raises(release.DriverError, match="expected one sdist"):
        release.checked_artefacts(tmp_path)
    (tmp_path / "rvv_attn-1.0.tar.gz").write_bytes(b"")
    (tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl").write_bytes(b"")
    wheel, sdist = release.checked_artefacts(tmp_path, tag="v1.0")
    assert (wheel.suffix, sdist.name) == (".whl", "rvv_attn-1.0.tar.gz")
    with pytest.raises(release.DriverError, match="tag v1.1 does not match"):
        release.checked_artefacts(tmp_path, tag="v1.1")


def test_warm_status_says_how_to_start_targets_when_none_runs(tmp_path):
    lines = warm.status_lines(tmp_path)
    assert lines[0] == "no warm target is running" and "--vlens=256" in lines[1]


def test_a_driver_error_carries_its_hint_into_the_session_message():
    assert str(ConfigError("bad option", "use --jobs=N")) == "bad option\n  -> use --jobs=N"


class Quit(Exception):
    pass


def test_reported_errors_turn_a_driver_error_into_the_sessions_error(session):
    messages = []

    def error(message):
        messages.append(message)
        raise Quit

    session.error = error
    with pytest.raises(Quit), reported_errors(session):
        raise ConfigError("bad option", "use --jobs=N")
    assert messages == ["bad option\n  -> use --jobs=N"]
    with pytest.raises(ValueError), reported_errors(session):  # anything else is a bug: traceback
        raise ValueError("bug")


def test_each_vlen_session_says_where_it_runs():
    variant = vlens.by_vlen(256)
    docs = vlen_sessions.vlen_session_docs(variant, portable_lane=True)
    assert set(docs) == {"test", "agnostic", "shell", "demo"}
    assert f"at VLEN 256 ({variant.board}), for its RVV build and the portable one, " in docs["test"]
    assert "one QEMU process per core (--jobs=N" in docs["test"]
    assert "portable" not in vlen_sessions.vlen_session_docs(variant, portable_lane=False)["test"]
    assert all("\n" not in doc for doc in docs.values())  # nox -l shows the first line


def test_warm_without_options_lists_and_with_stop_stops(monkeypatch):
    lines = []
    monkeypatch.setattr(warm, "running", lambda warm_dir=None: [])
    warm.run_session([], report=lines.append)
    assert lines[0] == "no warm target is running"
    monkeypatch.setattr(warm, "stop", lambda report: 0)
    lines.clear()
    warm.run_session(["--stop"], report=lines.append)
    assert lines == ["no warm target was running"]


def test_an_emulated_suite_refuses_a_bad_job_count_before_it_builds_anything(session, monkeypatch):
    monkeypatch.setattr(toolchain, "ensure", lambda: pytest.fail("the toolchain must not be touched"))
    with pytest.raises(ConfigError, match="--jobs=0"):
        vlen_sessions.emulated_suite(session, vlens.by_vlen(256), False, ["--jobs=0", "tests"])


def test_an_emulated_suite_hands_its_job_count_and_pytest_arguments_on(session, tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(toolchain, "ensure", lambda: (tmp_path / "qemu", tmp_path / "root"))
    monkeypatch.setattr(toolchain, "stage_for", lambda *a: tmp_path / "stage")

    def run(qemu, root, stage, variant, args, agnostic_ones, label, jobs):
        seen.update(args=args, label=label, jobs=jobs, agnostic=agnostic_ones)
        return 0, None

    monkeypatch.setattr(vlen_sessions.testrun, "run_emulated_pytest", run)
    vlen_sessions.emulated_suite(session, vlens.by_vlen(512), True, ["--jobs=3", "tests/test_mla.py", "-x"])
    assert seen == {"args": ["tests/test_mla.py", "-x"], "label": "test-vlen512-agnostic", "jobs": 3, "agnostic": True}
    vlen_sessions.emulated_suite(session, vlens.by_vlen(512), False, [])
    assert seen["args"] == ["tests"] and seen["label"] == "test-vlen512" and seen["jobs"] >= 1
