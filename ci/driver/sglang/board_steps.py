"""docs/sglang.md's board steps, run as written, in a fresh Debian riscv64 root under QEMU.

The page's code blocks that a board user types are marked with an HTML
comment (``<!-- board-steps: install -->``, ``serve``, ``request``); this
module reads them from the page, so the page and this run cannot drift.

1. A fresh root: what a board image has before the user types anything
   (mmdebstrap's ``minbase`` plus ``sudo``, ``ca-certificates`` and ``curl``),
   bootstrapped once and cached pristine; each run works on a copy.
2. The ``install`` block, verbatim, as root in a chroot of the copy (every
   riscv64 program run by QEMU through binfmt_misc): apt installs Debian's
   torch and SGLang's imports, pip installs rvv-attn's wheel (built from this
   tree) and SGLang's Python files.
3. A small Llama directory (tests/sglang_server.py, run by the root's own
   Python), as the user's model.
4. The ``serve`` block in the background, then the ``request`` block once the
   server answers; the response must hold generated tokens.

Each step's time is printed. Slow (apt configures every package under
emulation; the server imports torch and SGLang in three processes): a
session of its own, ``sglang-board-steps``, never part of ``nox -t test``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR, PROJECT_ROOT, cache_lock, cache_root
from ..proc import Stopwatch, log, run
from ..toolchain import archive, sysroot
from ..toolchain.host_packages import privilege_prefix
from ..toolchain.torch_lines import TorchLine

DOC = PROJECT_ROOT / "docs" / "sglang.md"
BLOCKS = ("install", "serve", "request")
MARKER_RE = re.compile(r"<!-- board-steps: (\w+) -->\s*\n```(?:sh|console)?\n(.*?)\n```", re.S)
# What a board image has before its user installs anything (besides the minbase system).
IMAGE_PACKAGES = ("ca-certificates", "curl", "sudo")
RECIPE_VERSION = 1
MARKER = ".rvv-attn-fresh-root.json"
# The guest's home: the user's folder, where the wheel is and the commands run.
HOME = "/root"
MODEL_DIR = f"{HOME}/models/tiny-llama"
STEP_LINE = re.compile(r"^rvv-attn-step (\S+) (\d+)$", re.M)
SERVER_WAIT_SECONDS = 2400


def doc_blocks(text: str) -> dict[str, str]:
    """The marked blocks of the page by name; ConfigError if one is missing or doubled."""
    found: dict[str, str] = {}
    for name, body in MARKER_RE.findall(text):
        if name in found:
            raise ConfigError(f"{DOC.name} marks two '{name}' board-steps blocks")
        found[name] = body
    missing = [b for b in BLOCKS if b not in found]
    if missing:
        raise ConfigError(
            f"{DOC.name} has no board-steps block for {', '.join(missing)}",
            "mark each block with <!-- board-steps: NAME --> on the line before its ```sh fence",
        )
    return {b: found[b] for b in BLOCKS}


def serve_command(block: str) -> str:
    """The serve block is one command (continuation lines allowed), run in the background by the script."""
    lines = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines or any(line.rstrip().endswith("&") for line in lines):
        raise ConfigError(f"{DOC.name}: the serve block must be the server command, in the foreground")
    return "\n".join(lines)


def guest_script(blocks: dict[str, str], wait_seconds: int = SERVER_WAIT_SECONDS) -> str:
    """What runs in the chroot: the blocks as written, the model in between, the server waited for."""

    def step(name: str) -> list[str]:
        return [f'echo "rvv-attn-step {name} $(( $(date +%s) - t ))"', "t=$(date +%s)"]

    return "\n".join(
        [
            "set -eu",
            f"export HOME={HOME} DEBIAN_FRONTEND=noninteractive",
            f"cd {HOME}",
            "t=$(date +%s)",
            "# --- the page's install block, as written ---",
            blocks["install"],
            *step("install"),
            "# --- a small model, written by the board's own Python (the user's model in the page) ---",
            f"python3 {HOME}/write_model.py {MODEL_DIR}",
            *step("model"),
            f"export MODEL_DIR={MODEL_DIR}",
            "# --- the page's serve block, in the background, in a process group of its own ---",
            f"cat > {HOME}/serve.sh <<'RVV_ATTN_SERVE'",
            serve_command(blocks["serve"]),
            "RVV_ATTN_SERVE",
            f"setsid sh {HOME}/serve.sh > {HOME}/server.log 2>&1 &",
            "server=$!",
            # SGLang's scheduler and detokenizer are the server's children: whatever ends the script (a step
            # that fails included), the whole group goes, so no server is left polling under QEMU. (dash's
            # kill takes a negative pid, not `--`.)
            "trap 'kill -KILL -$server 2>/dev/null || true' EXIT",
            f"deadline=$(( $(date +%s) + {wait_seconds} ))",
            "until curl -sf http://127.0.0.1:30000/health > /dev/null; do",
            "  if ! kill -0 $server 2>/dev/null; then echo 'the server exited:'; tail -50 server.log; exit 1; fi",
            "  if [ $(date +%s) -gt $deadline ]; then echo 'no answer in time:'; tail -50 server.log; exit 1; fi",
            "  sleep 5",
            "done",
            *step("server-start"),
            "# --- the page's request block, as written ---",
            f"( {blocks['request']} ) | tee {HOME}/response.txt",
            *step("request"),
            # TERM, not INT: a background command of a non-interactive sh starts with SIGINT ignored.
            "kill -TERM -$server; sleep 20",
            f"grep -q output_ids {HOME}/response.txt",
        ]
    )


def parse_steps(output: str) -> dict[str, int]:
    return {name: int(seconds) for name, seconds in STEP_LINE.findall(output)}


# ---- the fresh root ----


@dataclass(frozen=True)
class FreshRoot:
    line: TorchLine

    def key(self) -> str:
        canonical = json.dumps({"suite": self.line.suite, "packages": IMAGE_PACKAGES, "recipe": RECIPE_VERSION})
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def path(self) -> Path:
        return cache_root() / "fresh-root" / f"{self.line.suite}-riscv64-{self.key()}"


def ensure_fresh_root(line: TorchLine) -> Path:
    """The pristine image root, bootstrapped once (needs binfmt_misc: the caller holds ``binfmt.registered``)."""
    fresh = FreshRoot(line)
    root = fresh.path()
    with cache_lock("fresh-root"):
        try:
            if json.loads((root / MARKER).read_text()).get("key") == fresh.key():
                return root
        except (OSError, ValueError):
            pass
        shutil.rmtree(root, ignore_errors=True)
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        cmd = sysroot.mmdebstrap("minbase", line.suite, line.rolling, IMAGE_PACKAGES, partial, archive.debian_archive())
        with Stopwatch(f"bootstrapping a fresh Debian {line.suite} riscv64 root (minbase; a few minutes)"):
            run([*(privilege_prefix() or []), *cmd], stream=True, hint="mmdebstrap needs root and binfmt_misc")
        (partial / MARKER).write_text(json.dumps({"key": fresh.key(), "seconds": round(time.monotonic() - started)}))
        partial.rename(root)
        return root


# The host's CA bundle, copied into the root: a network that inspects TLS (a proxy with its own CA) is trusted
# by the host, and pip in the root must trust it the same way. On an open network it holds the public CAs.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
GUEST_CA_BUNDLE = "/etc/ssl/certs/rvv-attn-host-ca.crt"


def chroot_command(root: Path, script: str, qemu_cpu: str) -> list[str]:
    """``script`` in a chroot of ``root`` with /proc, /dev, /sys and a fresh /dev/shm (SGLang's processes share
    memory through it), in a mount namespace of its own so the mounts go away with it."""
    prefix = privilege_prefix()
    if prefix is None:
        raise DriverError("the board steps need root or passwordless sudo (chroot, mount)")
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin") or "chroot"
    q = shlex.quote
    inner = " && ".join(
        [
            f"mount -t proc proc {q(str(root / 'proc'))}",
            f"mount --rbind /dev {q(str(root / 'dev'))}",
            # SGLang sizes its CPU threads with lscpu, which reads /sys.
            f"mount --rbind /sys {q(str(root / 'sys'))}",
            f"mount -t tmpfs shm {q(str(root / 'dev' / 'shm'))}",
            f"exec {chroot} {q(str(root))} /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
            f"/sbin:/bin HOME={HOME} LANG=C.UTF-8 QEMU_CPU={q(qemu_cpu)} PIP_CERT={GUEST_CA_BUNDLE} "
            f"SSL_CERT_FILE={GUEST_CA_BUNDLE} /bin/sh {HOME}/{script}",
        ]
    )
    return [*prefix, "unshare", "--mount", "--fork", "sh", "-c", inner]


def prepare_copy(pristine: Path, wheel: Path, work: Path) -> Path:
    """A copy of the pristine root with the user's files in its home: the wheel and the model writer."""
    prefix = privilege_prefix() or []
    if work.exists():
        run([*prefix, "rm", "-rf", str(work)])
    work.parent.mkdir(parents=True, exist_ok=True)
    with Stopwatch("copying the fresh root"):
        run([*prefix, "cp", "-a", str(pristine), str(work)])
    home = work / HOME.lstrip("/")
    shutil.copy2(wheel, home / wheel.name)
    shutil.copy2(PROJECT_ROOT / "tests" / "sglang_server.py", home / "sglang_server.py")
    (home / "write_model.py").write_text(
        "import sys\nfrom pathlib import Path\n\nimport sglang_server\n\n"
        "sglang_server.write_model(sglang_server.LLAMA, Path(sys.argv[1]))\n"
    )
    # Name resolution and TLS trust for apt and pip, as the host has them.
    shutil.copy2("/etc/resolv.conf", work / "etc" / "resolv.conf")
    if HOST_CA_BUNDLE.exists():
        shutil.copy2(HOST_CA_BUNDLE, work / GUEST_CA_BUNDLE.lstrip("/"))
    return work


def run_steps(
    pristine: Path, wheel: Path, qemu_cpu: str, work: Path = BUILD_DIR / "board-steps" / "root"
) -> dict[str, int]:
    """Run the page's steps in a copy of ``pristine`` on the CPU ``qemu_cpu`` (the board's); each step's seconds."""
    blocks = doc_blocks(DOC.read_text())
    root = prepare_copy(pristine, wheel, work)
    (root / HOME.lstrip("/") / "board-steps.sh").write_text(guest_script(blocks) + "\n")
    log(f"running {DOC.relative_to(PROJECT_ROOT)}'s board steps in {root} (under QEMU; install alone takes a while)")
    output = run(
        chroot_command(root, "board-steps.sh", qemu_cpu), stream=True, hint=f"the server's log: {root}/root/server.log"
    )
    return parse_steps(output)
