"""The builds as steps of a nox session: the riscv64 wheel, the library staged for some VLENs, the host build.

They install what the builds need into the session's venv and run them
there (``session.run``), through the compiler cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import DriverError
from ..paths import BUILD_DIR
from ..proc import Stopwatch, log
from ..session import Session
from . import build, host_packages
from .vlens import Variant, variants


def install_build_tools(session: Session) -> None:
    # pip's own "already satisfied" check costs seconds: skip it when the tools are there.
    if not build.build_tools_present(Path(session.bin)):
        session.install(*build.BUILD_REQUIREMENTS)


def cross_build(
    session: Session,
    root: Path,
    out_dir: Path = BUILD_DIR / "wheels",
    debug: bool = False,
    only: Sequence[Variant] | None = None,
) -> Path:
    """Build (incrementally) the riscv64 wheel with the portable build and every VLEN variant (or ``only``)."""
    install_build_tools(session)
    host_packages.ensure_host_packages(build.COMPILER_CACHE_PACKAGES)
    kind: dict[str, Any] = dict(build_dir=BUILD_DIR / "riscv64-debug", build_type="RelWithDebInfo") if debug else {}
    if only:
        kind = dict(build_dir=build.cross_tree(only).build)
    what = f"portable + {', '.join(v.name for v in only)}" if only else "portable + every VLEN variant"
    with Stopwatch(f"cross-building the riscv64 wheel ({what}; incremental)"):
        session.run(
            "python",
            "-m",
            "pip",
            *build.cross_wheel_args(root, out_dir, only or variants(), launcher="ccache", **kind),
            silent=True,
            env=build.compiler_cache_env(),
        )
    return build.newest_wheel(out_dir)


def stage_for(session: Session, root: Path, only: Sequence[Variant]) -> Path:
    """The library for a session that runs only ``only``: the full build if it is current, else portable + those."""
    install_build_tools(session)
    full = build.cross_tree()
    if build.is_current(full, str(Path(session.bin) / "ninja")):
        log("the full build (every VLEN) is current: using it")
        stage = build.stage_wheel(build.newest_wheel(full.wheels), full.stage)
        return build.record_variants(stage, variants())
    tree = build.cross_tree(only)
    # Configured and staged from a wheel before: ninja alone compiles what changed.
    if (tree.build / "build.ninja").exists() and build.stage_has_metadata(tree.stage):
        with Stopwatch(f"building portable + {', '.join(v.name for v in only)} in {tree.build} (incremental)"):
            session.run("ninja", "-C", str(tree.build), env=build.compiler_cache_env(), silent=True)
        stage = build.stage_tree(tree)
    else:
        stage = build.stage_wheel(cross_build(session, root, tree.wheels, only=only), tree.stage)
    return build.record_variants(stage, sorted(only, key=lambda v: v.vlen))


def host_build(
    session: Session, requirements: Sequence[str], build_dir: Path = BUILD_DIR / "host", defines: Sequence[str] = ()
) -> None:
    """Install ``requirements`` (the host's torch, the test tools), then build and install the portable kernels."""
    host_packages.ensure_host_packages({**host_packages.HOST_PACKAGES, **build.COMPILER_CACHE_PACKAGES})  # one apt run
    session.install(*requirements, *build.BUILD_REQUIREMENTS)
    with Stopwatch("building the portable kernels for the host (incremental)"):
        session.run(
            "python",
            "-m",
            "pip",
            *build.host_install_args(build_dir, list(defines), launcher="ccache"),
            silent=True,
            env=build.compiler_cache_env(),
        )


def sanitizer_env(session: Session) -> dict[str, str]:
    """After host_build of the sanitized kernels: check the installed library is sanitized, return the
    environment that preloads the ASan runtime."""
    package_dir = session.run(
        "python",
        "-c",
        "import importlib.util as u; print(u.find_spec('rvv_attn').submodule_search_locations[0])",
        silent=True,
    ).strip()
    libraries = list(Path(package_dir).glob(f"{build.LIBRARY_FOLDER_PREFIX}*/{build.LIBRARY}"))
    if len(libraries) != 1:
        raise DriverError(f"expected one operator library in {package_dir}, found {len(libraries)}")
    build.check_sanitized(libraries[0])
    runtime = session.run(
        "clang++-19", "-print-file-name=libclang_rt.asan-x86_64.so", silent=True, external=True
    ).strip()
    return build.sanitizer_env(runtime)
