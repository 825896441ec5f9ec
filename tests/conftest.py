"""Shared fixtures: which kernel variants can run here, and the run's header.

On the host only the portable variant runs. Under QEMU the session sets
RVV_ATTN_EXPECT_VARIANT; there every kernel test runs with that RVV variant
and, where RVV_ATTN_TEST_PORTABLE=1 (test-vlen128; the portable build runs
no vector instruction, so one VLEN covers it), also with the portable build
compiled for riscv64. A test marked ``rvv`` fails (it does not skip) if the
RVV variant is not active.

A test marked ``variant_independent`` cannot reach a kernel (the call is
refused before dispatch, or the test is Python-only or about packaging): it
gives the same answer at every VLEN, so `nox -t test` runs it once, not in
every emulated configuration (RVV_ATTN_VARIANT_INDEPENDENT=deselect drops it
from the others). The default is safe: an unmarked test runs everywhere. The
marker is checked: such a test fails if it looks up the active variant's
kernel table (every kernel call does) outside the ``kernel_variant`` fixture.

A test marked ``policy_independent`` checks nothing a vector instruction
computes (a child interpreter on another CPU, the scalar VLEN guard, feature
probing): the tail/mask policy cannot change its answer, so the all-ones
agnostic configurations deselect it and the undisturbed one at the same VLEN
runs it. It is checked like ``variant_independent``: it fails if it looks up
the kernel table.

A test marked ``sglang`` needs SGLang's real Python package: only the
test-sglang session runs it (RVV_ATTN_SGLANG=require), and there a failing
``import sglang`` stops the run; everywhere else such tests are deselected
(they import SGLang inside their fixtures, so collecting them needs none).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import __version__ as hypothesis_version
from hypothesis import core as hypothesis_core

_SEED = pytest.StashKey[int]()
_DESELECTED = pytest.StashKey[int]()
_LOOKUPS_AT_SETUP = pytest.StashKey[int]()
_LOOKUPS_EXCUSED = pytest.StashKey[int]()
_LOOKUP_REPORT = pytest.StashKey[dict]()

# Property-based tests: bounded by default (CI, emulated runs), many more
# examples on demand: HYPOTHESIS_PROFILE=dev. Each configuration draws from its
# own seed (the portable build on the host, each VLEN under QEMU), so the
# configurations explore different examples, yet every run of one
# configuration draws the same ones. The seed is printed in the report header;
# `--hypothesis-seed=N` replays a run (or explores another seed). A failure
# also prints the falsifying example and a @reproduce_failure blob.
_common = dict(
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        # kernel_variant only selects a variant: sharing it across examples is intended
        HealthCheck.function_scoped_fixture,
    ],
)
settings.register_profile("ci", max_examples=20, **_common)
settings.register_profile("dev", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

EXPECTED_VARIANT = os.environ.get("RVV_ATTN_EXPECT_VARIANT", "")
# "deselect" in every configuration of `nox -t test` but the one that runs the variant-independent tests.
VARIANT_INDEPENDENT = os.environ.get("RVV_ATTN_VARIANT_INDEPENDENT", "run")
# QEMU's all-ones tail/mask-agnostic policy (the agnostic configurations) shows in the CPU options the session set.
AGNOSTIC_POLICY = "rvv_ta_all_1s=on" in os.environ.get("RVV_ATTN_QEMU_CPU", "")
# "require" in the test-sglang session (SGLang must import; its tests run), "deselect" everywhere else.
SGLANG = os.environ.get("RVV_ATTN_SGLANG", "deselect")


def default_hypothesis_seed() -> int:
    """This configuration's seed: a hash of the variant under test (``host`` for the host's portable run)."""
    return zlib.crc32(f"rvv-attn/{EXPECTED_VARIANT or 'host'}".encode())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kernel-lookups-report",
        metavar="FILE",
        default=None,
        help="write, per test, how often it looked up the kernel table (JSON): which tests could be "
        "marked variant_independent",
    )


def pytest_configure(config: pytest.Config) -> None:
    given = config.getoption("hypothesis_seed", None)
    seed = int(given) if given is not None else default_hypothesis_seed()
    # The hypothesis plugin applies --hypothesis-seed the same way; without it, the configuration's own seed.
    hypothesis_core.global_force_seed = seed
    config.stash[_SEED] = seed


try:
    import rvv_attn
except Exception as err:  # noqa: BLE001 - reported by pytest_collection below
    rvv_attn = None
    IMPORT_ERROR: Exception | None = err
else:
    IMPORT_ERROR = None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if rvv_attn is None:
        return [f"rvv-attn: import failed: {IMPORT_ERROR}"]
    info = rvv_attn.runtime_info()
    vlen = info["cpu_vlen"]
    cpu = f"VLEN {vlen} (read from vlenb)" if vlen else "no RVV (V extension absent)"
    lines = [
        f"rvv-attn: CPU {cpu}; active variant {info['active_variant']}; "
        f"compiled: {', '.join(info['compiled_variants'])}; torch {info['torch']}",
    ]
    if os.environ.get("RVV_ATTN_QEMU_CPU"):
        lines.append(f"rvv-attn: qemu -cpu {os.environ['RVV_ATTN_QEMU_CPU']}")
    lines.append(f"rvv-attn: kernel tests run {' and '.join(runnable_variants())}")
    seed = config.stash[_SEED]
    lines.append(
        f"rvv-attn: hypothesis {hypothesis_version}, profile {settings.default.max_examples} examples, "
        f"seed {seed} (replay: --hypothesis-seed={seed})"
    )
    return lines


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[_DESELECTED] = config.stash.get(_DESELECTED, 0) + len(items)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    report = session.config.stash.get(_LOOKUP_REPORT, None)
    if report is not None:
        Path(session.config.getoption("kernel_lookups_report")).write_text(json.dumps(report, indent=1) + "\n")
    # Recorded in the JUnit XML (a <property> of the test suite) for the run summary.
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it; the summary then reports 0
        return
    xml = session.config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property("deselected", str(session.config.stash.get(_DESELECTED, 0)))


def pytest_sessionstart(session: pytest.Session) -> None:
    # A broken build must fail the run, never turn into skipped tests.
    if rvv_attn is None:
        raise pytest.UsageError(f"cannot import rvv_attn: {IMPORT_ERROR}")
    if session.config.getoption("kernel_lookups_report"):
        session.config.stash[_LOOKUP_REPORT] = {}
    if SGLANG not in ("require", "deselect"):
        raise pytest.UsageError(f"RVV_ATTN_SGLANG={SGLANG}: use 'require' (the test-sglang session) or 'deselect'")
    if SGLANG == "require":
        try:
            import sglang  # noqa: F401
        except Exception as err:  # noqa: BLE001 - any failure is the same error here
            raise pytest.UsageError(f"RVV_ATTN_SGLANG=require but SGLang does not import: {err!r}") from err


def rvv_active() -> bool:
    info = rvv_attn.runtime_info()
    return info["cpu_vlen"] > 0 and info["active_variant"] != "portable"


def runnable_variants() -> list[str]:
    """The variants the kernel tests run: portable (unless the session leaves it to another lane), plus the RVV
    one matching this CPU's VLEN."""
    info = rvv_attn.runtime_info()
    match = f"vlen{info['cpu_vlen']}"
    rvv = [match] if info["cpu_vlen"] and match in info["compiled_variants"] else []
    portable_here = os.environ.get("RVV_ATTN_TEST_PORTABLE", "1") != "0" or not rvv
    return (["portable"] if portable_here else []) + rvv


