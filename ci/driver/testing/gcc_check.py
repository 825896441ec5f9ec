"""``./ci/nox -s gcc-check``: the decode kernel built by each riscv64 compiler at each level and VLEN, run
under QEMU and compared with a float64 reference (ci/gcc/decode_check.cpp).

GCC 14's vsetvl pass once made wrong decode code from our source (docs/gcc.md); this is the check that
shows whether any compiler at hand still does. Each build is the kernel source alone, linked statically,
so a case takes seconds and needs neither torch nor the sysroot's Python.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..errors import CommandFailed, ConfigError
from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import log, run
from ..toolchain import cross_gcc, host_packages, vlens

SOURCE = PROJECT_ROOT / "ci" / "gcc" / "decode_check.cpp"
KERNELS = PROJECT_ROOT / "csrc" / "kernels"
RESULTS = BUILD_DIR / "results" / "gcc-check"
# clang19 is the host's (the wheel's compiler); clang21 is forky's, from the same root as the GCCs.
COMPILERS = ("gcc14", "gcc15", "gcc16", "clang19", f"clang{cross_gcc.CLANG_VERSION}")
LEVELS = ("O1", "O2", "O3")
# As the library's Release build compiles a variant (cmake/RvvVariants.cmake): position-independent, no
# asserts. GCC 14's fault at -O3 shows only with both.
LIBRARY_FLAGS = ("-fPIC", "-DNDEBUG", "-std=c++17")


@dataclass(frozen=True)
class Case:
    compiler: str
    level: str
    vlen: int

    @property
    def name(self) -> str:
        return f"{self.compiler}-{self.level}-vlen{self.vlen}"


@dataclass(frozen=True)
class Options:
    compilers: tuple[str, ...] = COMPILERS
    levels: tuple[str, ...] = LEVELS
    vlens: tuple[int, ...] = ()


def parse_posargs(posargs: Sequence[str]) -> Options:
    """``--compilers=gcc14,clang19 --levels=O2 --vlens=256``; each defaults to all."""
    chosen: dict[str, tuple] = {}
    known_vlens = tuple(v.vlen for v in vlens.variants())
    for arg in posargs:
        name, _, value = arg.partition("=")
        items = tuple(x.strip() for x in value.split(",") if x.strip())
        if name == "--compilers" and items and set(items) <= set(COMPILERS):
            chosen["compilers"] = items
        elif name == "--levels" and items and set(items) <= set(LEVELS):
            chosen["levels"] = items
        elif name == "--vlens" and items and all(x.isdigit() and int(x) in known_vlens for x in items):
            chosen["vlens"] = tuple(int(x) for x in items)
        else:
            raise ConfigError(
                f"gcc-check: cannot use {arg!r}; options: --compilers={','.join(COMPILERS)} "
                f"--levels={','.join(LEVELS)} --vlens={','.join(map(str, known_vlens))} (each a subset)"
            )
    options = Options(**chosen)
    return options if options.vlens else Options(options.compilers, options.levels, known_vlens)


def plan(options: Options) -> list[Case]:
    return [Case(c, level, v) for c in options.compilers for level in options.levels for v in options.vlens]


def variant_flags(vlen: int) -> list[str]:
    return [
        f"-march=rv64gcv_zvl{vlen}b",
        "-mabi=lp64d",
        "-mrvv-vector-bits=zvl",
        f"-DRVV_ATTN_VARIANT=vlen{vlen}",
        f"-DRVV_ATTN_VLEN={vlen}",
    ]


def compile_args(case: Case, output: str) -> list[str]:
    """Arguments relative to the staged folder (which holds decode_check.cpp and kernels/)."""
    flags = [f"-{case.level}", *LIBRARY_FLAGS, *variant_flags(case.vlen)]
    return [*flags, "-static", "-I.", "decode_check.cpp", "-o", output]


def parse_report(output: str) -> dict[str, str]:
    """dtype -> "ok" or "WRONG", from decode_check's summary lines."""
    verdicts = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) > 2 and words[0] in ("ok", "WRONG") and words[2].startswith("vlen="):
            verdicts[words[1]] = words[0]
    return verdicts


