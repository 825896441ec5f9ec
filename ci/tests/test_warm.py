"""Warm targets on the host: the same server and client, run with the host's Python instead of the target's.

The protocol, the fork-per-request isolation, exit statuses and signals do
not depend on the CPU; the emulated run is ci/toolchain_tests/test_warm_target.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.paths import cache_root
from driver.toolchain import build, vlens
from driver.warm import targets as warm

CPU = vlens.by_vlen(256).qemu_cpu()


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A folder shaped like a sysroot, so that cold command lines can be built and parsed."""
    root = tmp_path / "sysroot"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").touch()
    return root


@pytest.fixture
def server(tmp_path: Path, fake_root: Path):
    """A warm server for VLEN 256 run by the host's Python (nothing heavy preloaded)."""
    warm_dir = tmp_path / "warm"
    warm_dir.mkdir()
    target = warm.Target(256)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    info = warm.identity(target, Path("/q/qemu-riscv64"), fake_root, env)
    cmd = [
        sys.executable,
        str(warm.GUEST_SCRIPT),
        "--socket",
        str(target.socket_path(warm_dir)),
        "--idle-timeout",
        "60",
        "--preload",
        "json",
        "--info",
        json.dumps(info),
    ]
    log = (warm_dir / "server.log").open("w")
    proc = subprocess.Popen(
        cmd, env={**env, "ONLY_IN_THE_SERVER": "1"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while warm.ping(target.socket_path(warm_dir)) is None:
        assert proc.poll() is None, (warm_dir / "server.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield warm_dir, env, proc
    warm.stop([target], warm_dir, report=lambda _: None)
    proc.wait(10)
    log.close()


def _cold(fake_root: Path, *args: str) -> list[str]:
    return ["/q/qemu-riscv64", "-L", str(fake_root), "-cpu", CPU, str(fake_root / "usr/bin/python3"), *args]


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_route_sends_a_matching_command_to_the_running_target(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    cmd = warm.route(_cold(fake_root, "-c", "import sys; print(sys.argv[1:])", "a b"), env, warm_dir)
    assert cmd[:2] == [sys.executable, str(warm.CLIENT_SCRIPT)] and cmd[-3:] == ["-c", cmd[-2], "a b"]
    done = _run(cmd, env, tmp_path)
    assert (done.returncode, done.stdout) == (0, "['a b']\n"), done.stderr


def test_route_leaves_other_commands_cold(server, fake_root):
    warm_dir, env, _ = server
    other_cpu = _cold(fake_root, "-c", "1")
    other_cpu[4] = vlens.by_vlen(128).qemu_cpu()
    gdb = _cold(fake_root, "-c", "1")
    gdb[1:1] = ["-g", "1234"]
    for cold in (
        other_cpu,
        gdb,
        _cold(fake_root, "-X", "dev", "-c", "1"),
        _cold(fake_root, "-c"),
        ["/q/qemu-riscv64", "-L", str(fake_root), "-cpu", CPU, "/bin/true"],
    ):
        assert warm.route(cold, env, warm_dir) == cold
    # A start-up variable the target was not started with: cold.
    assert warm.route(_cold(fake_root, "-c", "1"), {**env, "OMP_NUM_THREADS": "1"}, warm_dir)[0] == "/q/qemu-riscv64"
    # ... while per-request variables are fine.
    assert (
        warm.route(_cold(fake_root, "-c", "1"), {**env, "PYTHONPATH": "/x", "RVV_ATTN_X": "1"}, warm_dir)[0]
        == sys.executable
    )


def test_nothing_running_means_cold(tmp_path, fake_root):
    cold = _cold(fake_root, "-m", "pytest")
    assert warm.route(cold, {}, tmp_path) == cold


def test_request_gets_the_callers_cwd_env_args_and_exit_status(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    (tmp_path / "work").mkdir()
    script = tmp_path / "work" / "prog.py"
    script.write_text(
        "import os, sys\nprint(os.getcwd(), os.environ['WHO'], sys.argv[1:], sys.path[0], "
        "os.environ.get('ONLY_IN_THE_SERVER'))\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    req_env = {**env, "WHO": "me", "PYTHONPATH": str(tmp_path)}
    done = _run(warm.route(_cold(fake_root, str(script), "7"), req_env, warm_dir), req_env, tmp_path / "work")
    assert done.returncode == 7
    assert done.stdout.split() == [str(tmp_path / "work"), "me", "['7']", str(tmp_path / "work"), "None"]


def test_module_form_sees_pythonpath_and_raises_like_python(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    pkg = tmp_path / "lib" / "probe_mod.py"
    pkg.parent.mkdir()
    pkg.write_text("import sys\nprint(sys.argv)\nraise ValueError('boom')\n")
    req_env = {**env, "PYTHONPATH": str(pkg.parent)}
    done = _run(warm.route(_cold(fake_root, "-m", "probe_mod", "x"), req_env, warm_dir), req_env, tmp_path)
    assert done.returncode == 1
    assert done.stdout == f"[{str(pkg)!r}, 'x']\n"
    assert "ValueError: boom" in done.stderr and "Traceback" in done.stderr


def test_a_child_never_sees_another_childs_state(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    mutate = (
        "import json, os, sys; json.dumps = None; os.environ['LEAK'] = '1'; sys.modules['leaked'] = json; "
        "open('f', 'w').close(); print(os.getpid())"
    )
    look = "import json, os, sys; print(json.dumps([os.environ.get('LEAK'), 'leaked' in sys.modules]), os.getpid())"
    first = _run(warm.route(_cold(fake_root, "-c", mutate), env, warm_dir), env, tmp_path)
    second = _run(warm.route(_cold(fake_root, "-c", look), env, warm_dir), env, tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    seen, pid = second.stdout.rsplit(" ", 1)
    assert seen == "[null, false]"
    assert int(pid) != int(first.stdout)


def test_a_crash_is_that_requests_signal_and_the_target_keeps_serving(server, fake_root, tmp_path):
    warm_dir, env, proc = server
    crash = _run(
        warm.route(_cold(fake_root, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), env, warm_dir),
        env,
        tmp_path,
    )
    assert crash.returncode == -signal.SIGSEGV
    assert "killed by signal SIGSEGV (11)" in crash.stderr
    again = _run(warm.route(_cold(fake_root, "-c", "print('alive')"), env, warm_dir), env, tmp_path)
    assert (again.returncode, again.stdout) == (0, "alive\n")
    assert proc.poll() is None


def test_ctrl_c_reaches_the_request(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    cmd = warm.route(_cold(fake_root, "-c", "import time; print('up', flush=True); time.sleep(60)"), env, warm_dir)
    # A terminal's Ctrl-C needs SIGINT deliverable; the process running this test may block it.
    client = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}),
    )
    assert client.stdout.readline() == "up\n"
    client.send_signal(signal.SIGINT)
    _out, err = client.communicate(timeout=30)
    # As CPython: the KeyboardInterrupt traceback, then death by SIGINT.
    assert client.returncode == -signal.SIGINT and "KeyboardInterrupt" in err


def test_the_request_has_the_callers_signal_mask(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    code = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    done = subprocess.run(
        warm.route(_cold(fake_root, "-c", code), env, warm_dir),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGUSR1}),
    )
    assert done.stdout == f"[{int(signal.SIGUSR1)}]\n", done.stderr


def test_stdout_is_block_buffered_into_a_pipe_and_stderr_line_buffered(server, fake_root, tmp_path):
    warm_dir, env, _ = server
    code = (
        "import sys; print(sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.isatty(), sys.stdin.read())"
    )
    done = subprocess.run(
        warm.route(_cold(fake_root, "-c", code), env, warm_dir),
        env=env,
        input="in",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "False True False in\n"


def test_idle_target_exits_and_removes_its_socket(tmp_path):
    sock = tmp_path / "t.sock"
    proc = subprocess.run(
        [sys.executable, str(warm.GUEST_SCRIPT), "--socket", str(sock), "--idle-timeout", "1", "--preload", ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "idle for" in proc.stdout
    assert not sock.exists()


def test_warm_options():
    opts = warm.parse_posargs(["--vlens=128,256", "--policies=all", "--idle-timeout=60"])
    assert [t.label for t in opts.targets] == ["vlen128", "vlen128-agnostic", "vlen256", "vlen256-agnostic"]
    assert opts.idle_timeout == 60 and not opts.stop
    assert warm.parse_posargs(["--stop"]).stop
    assert len(warm.parse_posargs(["--vlens=all", "--policies=all"]).targets) == 2 * len(vlens.variants())
    for bad in (["--vlens=2048"], ["--policies=ones"], ["--idle-timeout=0"], ["--frobnicate"]):
        with pytest.raises(ConfigError):
            warm.parse_posargs(bad)


def test_warm_dir_must_not_be_shadowed_by_the_sysroot(tmp_path):
    root = tmp_path / "root"
    (root / "work").mkdir(parents=True)
    with pytest.raises(ConfigError, match="RVV_ATTN_BUILD_DIR"):
        warm.check_warm_dir(Path("/work/x/build/warm"), root)
    warm.check_warm_dir(Path("/srv/x/build/warm"), root)
    with pytest.raises(ConfigError, match="shorter"):
        warm.check_warm_dir(Path("/srv/" + "x" * 120), root)


# ---- building only what runs ------------------------------------------------------------------------


def test_one_vlen_sessions_build_in_trees_of_their_own(tmp_path):
    full = build.cross_tree(build_dir=tmp_path)
    assert build.cross_tree(list(vlens.variants()), tmp_path) == full
    one = build.cross_tree([vlens.by_vlen(256)], tmp_path)
    assert one.build == tmp_path / "riscv64-vlen256" and one.stage == tmp_path / "stage-riscv64-vlen256"
    two = build.cross_tree([vlens.by_vlen(512), vlens.by_vlen(128)], tmp_path)
    assert two.build.name == "riscv64-vlen128-vlen512"
    # Trees at the same depth: ccache sees the same relative paths in each and shares its hits.
    assert len({len(t.build.relative_to(tmp_path).parts) for t in (full, one, two)}) == 1


def test_cross_wheel_args_pass_the_vlens_and_the_compiler_cache():
    args = build.cross_wheel_args(Path("/sys"), Path("/out"), [vlens.by_vlen(256)], launcher="ccache")
    assert "cmake.define.RVV_ATTN_VLENS=256" in args
    assert args[0] == "wheel" and "cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache" in args
    env = build.compiler_cache_env(Path("/src"))
    # Under the project's cache, wherever the user put it (RVV_ATTN_CACHE, XDG_CACHE_HOME or ~/.cache).
    assert env["CCACHE_BASEDIR"] == "/src" and env["CCACHE_DIR"] == str(cache_root() / "ccache")


def test_the_compiler_cache_follows_rvv_attn_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RVV_ATTN_CACHE", str(tmp_path))
    assert build.compiler_cache_env(Path("/src"))["CCACHE_DIR"] == str(tmp_path / "ccache")


def test_full_build_is_current_only_with_nothing_to_compile_and_a_newer_wheel(tmp_path, monkeypatch):
    tree = build.cross_tree(build_dir=tmp_path)
    fake_ninja = tmp_path / "ninja"
    fake_ninja.write_text('#!/bin/sh\necho "$NINJA_SAYS"\n')
    fake_ninja.chmod(0o755)
    assert not build.is_current(tree, str(fake_ninja))  # no wheel
    tree.build.mkdir()
    (tree.build / "build.ninja").touch()
    (tree.build / "librvv_attn_ops.so").touch()
    tree.wheels.mkdir()
    wheel = tree.wheels / f"rvv_attn-0.1.0-{build.RISCV_WHEEL_TAG}.whl"
    wheel.touch()
    later = time.time() + 5
    os.utime(wheel, (later, later))
    monkeypatch.setenv("NINJA_SAYS", "ninja: no work to do.")
    assert build.is_current(tree, str(fake_ninja))
    monkeypatch.setenv("NINJA_SAYS", "[1/3] Building CXX object x.o")
    assert not build.is_current(tree, str(fake_ninja))
    monkeypatch.setenv("NINJA_SAYS", "ninja: no work to do.")
    os.utime(wheel, (later - 3600 * 24 * 365 * 10,) * 2)  # older than the package sources
    assert not build.is_current(tree, str(fake_ninja))


def test_staging_the_same_wheel_twice_unpacks_it_once(tmp_path):

    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("rvv_attn/torch-2.6.0/librvv_attn_ops.so", b"lib")
        zf.writestr("rvv_attn/__init__.py", "")
    stage = build.stage_wheel(wheel, tmp_path / "stage")
    (stage / "rvv_attn" / "__init__.py").write_text("# touched")
    build.stage_wheel(wheel, stage)
    assert (stage / "rvv_attn" / "__init__.py").read_text() == "# touched"
    later = time.time() + 5
    os.utime(wheel, (later, later))
    build.stage_wheel(wheel, stage)
    assert (stage / "rvv_attn" / "__init__.py").read_text() == ""


def test_staging_a_tree_copies_the_package_and_library_and_drops_stale_files(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    tree = build.cross_tree([vlens.by_vlen(256)], tmp_path)
    tree.build.mkdir()
    (tree.build / build.LIBRARY).write_bytes(b"v1")
    (tree.build / build.LIBRARY_FOLDER_FILE).write_text("torch-2.14.1\n")  # generated by CMake
    (tree.stage / "rvv_attn" / "torch-2.6.0").mkdir(parents=True)
    (tree.stage / "rvv_attn" / "removed.py").write_text("")
    (tree.stage / "rvv_attn" / "torch-2.6.0" / build.LIBRARY).write_bytes(b"built against another torch")
    # The version file exists only in the tree's wheel (the wheel build writes it).
    tree.wheels.mkdir()
    with zipfile.ZipFile(tree.wheels / f"rvv_attn-0.1.dev1-{build.RISCV_WHEEL_TAG}.whl", "w") as zf:
        zf.writestr("rvv_attn/_version.py", "version = '0.1.dev1'\n")
    stage = build.stage_tree(tree, package)
    assert sorted(str(p.relative_to(stage / "rvv_attn")) for p in (stage / "rvv_attn").rglob("*") if p.is_file()) == [
        "__init__.py",
        "_version.py",
        f"torch-2.14.1/{build.LIBRARY}",
    ]
    assert (stage / "rvv_attn" / "_version.py").read_text() == "version = '0.1.dev1'\n"
    library = stage / "rvv_attn" / "torch-2.14.1" / build.LIBRARY
    inode = library.stat().st_ino
    (tree.build / build.LIBRARY).write_bytes(b"v2")
    build.stage_tree(tree, package)
    # Replaced by rename (a new file), so a process holding the old one is unaffected.
    assert library.read_bytes() == b"v2"
    assert library.stat().st_ino != inode


def test_build_tools_count_as_present_only_when_every_requirement_is_there(tmp_path):
    bin_dir = tmp_path / "venv" / "bin"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    bin_dir.mkdir(parents=True)
    (site / "scikit_build_core").mkdir(parents=True)
    for program in ("cmake", "ninja"):
        (bin_dir / program).write_text("")
    # A venv made before setuptools-scm became a build requirement.
    assert not build.build_tools_present(bin_dir)
    (site / "setuptools_scm").mkdir()
    assert build.build_tools_present(bin_dir)
    (bin_dir / "ninja").unlink()
    assert not build.build_tools_present(bin_dir)