def _deselect(config: pytest.Config, items: list[pytest.Item], keyword: str) -> None:
    """Drop the items carrying ``keyword``, reported as "N deselected" in the summary line, not hidden."""
    dropped = [item for item in items if keyword in item.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if keyword not in item.keywords]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    both = [item.nodeid for item in items if "variant_independent" in item.keywords and "rvv" in item.keywords]
    if both:
        raise pytest.UsageError(
            f"marked both rvv and variant_independent (an RVV test depends on the variant): {', '.join(both)}"
        )
    if VARIANT_INDEPENDENT not in ("run", "deselect"):
        raise pytest.UsageError(
            f"RVV_ATTN_VARIANT_INDEPENDENT={VARIANT_INDEPENDENT}: use 'run' (the default) or "
            "'deselect' (a configuration other than the one that runs them)"
        )
    if VARIANT_INDEPENDENT == "deselect":
        _deselect(config, items, "variant_independent")
    if SGLANG == "deselect":
        _deselect(config, items, "sglang")
    if AGNOSTIC_POLICY:
        _deselect(config, items, "policy_independent")
    if EXPECTED_VARIANT:
        _deselect(config, items, "host_only")
    if EXPECTED_VARIANT == "portable":
        # The install test on a CPU without V: the portable build must be the
        # active one; the RVV tests cannot run there and are reported skipped.
        info = rvv_attn.runtime_info()
        if info["active_variant"] != "portable" or info["cpu_vlen"] != 0:
            raise pytest.UsageError(f"RVV_ATTN_EXPECT_VARIANT=portable (a CPU without V) but runtime_info() is {info}")
    elif rvv_active():
        return
    elif EXPECTED_VARIANT:
        # An emulated session whose RVV variant is not active: make it loud.
        raise pytest.UsageError(
            f"RVV_ATTN_EXPECT_VARIANT={EXPECTED_VARIANT} but the active variant is "
            f"{rvv_attn.runtime_info()['active_variant']}: the RVV build is missing or was not selected"
        )
    skip = pytest.mark.skip(
        reason="needs an RVV build at the CPU's VLEN: run `nox -s test-vlen256` (or another VLEN)"
        if not EXPECTED_VARIANT
        else "this CPU has no V extension"
    )
    for item in items:
        if "rvv" in item.keywords:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_variant" in metafunc.fixturenames:
        metafunc.parametrize("kernel_variant", runnable_variants(), indirect=True)


