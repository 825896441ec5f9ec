"""Warm targets under the real QEMU: the same results as a cold start, isolation, and signals.

Two targets (VLEN 128 and 256) serve a small pytest selection whose outcome
differs between the two VLENs; each result is compared with a cold
``qemu-riscv64 ... python3 -m pytest`` of the same selection.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest

from driver.testing import repro, testrun
from driver.toolchain import build, vlens
from driver.warm import targets as warm

VLENS = (128, 256)
PROBE = """\
import os

import rvv_attn
import torch


def test_vlen_is_128():  # passes at VLEN 128 only
    assert rvv_attn.runtime_info()["cpu_vlen"] == 128


def test_the_cpus_rvv_variant_is_active():
    info = rvv_attn.runtime_info()
    assert info["active_variant"] == os.environ["RVV_ATTN_EXPECT_VARIANT"] == f"vlen{info['cpu_vlen']}"


def test_kernel_runs_at_this_vlen():
    k = torch.zeros(8, 2, 40)
    key = torch.arange(2 * 2 * 40, dtype=torch.float32).reshape(2, 2, 40)
    torch.ops.rvv_attn.decode_set_kv_buffer(k, k.clone(), key, key, torch.tensor([5, 2]))
    assert torch.equal(k[5], key[0]) and torch.equal(k[2], key[1])


def test_leaves_global_state_behind():
    rvv_attn.select_variant("portable")
    os.environ["RVV_ATTN_PROBE_LEAK"] = "1"
    torch.set_num_threads(1)
    torch.manual_seed(1234)
"""
STATE = (
    "import os, rvv_attn, torch; print(rvv_attn.runtime_info()['active_variant'], "
    "os.environ.get('RVV_ATTN_PROBE_LEAK'), torch.get_num_threads(), torch.initial_seed())"
)


@pytest.fixture(scope="module")
def setup(qemu, sysroot, wheel, tmp_path_factory):
    base = tmp_path_factory.mktemp("warm")
    stage = build.stage_wheel(wheel, base / "stage")
    (base / "probe").mkdir()
    (base / "probe" / "test_probe.py").write_text(PROBE)
    targets = [warm.Target(v) for v in VLENS]
    yield base, stage, targets
    warm.stop(targets, base / "warm", report=lambda _: None)


def _pytest_cmd(qemu: Path, sysroot: Path, stage: Path, vlen: int, junit: Path) -> tuple[list[str], dict[str, str]]:
    return testrun.emulated_pytest(
        qemu, sysroot, stage, vlens.by_vlen(vlen), ["-p", "no:cacheprovider", "-q", "test_probe.py"], junit
    )


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def test_warm_and_cold_runs_agree_at_each_vlen(qemu, sysroot, setup):
    base, stage, targets = setup
    probe = base / "probe"
    cold: dict[int, subprocess.CompletedProcess] = {}

    def run_cold(vlen: int) -> None:
        cmd, env = _pytest_cmd(qemu, sysroot, stage, vlen, base / f"cold{vlen}.xml")
        cold[vlen] = _run(cmd, env, probe)

    # The cold runs and the targets' start-up overlap: both import torch under QEMU.
    threads = [threading.Thread(target=run_cold, args=(v,)) for v in VLENS]
    for t in threads:
        t.start()
    warm.start(targets, qemu, sysroot, idle_timeout=600, warm_dir=base / "warm", report=lambda _: None)
    for t in threads:
        t.join()
    outcomes = {}
    for vlen in VLENS:
        cmd, env = _pytest_cmd(qemu, sysroot, stage, vlen, base / f"warm{vlen}.xml")
        routed = warm.route(cmd, env, base / "warm")
        assert routed[1] == str(warm.CLIENT_SCRIPT), "the running target should have been used"
        hot = _run(routed, env, probe)
        cold_cases = repro.parse_junit_cases(base / f"cold{vlen}.xml")
        warm_cases = repro.parse_junit_cases(base / f"warm{vlen}.xml")
        assert len(cold_cases) == 4, cold[vlen].stdout + cold[vlen].stderr
        assert {t: c.status for t, c in warm_cases.items()} == {t: c.status for t, c in cold_cases.items()}
        assert hot.returncode == cold[vlen].returncode
        outcomes[vlen] = (hot.returncode, {t.rsplit("::", 1)[-1]: c.status for t, c in warm_cases.items()})
    # The selection does tell the VLENs apart, in both kinds of run.
    assert outcomes[128] == (
        0,
        dict.fromkeys(
            [
                "test_vlen_is_128",
                "test_the_cpus_rvv_variant_is_active",
                "test_kernel_runs_at_this_vlen",
                "test_leaves_global_state_behind",
            ],
            "passed",
        ),
    )
    assert outcomes[256][0] == 1 and outcomes[256][1]["test_vlen_is_128"] == "failed"
    assert [s for name, s in outcomes[256][1].items() if name != "test_vlen_is_128"] == ["passed"] * 3


def test_a_request_never_sees_what_an_earlier_one_changed(qemu, sysroot, setup):
    base, stage, targets = setup
    warm.start(targets[1:], qemu, sysroot, idle_timeout=600, warm_dir=base / "warm", report=lambda _: None)
    cmd, env = _pytest_cmd(qemu, sysroot, stage, 256, base / "again.xml")
    cmd[-1] += "::test_leaves_global_state_behind"
    assert _run(warm.route(cmd, env, base / "warm"), env, base / "probe").returncode == 0
    look = warm.route(
        testrun.emulated_pytest(qemu, sysroot, stage, vlens.by_vlen(256), [], base / "x.xml")[0][:6] + ["-c", STATE],
        env,
        base / "warm",
    )
    assert look[1] == str(warm.CLIENT_SCRIPT)
    seen = [_run(look, env, base) for _ in range(2)]
    assert [s.returncode for s in seen] == [0, 0], seen[0].stderr + seen[1].stderr
    (variant, leak, threads, seed), (*_, other_seed) = (s.stdout.split() for s in seen)
    # The auto-selected variant, no leaked variable, torch's default thread count ...
    assert (variant, leak) == ("vlen256", "None")
    assert int(threads) > 1 or subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() == "1"
    # ... and, as in a fresh interpreter, a fresh random seed in every run (not the earlier run's 1234).
    assert seed != other_seed and "1234" not in (seed, other_seed)


def test_a_native_fault_is_that_requests_failure_with_its_signal(qemu, sysroot, setup):
    base, stage, targets = setup
    warm.start(targets[1:], qemu, sysroot, idle_timeout=600, warm_dir=base / "warm", report=lambda _: None)
    cold_cmd, env = testrun.emulated_pytest(qemu, sysroot, stage, vlens.by_vlen(256), [], base / "x.xml")
    crash = cold_cmd[:6] + ["-c", "import ctypes; ctypes.string_at(0)"]
    cold = _run(crash, env, base)
    routed = warm.route(crash, env, base / "warm")
    assert routed[1] == str(warm.CLIENT_SCRIPT)
    hot = _run(routed, env, base)
    assert cold.returncode == hot.returncode == -signal.SIGSEGV
    assert "killed by signal SIGSEGV (11)" in hot.stderr
    # The target survives its child's fault and serves the next request.
    after = _run(warm.route(cold_cmd[:6] + ["-c", "print('still serving')"], env, base / "warm"), env, base)
    assert (after.returncode, after.stdout) == (0, "still serving\n")
