"""Run ``python3 <args>`` in a warm target, as if it were ``qemu-riscv64 ... python3 <args>``.

Usage: ``python client.py <socket> <label> <args>...``. Runs on the host
(standard library only, so any host Python can run it as a command). The
request carries this process's stdin/stdout/stderr, working directory and
environment and signal mask; the exit status is the guest's. A guest killed by a signal
(a kernel fault: SIGSEGV, SIGILL, SIGBUS, ...) is reported, and this process
then dies of the same signal, so the caller sees what it sees from a cold
``qemu-riscv64`` (a negative return code in Python, 128+N in a shell).
Ctrl-C and SIGTERM are forwarded to the request's process group.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys

from guest import receive_message, send_message

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _die_of(sig: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the guest's own fault, no host core file
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    signal.pause()


def main(argv: list[str]) -> int:
    socket_path, label, args = argv[0], argv[1], argv[2:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
    except OSError as err:
        print(
            f"[rvv-attn] warm target {label} is not answering on {socket_path} ({err}); "
            f"start it with `nox -s warm -- --vlens=...` or run without it",
            file=sys.stderr,
        )
        return 1
    child = 0
    pending: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        if not child:  # not started yet: forwarded as soon as it is
            pending.append(sig)
            return
        try:
            os.killpg(child, sig)
        except ProcessLookupError:  # not yet its own group leader
            try:
                os.kill(child, sig)
            except ProcessLookupError:
                pass

    # Installed before the request goes out, so no Ctrl-C falls between the two.
    for sig in FORWARDED:
        signal.signal(sig, forward)
    # The caller's blocked signals go along: a cold interpreter would inherit them, while the
    # server's own mask is whatever its launcher had.
    blocked = sorted(int(sig) for sig in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    request = {"op": "run", "argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "blocked_signals": blocked}
    send_message(conn, request, [0, 1, 2])
    started, _ = receive_message(conn)
    if not started or "started" not in started:
        print(f"[rvv-attn] warm target {label} refused the request: {started}", file=sys.stderr)
        return 1
    child = int(started["started"])
    for sig in pending:
        forward(sig, None)
    while True:
        try:
            result, _ = receive_message(conn)
            break
        except InterruptedError:
            continue
    if result is None:
        print(
            f"[rvv-attn] warm target {label} stopped while running this request (pid {child}); "
            "its log is in build/warm/",
            file=sys.stderr,
        )
        return 1
    if "signal" in result:
        sig = int(result["signal"])
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        print(
            f"[rvv-attn] warm target {label}: the request (pid {child}) was killed by signal {name} ({sig})",
            file=sys.stderr,
            flush=True,
        )
        _die_of(sig)
    return int(result["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