@pytest.fixture
def kernel_variant(request: pytest.FixtureRequest):
    """Run the test with one kernel variant selected, then restore the previous one."""
    before = _table_lookups()
    with rvv_attn.use_variant(request.param) as name:
        active = rvv_attn.runtime_info()["active_variant"]
        assert name == request.param and active == request.param, (
            f"asked for kernel variant {request.param}, but {active} is active"
        )
        # Selecting and checking the variant looks the table up; that is not the test reaching a kernel.
        stash = request.node.stash
        stash[_LOOKUPS_EXCUSED] = stash.get(_LOOKUPS_EXCUSED, 0) + _table_lookups() - before
        yield name


def _table_lookups() -> int:
    """How often an operator has looked up the active variant's kernel table in this process (C++ counter)."""
    return rvv_attn.ops.kernel_table_lookups()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    item.stash[_LOOKUPS_AT_SETUP] = _table_lookups()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Fail a variant_independent or policy_independent test that reached the kernels (in its fixtures' setup or
    its body)."""
    try:
        return (yield)
    finally:
        lookups = _table_lookups() - item.stash.get(_LOOKUPS_AT_SETUP, 0) - item.stash.get(_LOOKUPS_EXCUSED, 0)
        report = item.config.stash.get(_LOOKUP_REPORT, None)
        if report is not None:
            report[item.nodeid] = lookups
        for marker, depends_on in (("variant_independent", "the VLEN"), ("policy_independent", "the tail policy")):
            if lookups and marker in item.keywords:
                raise AssertionError(
                    f"{item.nodeid} is marked {marker} but looked up the kernel table {lookups} time(s): it "
                    "called a kernel (or asked for the variant's blocking or name), so its result can depend on "
                    f"{depends_on}. Remove the marker: it then runs in every emulated configuration."
                )
