"""Host-side unit tests of the cross-toolchain driver (no network, no QEMU)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from driver import paths
from driver.errors import CommandFailed, ConfigError, IntegrityError
from driver.proc import run
from driver.testing import testrun
from driver.toolchain import archive, build, guest_commands, host_packages, sysroot, torch_lines, vlens

# ---- VLEN table ---------------------------------------------------------------------------------


def test_vlen_table_is_the_four_board_vlens_in_order():
    assert [v.vlen for v in vlens.variants()] == [128, 256, 512, 1024]
    assert [v.name for v in vlens.variants()] == ["vlen128", "vlen256", "vlen512", "vlen1024"]


def test_variant_flags_and_qemu_cpu():
    v = vlens.by_vlen(256)
    assert v.march == "rv64gcv_zvl256b"
    assert v.qemu_cpu() == "rv64,v=true,vlen=256,elen=64,vext_spec=v1.0"
    assert v.qemu_cpu(agnostic_ones=True).endswith(",rvv_ta_all_1s=on,rvv_ma_all_1s=on")


@pytest.mark.parametrize("bad", [96, 2048, 64, 300])
def test_vlen_table_rejects_impossible_vlens(bad):
    with pytest.raises(ValueError, match=str(bad)):
        vlens.parse_table(json.dumps({"vlens": [{"vlen": bad}]}))


def test_vlen_table_rejects_duplicates():
    with pytest.raises(ValueError, match="duplicate"):
        vlens.parse_table(json.dumps({"vlens": [{"vlen": 256}, {"vlen": 256}]}))


def test_unknown_vlen_lists_known_ones():
    with pytest.raises(ValueError, match="known: 128, 256, 512, 1024"):
        vlens.by_vlen(2048)


def test_github_matrix_comes_from_the_table():
    rows = json.loads(vlens.github_matrix())["include"]
    assert [r["vlen"] for r in rows if r["policy"] == "undisturbed"] == [128, 256, 512, 1024]
    assert [r["vlen"] for r in rows if r["policy"] == "agnostic"] == list(vlens.agnostic_lane())
    assert vlens.agnostic_lane(), "CI must run at least one VLEN with all-ones agnostic lanes"


def test_cmake_reads_the_same_table():
    cmake = (paths.PROJECT_ROOT / "cmake" / "RvvVariants.cmake").read_text()
    assert "toolchains/vlens.json" in cmake
    # No VLEN is spelled out in CMake: the list must come from the table.
    for v in vlens.variants():
        assert f"zvl{v.vlen}b" not in cmake


# ---- cache and archive configuration --------------------------------------------------------------


def test_cache_root_follows_xdg_and_override():
    assert paths.cache_root({"HOME": "/home/u"}) == Path("/home/u/.cache/rvv-attn")
    assert paths.cache_root({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == Path("/c/rvv-attn")
    assert paths.cache_root({"HOME": "/h", "XDG_CACHE_HOME": "/c", "RVV_ATTN_CACHE": "/x"}) == Path("/x")


DEB822 = """\
Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://other.example/debian
Suites: bookworm
Enabled: no
"""


def test_archive_from_deb822_sources_skips_security_and_disabled(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert archive.host_archives(tmp_path) == ["http://mirror.example/debian"]


def test_archive_from_one_line_sources(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# comment\n"
        "deb [arch=amd64 signed-by=/k.gpg] https://m.example/debian/ trixie main\n"
        "deb http://m.example/debian-security trixie-security main\n"
        "deb http://ppa.example/ubuntu noble main\n"
    )
    assert archive.host_archives(tmp_path) == ["https://m.example/debian"]


def test_archive_env_wins_and_missing_archive_names_the_variable(tmp_path):
    env = {archive.ARCHIVE_ENV: "https://m.example/debian/"}
    assert archive.debian_archive(env, tmp_path) == "https://m.example/debian"
    with pytest.raises(ConfigError, match=archive.ARCHIVE_ENV):
        archive.debian_archive({}, tmp_path)
    with pytest.raises(ConfigError, match="not an http"):
        archive.debian_archive({archive.ARCHIVE_ENV: "mirror.example"}, tmp_path)


def test_ubuntu_sources_give_no_debian_archive(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "ubuntu.sources").write_text(
        "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: noble noble-updates\nComponents: main\n"
    )
    assert archive.host_archives(tmp_path) == []


# ---- host prerequisites ---------------------------------------------------------------------------


def test_os_release_parsing():
    osr = host_packages.parse_os_release(
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'
    )
    assert (osr.id, osr.version_id, osr.codename, osr.is_debian_family) == ("debian", "12", "bookworm", True)
    assert not host_packages.parse_os_release("ID=fedora\n").is_debian_family


def test_missing_packages_uses_marker_files(tmp_path):
    present = tmp_path / "clang"
    present.touch()
    assert host_packages.missing_packages({"clang-19": str(present), "lld-19": str(tmp_path / "nope")}) == ["lld-19"]


def test_privilege_prefix():
    assert host_packages.privilege_prefix(euid=0) == []
    assert host_packages.privilege_prefix(euid=1000, sudo="") is None


def test_sessions_side_by_side_take_turns_with_apt_and_install_once(tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("RVV_ATTN_CACHE", str(tmp_path / "cache"))
    marker = tmp_path / "installed"
    running, runs, overlapped = threading.Event(), [], []

    def fake_run(cmd, **_):
        overlapped.append(running.is_set())
        running.set()
        time.sleep(0.2)  # long enough for the other thread to reach the lock
        if cmd[-1] == "libfoo":
            marker.touch()
            runs.append(cmd)
        running.clear()

    monkeypatch.setattr(host_packages, "run", fake_run)
    monkeypatch.setattr(host_packages, "privilege_prefix", lambda: [])
    monkeypatch.setattr(host_packages, "read_os_release", lambda: host_packages.parse_os_release("ID=debian\n"))
    monkeypatch.setattr(host_packages.shutil, "which", lambda name: f"/usr/bin/{name}")
    threads = [
        threading.Thread(target=host_packages.ensure_host_packages, args=({"libfoo": str(marker)},)) for _ in "ab"
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1, "the second session should find the package installed once it has its turn"
    assert overlapped and not any(overlapped), "two apt-get runs overlapped"


def test_install_command_is_noninteractive_apt():
    cmds = host_packages.install_command(["sudo", "-n"], ["clang-19", "lld-19"])
    assert cmds[0][:2] == ["sudo", "-n"] and cmds[0][-2:] == ["update", "-q"]
    assert cmds[1][-2:] == ["clang-19", "lld-19"] and "DEBIAN_FRONTEND=noninteractive" in cmds[1]


# ---- sysroot manifest, lock and cache key ---------------------------------------------------------


def test_manifest_key_ignores_package_order_and_changes_with_content():
    a = sysroot.Manifest("trixie", "riscv64", ("python3", "libtorch-dev"))
    b = sysroot.Manifest("trixie", "riscv64", ("libtorch-dev", "python3"))
    c = sysroot.Manifest("trixie", "riscv64", ("python3",))
    assert a.key() == b.key() != c.key()
    assert a.path().name == f"trixie-riscv64-{a.key()}"


@pytest.mark.parametrize("line", torch_lines.lines(), ids=lambda line: line.name)
def test_every_torch_line_has_what_the_suite_needs(line):
    m = sysroot.Manifest.for_line(line)
    assert m.arch == "riscv64" and m.torch == line.torch and m.lock_file == line.lock_file
    for pkg in ("python3", "python3-torch", "libtorch-dev", "python3-pytest", "python3-hypothesis", "libc6-dev"):
        assert pkg in m.packages
    assert line.lock_file.exists(), f"commit {line.lock_file.name}: the versions the last {line.suite} build got"


def test_torch_lines_default_is_trixie_and_the_knob_selects_another():
    assert torch_lines.default_line().suite == "trixie"
    assert torch_lines.active_line({}) == torch_lines.default_line()
    forky = torch_lines.active_line({"RVV_ATTN_TORCH_LINE": "2.14"})
    assert (forky.suite, forky.name) == ("forky", "torch2.14")
    assert torch_lines.find("torch2.14") == forky
    assert torch_lines.other_lines() == [forky]
    with pytest.raises(ConfigError, match="no torch line '2.99'") as err:
        torch_lines.active_line({"RVV_ATTN_TORCH_LINE": "2.99"})
    assert "2.6, 2.14" in str(err.value)


def test_the_default_trixie_sysroot_keeps_its_cache_key():
    """The table replaced toolchains/sysroot.json; an existing trixie sysroot stays valid (same key)."""
    m = sysroot.Manifest.for_line(torch_lines.default_line())
    assert m.key() == "86cce252d8ccbcdf"


def test_a_chosen_line_builds_in_a_folder_of_its_own():
    assert paths.line_folder({}) == ""
    assert paths.line_folder({"RVV_ATTN_TORCH_LINE": "2.14"}) == paths.line_folder({"RVV_ATTN_TORCH_LINE": "torch2.14"})
    assert paths.line_folder({"RVV_ATTN_TORCH_LINE": "2.14"}) == "torch2.14"


def test_a_rolling_suite_that_moved_to_another_torch_is_refused():
    line = torch_lines.find("2.14")
    m = sysroot.Manifest.for_line(line)
    sysroot.check_torch_line(m, {"python3-torch": "2.14.1+dfsg-1"})
    with pytest.raises(IntegrityError, match=r"now serves python3-torch 2.15.0\+dfsg-1, not torch 2.14.x"):
        sysroot.check_torch_line(m, {"python3-torch": "2.15.0+dfsg-1"})
    with pytest.raises(IntegrityError):
        sysroot.check_torch_line(m, {"python3-torch": "2.140.0-1"})
    assert "--aptopt=Acquire::Check-Valid-Until false" in sysroot.mmdebstrap_command(m, "http://m/debian", Path("/x"))
    trixie = sysroot.Manifest.for_line(torch_lines.default_line())
    assert not any("Valid-Until" in a for a in sysroot.mmdebstrap_command(trixie, "http://m/debian", Path("/x")))


def test_host_pins_follow_the_lines_lock(tmp_path):
    lock = tmp_path / "l.lock"
    lock.write_text("# header\npython3-hypothesis 6.130.5-2\npython3-numpy 1:2.4.6+ds-5+b1\n")
    line = dataclasses.replace(torch_lines.default_line(), lock=str(lock))
    assert sysroot.host_pin(line, "python3-hypothesis", "hypothesis") == "hypothesis==6.130.5"
    assert sysroot.host_pin(line, "python3-numpy", "numpy") == "numpy==2.4.6"
    assert sysroot.host_pin(line, "python3-absent", "absent") == "absent"


def test_deb_names_to_versions_and_lock_round_trip():
    names = "python3_3.13.5-1_riscv64.deb libfoo2_1%3a2.0-3_riscv64.deb junk.txt"
    versions = sysroot.parse_deb_names(names)
    assert versions == {"libfoo2": "1:2.0-3", "python3": "3.13.5-1"}
    m = sysroot.Manifest("trixie", "riscv64", ("python3",))
    assert sysroot.parse_lock(sysroot.format_lock(m, versions)) == versions
    assert sysroot.lock_drift(versions, {**versions, "python3": "3.13.6-1"}) == ["python3: 3.13.5-1 -> 3.13.6-1"]


def test_mmdebstrap_command_is_extract_only_and_keeps_debs():
    m = sysroot.Manifest("trixie", "riscv64", ("python3", "libtorch-dev"))
    cmd = sysroot.mmdebstrap_command(m, "http://m.example/debian", Path("/x"))
    assert cmd[:3] == ["mmdebstrap", "--variant=extract", "--architectures=riscv64"]
    assert "--include=python3,libtorch-dev" in cmd and "--skip=cleanup/apt/cache" in cmd
    assert cmd[-1].endswith("http://m.example/debian trixie main")


def test_fix_up_adds_merged_usr_and_blas_links_and_drops_empty_tmp(tmp_path):
    libdir = tmp_path / "usr/lib" / sysroot.TRIPLET
    (libdir / "blas").mkdir(parents=True)
    (libdir / "blas/libblas.so.3").touch()
    (libdir / "lapack").mkdir()
    (libdir / "lapack/liblapack.so.3").touch()
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "tmp").mkdir()
    sysroot.fix_up(tmp_path)
    assert (tmp_path / "lib").resolve() == (tmp_path / "usr/lib").resolve()
    assert (tmp_path / "include").is_symlink()  # keeps ninja's header dependencies resolvable
    sysroot.fix_up(tmp_path)  # idempotent: runs on every use of a cached sysroot
    assert (libdir / "libblas.so.3").resolve() == (libdir / "blas/libblas.so.3").resolve()
    assert (libdir / "liblapack.so.3").exists()
    assert not (tmp_path / "tmp").exists()


def test_fix_up_without_blas_provider_fails_loudly(tmp_path):
    (tmp_path / "usr/lib" / sysroot.TRIPLET).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="libblas.so.3"):
        sysroot.fix_up(tmp_path)


def test_half_built_sysroot_is_not_complete(tmp_path):
    assert not sysroot.is_complete(tmp_path, "abc")
    (tmp_path / sysroot.MARKER).write_text(json.dumps({"key": "old"}))
    assert not sysroot.is_complete(tmp_path, "abc")
    (tmp_path / sysroot.MARKER).write_text(json.dumps({"key": "abc"}))
    assert sysroot.is_complete(tmp_path, "abc")


# ---- command lines ---------------------------------------------------------------------------------


def test_guest_command_maps_python3_into_the_sysroot(tmp_path):
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3").symlink_to("python3.13")
    cmd = guest_commands.guest_command(Path("/q/qemu-riscv64"), tmp_path, vlens.by_vlen(128), ["python3", "-c", "1"])
    assert cmd == [
        "/q/qemu-riscv64",
        "-L",
        str(tmp_path),
        "-cpu",
        vlens.by_vlen(128).qemu_cpu(),
        str(tmp_path / "usr/bin/python3"),
        "-c",
        "1",
    ]
    assert guest_commands.guest_command(Path("/q"), tmp_path, None, ["/abs/prog"])[4:6] == [
        guest_commands.SCALAR_CPU,
        "/abs/prog",
    ]
    with pytest.raises(FileNotFoundError, match="gdb"):
        guest_commands.guest_command(Path("/q"), tmp_path, None, ["gdb"])


def test_guest_env_drops_the_host_environment():
    env = guest_commands.guest_env(
        Path("/stage"),
        Path("/t"),
        {
            "PATH": "/venv/bin",
            "PYTHONPATH": "/host",
            "HOME": "/h",
            "RVV_ATTN_VARIANT": "vlen128",
            "VIRTUAL_ENV": "/venv",
        },
    )
    assert env["PATH"] == "/usr/bin:/bin" and env["PYTHONPATH"] == "/stage" and env["HOME"] == "/h"
    assert env["RVV_ATTN_VARIANT"] == "vlen128" and "VIRTUAL_ENV" not in env and env["TMPDIR"] == "/t"
    assert env["RVV_ATTN_EMULATED"] == "qemu-riscv64"  # the board benchmark labels its times with it
    # Hypothesis's harvested constants are cached per user, not per checkout; a chosen place wins.
    assert env["HYPOTHESIS_STORAGE_DIRECTORY"] == "/h/.cache/rvv-attn/hypothesis"
    chosen = guest_commands.guest_env(None, Path("/t"), {"HOME": "/h", "HYPOTHESIS_STORAGE_DIRECTORY": "/hyp"})
    assert chosen["HYPOTHESIS_STORAGE_DIRECTORY"] == "/hyp"


def test_cross_wheel_args_use_the_toolchain_file_and_table_vlens():
    args = build.cross_wheel_args(Path("/sys"), Path("/out"), vlens.variants())
    joined = " ".join(args)
    assert f"cmake.toolchain-file={build.TOOLCHAIN_FILE}" in joined
    assert "wheel.tags=py3-none-linux_riscv64" in joined
    assert "cmake.define.RVV_ATTN_VLENS=128;256;512;1024" in joined
    assert "cmake.define.RVV_ATTN_SYSROOT=/sys" in joined


def test_host_builds_use_clang19_and_optionally_the_compiler_cache():
    plain = build.host_install_args(Path("/b"), ["X=1"])
    assert "cmake.define.CMAKE_CXX_COMPILER=clang++-19" in plain and "cmake.define.X=1" in plain
    assert not any("LAUNCHER" in a for a in plain)
    cached = build.host_install_args(Path("/b"), launcher="ccache")
    assert "cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache" in cached and cached[-1] == str(build.PROJECT_ROOT)


def test_only_the_portable_lane_runs_the_portable_build_under_qemu(tmp_path, monkeypatch):
    monkeypatch.setattr(testrun, "BUILD_DIR", tmp_path)
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3").touch()
    lane = vlens.portable_lane()
    assert lane == vlens.variants()[0].vlen
    seen = {}
    for v in vlens.variants():
        for agnostic in (False, True):
            _cmd, env = testrun.emulated_pytest(
                Path("/q"), tmp_path, tmp_path, v, ["tests"], tmp_path / "j.xml", agnostic_ones=agnostic
            )
            seen[(v.vlen, agnostic)] = env["RVV_ATTN_TEST_PORTABLE"]
    assert [k for k, flag in seen.items() if flag == "1"] == [(lane, False)]
    assert set(seen.values()) == {"0", "1"}


def test_junit_parsing(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="10" failures="1" errors="0" skipped="2" time="3.5"/></testsuites>')
    out = testrun.parse_junit(xml)
    assert (out.passed, out.failed, out.skipped, out.ok) == (7, 1, 2, False)
    assert out.line() == "7 passed, 1 failed, 2 skipped in 4 s"


def test_junit_deselected_count_is_read_from_the_suite_properties(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="0" errors="0" skipped="0" time="1"><properties>'
        '<property name="deselected" value="98"/></properties></testsuite></testsuites>'
    )
    out = testrun.parse_junit(xml)
    assert (out.passed, out.deselected, out.ok) == (3, 98, True)
    assert out.line() == "3 passed, 0 failed, 98 deselected in 1 s"


def test_a_configuration_that_collected_no_tests_is_not_ok(tmp_path, monkeypatch):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="0" failures="0" errors="0" skipped="0" time="0"><properties>'
        '<property name="deselected" value="5"/></properties></testsuite></testsuites>'
    )
    out = testrun.parse_junit(xml)
    assert not out.ok and out.line() == "no tests collected (5 deselected)"
    monkeypatch.setattr(testrun, "BUILD_DIR", tmp_path)
    testrun.write_summary("test-empty", 0, out)
    assert testrun.summary_table(0)[0].startswith("FAIL test-empty")


def test_failed_command_reports_command_code_and_output():
    with pytest.raises(CommandFailed) as info:
        run(["sh", "-c", "echo some detail; exit 3"], hint="do this")
    text = str(info.value)
    assert "exit code 3" in text and "sh -c" in text and "some detail" in text and "-> do this" in text


# ---- repro matrix -----------------------------------------------------------------------------------

from driver.testing import repro  # noqa: E402


def test_repro_options_are_split_from_pytest_arguments():
    opts, rest = repro.parse_posargs(
        [
            "--vlens=128,1024",
            "--policies=agnostic",
            "--no-host",
            "-k",
            "bf16",
            "tests/test_x.py",
            "--stop-at-first-failure",
        ]
    )
    assert opts.vlens == [128, 1024] and opts.policies == ["agnostic"] and not opts.host
    assert rest == ["-x", "-k", "bf16", "tests/test_x.py"]
    assert [c.label for c in repro.configurations(opts)] == ["vlen128-agnostic", "vlen1024-agnostic"]


def test_repro_default_matrix_is_host_plus_every_vlen_and_policy():
    opts, _ = repro.parse_posargs(["tests"])
    labels = [c.label for c in repro.configurations(opts)]
    assert labels[0] == "host" and len(labels) == 1 + 2 * len(vlens.variants())
    assert "vlen512-agnostic" in labels and "vlen512" in labels


@pytest.mark.parametrize("bad", [["--vlens=2048", "t"], ["--policies=ones", "t"], ["--no-host"]])
def test_repro_rejects_bad_options(bad):
    with pytest.raises(ConfigError):
        repro.parse_posargs(bad)


def test_repro_matrix_runs_configs_and_reports_failures(tmp_path):
    """Runs real subprocesses that write JUnit XML like pytest does."""

    def command_for(config, junit, out_dir):
        fail = config.label == "vlen128-agnostic"
        case = (
            '<testcase classname="tests.test_a" name="test_x"><failure message="assert 1 == 2"/></testcase>'
            if fail
            else '<testcase classname="tests.test_a" name="test_x"/>'
        )
        xml = f'<testsuites><testsuite tests="1">{case}</testsuite></testsuites>'
        return ["sh", "-c", f"printf '%s' '{xml}' > {junit}; exit {1 if fail else 0}"], {"PATH": "/usr/bin:/bin"}

    configs = repro.configurations(repro.parse_posargs(["--vlens=128", "t"])[0])
    results = repro.run_matrix(configs, command_for, tmp_path, jobs=2, report=lambda _: None)
    assert [r.ok for r in results] == [True, True, False]
    text = repro.format_matrix(results)
    assert "tests/test_a.py::test_x" in text and " F" in text and "assert 1 == 2" in text
    data = json.loads(repro.summary_json(results))
    assert data["vlen128-agnostic"]["tests"]["tests/test_a.py::test_x"]["status"] == "failed"


from driver.testing import demo  # noqa: E402


def test_demo_command_forces_the_sessions_variant_and_labels_the_run_emulated(tmp_path):
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3").touch()
    variant = vlens.by_vlen(512)
    cmd, env = demo.demo_command(
        Path("/q/qemu-riscv64"), tmp_path, Path("/stage"), variant, ["--requests", "2", "--kv-cache", "int8-dynamic"]
    )
    assert cmd[:5] == ["/q/qemu-riscv64", "-L", str(tmp_path), "-cpu", variant.qemu_cpu()]
    assert cmd[5:] == [
        str(tmp_path / "usr/bin/python3"),
        "-m",
        "rvv_attn.demo",
        "--requests",
        "2",
        "--kv-cache",
        "int8-dynamic",
    ]
    assert env["RVV_ATTN_VARIANT"] == "vlen512" and env["RVV_ATTN_QEMU_CPU"] == variant.qemu_cpu()
    assert env["PYTHONPATH"] == "/stage"
