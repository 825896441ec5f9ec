"""Warm targets: a long-lived emulated Python per configuration (VLEN x policy) that serves requests.

A cold emulated run pays ~24 s for starting the target's python3 under QEMU
and importing torch. A warm target pays that once: ``guest.py`` runs
under ``qemu-riscv64 -cpu <configuration>``, imports torch and pytest, and
then forks a fresh child per request. ``route`` turns the cold command line
of an emulated ``python3`` run into a call of ``client.py`` when a
running target matches it (same QEMU, sysroot, CPU string and start-up
environment), and leaves it cold otherwise, so every caller keeps working
without one.

Sockets, state and logs live in ``<build>/warm/``: a path the sysroot does not
have, so QEMU's ``-L`` redirection leaves it alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR
from ..toolchain.guest_commands import guest_env, guest_program
from ..toolchain.vlens import Variant, by_vlen, parse_vlens_option, variants
from . import guest as protocol

WARM_DIR = BUILD_DIR / "warm"
GUEST_SCRIPT = Path(__file__).with_name("guest.py")
CLIENT_SCRIPT = Path(__file__).with_name("client.py")
# What the suite imports anyway; imported once per target instead of once per run.
PRELOAD = ("torch", "numpy", "pytest", "hypothesis")
DEFAULT_IDLE_TIMEOUT = 900
POLICIES = ("undisturbed", "agnostic")
# Read by the interpreter or by torch while importing: a request that sets
# them differently from the target's start-up environment runs cold.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "LD_", "LC_", "QEMU_")
STARTUP_NAMES = ("LANG",)
# Applied per request by the child itself.
PER_REQUEST = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
UNIX_PATH_MAX = 107


@dataclass(frozen=True)
class Target:
    """One warm target: a VLEN under one tail/mask policy."""

    vlen: int
    agnostic: bool = False

    @property
    def variant(self) -> Variant:
        return by_vlen(self.vlen)

    @property
    def label(self) -> str:
        return f"vlen{self.vlen}" + ("-agnostic" if self.agnostic else "")

    @property
    def qemu_cpu(self) -> str:
        return self.variant.qemu_cpu(self.agnostic)

    def socket_path(self, warm_dir: Path = WARM_DIR) -> Path:
        return warm_dir / f"{self.label}.sock"

    def log_path(self, warm_dir: Path = WARM_DIR) -> Path:
        return warm_dir / f"{self.label}.log"


def all_targets() -> list[Target]:
    return [Target(v.vlen, policy == "agnostic") for v in variants() for policy in POLICIES]


def target_for_cpu(cpu: str) -> Target | None:
    for target in all_targets():
        if target.qemu_cpu == cpu:
            return target
    return None


@dataclass
class Options:
    targets: list[Target] = field(default_factory=list)
    stop: bool = False
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT


def parse_posargs(posargs: Sequence[str]) -> Options:
    """``--vlens=128,256 [--policies=undisturbed,agnostic] [--idle-timeout=S]``, or ``--stop``."""
    opts = Options()
    vlen_list: list[int] = []
    policies = ["undisturbed"]
    for arg in posargs:
        name, sep, value = arg.partition("=")
        if name == "--vlens" and sep:
            try:
                vlen_list = parse_vlens_option(value)
            except ValueError as err:
                raise ConfigError(f"--vlens={value}: {err}") from err
        elif name == "--policies" and sep:
            policies = list(POLICIES) if value == "all" else [p for p in value.split(",") if p]
            unknown = sorted(set(policies) - set(POLICIES))
            if unknown:
                raise ConfigError(
                    f"--policies={value}: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)} or all"
                )
        elif name == "--idle-timeout" and sep:
            try:
                opts.idle_timeout = float(value)
            except ValueError:
                opts.idle_timeout = -1
            if opts.idle_timeout <= 0:
                raise ConfigError(f"--idle-timeout={value}: give a number of seconds > 0")
        elif arg == "--stop":
            opts.stop = True
        else:
            raise ConfigError(
                f"nox -s warm: unknown argument {arg!r}",
                "use --vlens=128,256 [--policies=undisturbed,agnostic] [--idle-timeout=900], or --stop",
            )
    opts.targets = [Target(vlen, policy == "agnostic") for vlen in vlen_list for policy in policies]
    return opts


# ---- talking to a target ---------------------------------------------------------------------------


def ping(socket_path: Path, timeout: float = 5.0) -> dict | None:
    """The target's description, or None if nothing answers on ``socket_path``."""
    if not socket_path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(socket_path))
        protocol.send_message(conn, {"op": "ping"})
        reply, _ = protocol.receive_message(conn)
        return reply
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that matters when the interpreter starts and imports torch."""
    return {
        k: v for k, v in env.items() if (k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES) and k not in PER_REQUEST
    }


def identity(target: Target, qemu: Path, sysroot: Path, env: Mapping[str, str]) -> dict:
    """What a request must agree with to be served by a target (echoed back by its ping)."""
    return {
        "label": target.label,
        "qemu": str(qemu),
        "sysroot": str(sysroot),
        "cpu": target.qemu_cpu,
        "env": startup_env(env),
        "server": server_version(),
    }


def server_version() -> str:
    """Changes with the server's code: a target started by an older one is not used."""
    return hashlib.sha256(GUEST_SCRIPT.read_bytes()).hexdigest()[:16]