def stage_sources(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(KERNELS, folder / "kernels")
    shutil.copy2(SOURCE, folder / "decode_check.cpp")


def format_table(rows: dict[Case, dict[str, str]], options: Options) -> str:
    lines = ["| compiler | level | " + " | ".join(f"VLEN {v}" for v in options.vlens) + " |"]
    lines.append("|---|---|" + "---|" * len(options.vlens))
    for compiler in options.compilers:
        for level in options.levels:
            cells = []
            for vlen in options.vlens:
                verdicts = rows.get(Case(compiler, level, vlen), {})
                wrong = [d for d, v in verdicts.items() if v != "ok"]
                cells.append(
                    "ok" if verdicts and not wrong else ("wrong: " + ", ".join(wrong) if wrong else "crash or no build")
                )
            lines.append(f"| {compiler} | {level} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_session(posargs: Sequence[str]) -> None:
    options = parse_posargs(posargs)
    cases = plan(options)
    # The pinned QEMU, and the sysroot for clang's static libstdc++ and libc.
    qemu, sysroot = toolchain.ensure()
    versions = sorted({int(c[3:]) for c in options.compilers if c.startswith("gcc")})
    gccs = {g.name: g for g in cross_gcc.ensure(versions)} if versions else {}
    if f"clang{cross_gcc.CLANG_VERSION}" in options.compilers:
        clang = cross_gcc.root_clang()
        gccs[clang.name] = clang
    prefix = host_packages.privilege_prefix() or []
    RESULTS.mkdir(parents=True, exist_ok=True)
    for gcc in gccs.values():
        log(f"{gcc.name}: {gcc.version_line(prefix)}{' (in ' + str(gcc.root) + ')' if gcc.root else ''}")

    rows: dict[Case, dict[str, str]] = {}
    started = time.monotonic()
    for index, case in enumerate(cases, 1):
        gcc = gccs.get(case.compiler)
        folder = (gcc.stage(BUILD_DIR / "gcc-check") if gcc else BUILD_DIR / "gcc-check") / case.name
        if gcc and gcc.root:
            run([*prefix, "rm", "-rf", str(folder)])
            run([*prefix, "install", "-d", "-o", str(os.getuid()), "-g", str(os.getgid()), str(folder)])
        stage_sources(folder)
        if gcc:
            cmd = gcc.command(compile_args(case, "decode_check"), folder, prefix)
        else:
            cmd = ["clang++-19", "--target=riscv64-linux-gnu", f"--sysroot={sysroot}", "-fuse-ld=lld"]
            cmd += compile_args(case, "decode_check")
        case_start = time.monotonic()
        try:
            run(cmd, cwd=folder)
            cpu = vlens.Variant(case.vlen).qemu_cpu(False)
            output = _run_allowing_wrong([str(qemu), "-cpu", cpu, str(folder / "decode_check")])
            rows[case] = parse_report(output)
        except CommandFailed as failure:  # the build failed, or the program crashed (a negative status: signal)
            rows[case] = {}
            (RESULTS / f"{case.name}.log").write_text(
                f"{' '.join(failure.cmd)}\nexit status {failure.returncode}\n{failure.output}"
            )
        verdicts = rows[case]
        status = "ok" if verdicts and all(v == "ok" for v in verdicts.values()) else "WRONG"
        detail = (
            ", ".join(f"{d} {v}" for d, v in verdicts.items()) or f"build failed or crashed: {RESULTS / case.name}.log"
        )
        log(f"[{index}/{len(cases)}] {case.name}: {status} ({detail}) in {time.monotonic() - case_start:.0f} s")

    table = format_table(rows, options)
    print(table)
    (RESULTS / "table.md").write_text(table + "\n")
    (RESULTS / "results.json").write_text(
        json.dumps({case.name: verdicts for case, verdicts in rows.items()}, indent=2) + "\n"
    )
    bad = [case.name for case, verdicts in rows.items() if not verdicts or any(v != "ok" for v in verdicts.values())]
    log(f"{len(cases)} builds checked in {time.monotonic() - started:.0f} s; table in {RESULTS / 'table.md'}")
    if bad:
        raise ConfigError(f"gcc-check: the decode kernel is wrong or did not build for {', '.join(bad)}")


def _run_allowing_wrong(cmd: list[str]) -> str:
    """decode_check's exit status counts wrong cases; its summary lines say which, so keep them."""
    try:
        return run(cmd)
    except CommandFailed as failure:
        if parse_report(failure.output):
            return failure.output
        raise
