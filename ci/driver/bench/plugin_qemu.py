"""A plugin-capable qemu-riscv64 of the pinned version, built from Debian's source package.

The pinned QEMU (toolchains/qemu.lock.json) is Debian's static qemu-user: it
cannot load TCG plugins, and counting instructions needs one.  So the benchmark
uses a second binary of the same version, built from the same Debian source
package (upstream tarball plus Debian's patches, fetched through a private apt
configuration with a ``deb-src`` line), configured for riscv64 user mode with
plugins enabled.  The tests keep running on the pinned binary.

The build (about 1.5 minutes on 2 cores) is cached under
``<cache>/qemu-plugins/<version>/`` next to the plugin API header it was built
with, and guarded by a file lock like the sysroot.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommandFailed, IntegrityError
from ..paths import PROJECT_ROOT, cache_lock, cache_root
from ..proc import Stopwatch, log, run
from ..toolchain import archive, host_packages
from ..toolchain.private_apt import PrivateApt
from ..toolchain.qemu import PIN_FILE, QemuPin, qemu_version

# Bump when the configure flags or what is kept change, so caches rebuild.
RECIPE_VERSION = 1
MARKER = "build.json"
SOURCE_PACKAGE = "qemu"
CONFIGURE_FLAGS = (
    "--target-list=riscv64-linux-user",
    "--enable-plugins",
    "--disable-system",
    "--disable-tools",
    "--disable-docs",
    "--disable-werror",
    # The "+ds" source drops the firmware blobs and bundled wheels.
    "--disable-install-blobs",
)
# What QEMU's build needs from apt (marker files, as in host_packages.HOST_PACKAGES).
BUILD_PACKAGES: dict[str, str] = {
    "gcc": "/usr/bin/gcc",
    "libglib2.0-dev": "/usr/include/glib-2.0/glib.h",
    "ninja-build": "/usr/bin/ninja",
    "pkg-config": "/usr/bin/pkg-config",
    "flex": "/usr/bin/flex",
    "bison": "/usr/bin/bison",
    "dpkg-dev": "/usr/bin/dpkg-source",
}
# ... and from PyPI, in the Python that runs configure (the source has no bundled wheels).
BUILD_REQUIREMENTS = ["meson>=1.5", "pycotap==1.3.1"]

PLUGIN_SOURCE = PROJECT_ROOT / "bench" / "plugin" / "insn_count.c"


@dataclass(frozen=True)
class PluginQemu:
    """A built plugin-capable QEMU: the binary and the plugin API header it was built with."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "qemu-riscv64"

    @property
    def include_dir(self) -> Path:
        return self.root / "include"


def cache_dir(pin: QemuPin) -> Path:
    return cache_root() / "qemu-plugins" / pin.version.replace(":", "_")


def upstream_version(debian_version: str) -> str:
    """``1:10.0.13+ds-0+deb13u1`` -> ``10.0.13`` (what ``qemu-riscv64 --version`` reports)."""
    no_epoch = debian_version.split(":", 1)[-1]
    return no_epoch.rsplit("-", 1)[0].split("+", 1)[0]


def configure_command(source: Path, python: Path, pin: QemuPin) -> list[str]:
    return [
        str(source / "configure"),
        f"--python={python}",
        *CONFIGURE_FLAGS,
        f"--with-pkgversion=Debian {pin.version}, plugin-capable build",
    ]


def is_complete(root: Path, pin: QemuPin) -> bool:
    try:
        data = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        data.get("version") == pin.version and data.get("recipe") == RECIPE_VERSION and (root / "qemu-riscv64").exists()
    )


def ensure_plugin_qemu(python: Path, pin: QemuPin | None = None) -> PluginQemu:
    """Return the plugin-capable qemu-riscv64 of the pinned version, building it on first use.

    ``python`` must have ``BUILD_REQUIREMENTS`` installed (QEMU's configure runs meson through it).
    """
    pin = pin or QemuPin.load()
    root = cache_dir(pin)
    with cache_lock("qemu-plugins"):
        if not is_complete(root, pin):
            host_packages.ensure_host_packages(BUILD_PACKAGES)
            _build(pin, root, python)
    return PluginQemu(root)