def matches(reply: dict | None, wanted: dict) -> bool:
    return reply is not None and all(reply.get(k) == v for k, v in wanted.items())


def python_args(cmd: Sequence[str]) -> tuple[Path, Path, str, list[str]] | None:
    """(qemu, sysroot, cpu, python3 arguments) of a cold ``qemu-riscv64 -L <root> -cpu <cpu> python3 ...``.

    None when the command is something a warm target does not serve: another
    program, extra QEMU options (``-g`` for gdb), or interpreter options.
    """
    if len(cmd) < 7 or cmd[1] != "-L" or cmd[3] != "-cpu":
        return None
    qemu, sysroot, cpu, program, args = Path(cmd[0]), Path(cmd[2]), cmd[4], cmd[5], list(cmd[6:])
    try:
        if program != guest_program(sysroot, "python3"):
            return None
    except FileNotFoundError:
        return None
    if args[0] in ("-m", "-c"):
        if len(args) < 2:
            return None
    elif args[0].startswith("-"):
        return None
    return qemu, sysroot, cpu, args


def route(
    cmd: Sequence[str], env: Mapping[str, str], warm_dir: Path = WARM_DIR, report: Callable[[str], None] | None = None
) -> list[str]:
    """``cmd`` through a matching running warm target, else ``cmd`` unchanged (a cold start)."""
    parsed = python_args(cmd)
    if parsed is None:
        return list(cmd)
    qemu, sysroot, cpu, args = parsed
    target = target_for_cpu(cpu)
    if target is None:
        return list(cmd)
    socket_path = target.socket_path(warm_dir)
    reply = ping(socket_path)
    if reply is None:
        return list(cmd)
    if not matches(reply, identity(target, qemu, sysroot, env)):
        if report:
            report(
                f"warm target {target.label} is running but was started with another QEMU, sysroot, server or "
                "start-up environment; starting cold (restart it: nox -s warm -- --vlens=...)"
            )
        return list(cmd)
    if report:
        report(f"running in the warm target {target.label} (pid {reply.get('pid')}; a fresh child per run)")
    return [sys.executable, str(CLIENT_SCRIPT), str(socket_path), target.label, *args]


# ---- starting and stopping -------------------------------------------------------------------------


def check_warm_dir(warm_dir: Path, sysroot: Path) -> None:
    """The socket folder must be one the guest sees as the host's (QEMU ``-L`` prefers the sysroot's)."""
    top = Path(*warm_dir.resolve().parts[:2])
    if (sysroot / top.relative_to("/")).exists():
        raise ConfigError(
            f"the warm targets' folder {warm_dir} is under {top}, which the sysroot also has; "
            "under qemu -L the guest would see the sysroot's copy",
            "set RVV_ATTN_BUILD_DIR to a folder outside /tmp, /usr, /etc, /var and /dev",
        )
    longest = max(len(str(t.socket_path(warm_dir))) for t in all_targets())
    if longest > UNIX_PATH_MAX:
        raise ConfigError(
            f"socket paths under {warm_dir} are {longest} bytes, more than a Unix socket allows",
            "set RVV_ATTN_BUILD_DIR to a shorter path",
        )


def server_command(
    target: Target, qemu: Path, sysroot: Path, info: dict, idle_timeout: float, warm_dir: Path = WARM_DIR
) -> list[str]:
    return [
        str(qemu),
        "-L",
        str(sysroot),
        "-cpu",
        target.qemu_cpu,
        guest_program(sysroot, "python3"),
        str(GUEST_SCRIPT),
        "--socket",
        str(target.socket_path(warm_dir)),
        "--idle-timeout",
        str(idle_timeout),
        "--preload",
        ",".join(PRELOAD),
        "--info",
        json.dumps(info),
    ]


def start(
    targets: Sequence[Target],
    qemu: Path,
    sysroot: Path,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    warm_dir: Path = WARM_DIR,
    report: Callable[[str], None] = print,
    timeout: float = 900,
) -> None:
    """Start the targets that are not already running (in parallel); return when all answer."""
    check_warm_dir(warm_dir, sysroot)
    warm_dir.mkdir(parents=True, exist_ok=True)
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = guest_env(None, tmp)
    starting: dict[Target, subprocess.Popen] = {}
    for target in targets:
        wanted = identity(target, qemu, sysroot, env)
        reply = ping(target.socket_path(warm_dir))
        if matches(reply, wanted):
            report(f"{target.label}: already running (pid {reply['pid']})")
            continue
        if reply is not None:
            report(f"{target.label}: running with another QEMU, sysroot or environment; replacing it")
            stop([target], warm_dir, report)
        with target.log_path(warm_dir).open("w") as log:
            starting[target] = subprocess.Popen(
                server_command(target, qemu, sysroot, wanted, idle_timeout, warm_dir),
                env=env,
                cwd=warm_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    if starting:
        report(
            f"starting {', '.join(t.label for t in starting)}: each imports torch under QEMU once "
            f"(~25 s of CPU each); idle timeout {idle_timeout:.0f} s"
        )
    began = time.monotonic()
    while starting:
        for target, proc in list(starting.items()):
            if proc.poll() is not None:
                tail = target.log_path(warm_dir).read_text(errors="replace")[-3000:]
                raise DriverError(
                    f"warm target {target.label} exited with {proc.returncode} while starting:\n{tail}",
                    f"its log: {target.log_path(warm_dir)}",
                )
            reply = ping(target.socket_path(warm_dir))
            if reply is not None:
                report(f"{target.label}: ready in {time.monotonic() - began:.0f} s (pid {reply['pid']})")
                del starting[target]
        if time.monotonic() - began > timeout:
            raise DriverError(
                f"warm targets {', '.join(t.label for t in starting)} not ready after {timeout:.0f} s",
                f"see their logs in {warm_dir}",
            )
        if starting:
            time.sleep(0.5)


def running(warm_dir: Path = WARM_DIR) -> list[tuple[Target, dict]]:
    found = []
    for target in all_targets():
        reply = ping(target.socket_path(warm_dir))
        if reply is not None:
            found.append((target, reply))
    return found


def run_session(posargs: Sequence[str], report: Callable[[str], None]) -> None:
    """`nox -s warm`: start the targets asked for, stop them (--stop), or list the running ones."""
    opts = parse_posargs(posargs)
    if opts.stop:
        if not stop(report=report):
            report("no warm target was running")
    elif not opts.targets:
        for line in status_lines():
            report(line)
    else:
        qemu_bin, root = toolchain.ensure()
        start(opts.targets, qemu_bin, root, opts.idle_timeout, report=report)


def status_lines(warm_dir: Path = WARM_DIR) -> list[str]:
    """What ``nox -s warm`` without options prints: the running targets and how to start or stop them."""
    found = running(warm_dir)
    lines = [
        f"{target.label}: running (pid {info['pid']}, {info['running']} request(s) in flight)" for target, info in found
    ]
    lines.append("stop them with: nox -s warm -- --stop" if found else "no warm target is running")
    lines.append("start some with: nox -s warm -- --vlens=256  (or --vlens=all --policies=all for repro)")
    return lines


def stop(
    targets: Sequence[Target] | None = None,
    warm_dir: Path = WARM_DIR,
    report: Callable[[str], None] = print,
    wait: float = 15.0,
) -> int:
    """Stop the given targets (default: every running one); returns how many were stopped."""
    stopped = 0
    for target in all_targets() if targets is None else targets:
        path = target.socket_path(warm_dir)
        reply = ping(path)
        if reply is None:
            path.unlink(missing_ok=True)
            continue
        pid = int(reply["pid"])
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        try:
            conn.connect(str(path))
            protocol.send_message(conn, {"op": "stop"})
            protocol.receive_message(conn)
        except (OSError, ValueError):
            os.kill(pid, signal.SIGTERM)
        finally:
            conn.close()
        deadline = time.monotonic() + wait
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        report(f"{target.label}: stopped (pid {pid})")
        stopped += 1
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, not yet reaped) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