def _build(pin: QemuPin, root: Path, python: Path) -> None:
    if root.exists():
        log(f"{root} is stale or half-built; removing it")
        shutil.rmtree(root)
    work = root.with_name(root.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    apt = PrivateApt(cache_root() / "apt-src", archive.debian_archive(), suite=pin.suite, kind="deb-src")
    with Stopwatch(f"fetching Debian's {SOURCE_PACKAGE} {pin.version} source package (~40 MB)"):
        apt.update()
        try:
            dsc = apt.download_source(SOURCE_PACKAGE, pin.version, work / "src")
        except CommandFailed as err:
            raise IntegrityError(
                f"the archive no longer serves the source of the pinned {SOURCE_PACKAGE} {pin.version}",
                f"point {archive.ARCHIVE_ENV} at an archive that keeps it, or re-pin with `nox -s pin-qemu` "
                f"and commit {PIN_FILE.name}",
            ) from err
    source = work / "qemu"
    with Stopwatch("unpacking it with Debian's patches applied (dpkg-source -x)"):
        # dpkg-source checks the tarballs against the .dsc's checksums; apt
        # already checked the .dsc against the archive's signed index.
        run(["dpkg-source", "--no-copy", "-x", dsc, source])
    build = source / "build"
    build.mkdir()
    with Stopwatch("configuring QEMU (riscv64-linux-user, plugins enabled)"):
        run(
            configure_command(source, python, pin),
            cwd=build,
            hint="the build needs "
            + ", ".join(BUILD_PACKAGES)
            + " (apt) and "
            + ", ".join(BUILD_REQUIREMENTS)
            + f" (PyPI) in {python}",
        )
    with Stopwatch("building qemu-riscv64 with ninja (about 1.5 min on 2 cores)"):
        run(["ninja", "qemu-riscv64"], cwd=build, stream=True)
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "include").mkdir(parents=True)
    shutil.copy2(build / "qemu-riscv64", partial / "qemu-riscv64")
    shutil.copy2(source / "include" / "qemu" / "qemu-plugin.h", partial / "include" / "qemu-plugin.h")
    version = qemu_version(partial / "qemu-riscv64")
    if upstream_version(pin.version) not in version:
        raise IntegrityError(
            f"the built qemu-riscv64 reports {version!r}, not the pinned {pin.version}",
            f"delete {partial.parent} and rerun; report it if it happens again",
        )
    (partial / MARKER).write_text(
        json.dumps(
            {
                "version": pin.version,
                "recipe": RECIPE_VERSION,
                "reports": version,
                "configure": list(CONFIGURE_FLAGS),
                "build_seconds": round(time.monotonic() - started),
            },
            indent=2,
        )
        + "\n"
    )
    partial.rename(root)
    shutil.rmtree(work, ignore_errors=True)
    log(f"plugin-capable qemu-riscv64: {root / 'qemu-riscv64'} ({version})")


def plugin_compile_command(qemu: PluginQemu, source: Path, output: Path, glib_cflags: list[str]) -> list[str]:
    return [
        "clang-19",
        "-std=c11",
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{qemu.include_dir}",
        *glib_cflags,
        str(source),
        "-o",
        str(output),
    ]


def build_plugin(qemu: PluginQemu, out_dir: Path, source: Path = PLUGIN_SOURCE) -> Path:
    """Compile the instruction-counting plugin for the host (again only when its source changed)."""
    output = out_dir / "libinsn_count.so"
    stale = not output.exists() or output.stat().st_mtime < max(
        source.stat().st_mtime, (qemu.root / MARKER).stat().st_mtime
    )
    if stale:
        out_dir.mkdir(parents=True, exist_ok=True)
        cflags = run(["pkg-config", "--cflags", "glib-2.0"]).split()
        run(plugin_compile_command(qemu, source, output, cflags))
    return output
