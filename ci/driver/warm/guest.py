"""The warm target's server: runs inside the emulated target (the sysroot's python3 under qemu-riscv64).

It imports the heavy modules once (torch, pytest, ...), then listens on a Unix
socket. Each request is served by a fresh child forked from that pristine
state: the child takes over the caller's stdin/stdout/stderr (passed as file
descriptors), working directory, environment and arguments, and runs what
``python3 <args>`` would run, so the library it loads is the one on the
request's PYTHONPATH (the just-built one), never one loaded earlier. Nothing
a child does reaches the server or another child: it is a separate process.

The server reports each child's exit status, or the signal that killed it,
back to the caller, and exits after ``--idle-timeout`` seconds without a
request, so no target is left behind.

Standalone on purpose (standard library only): it runs with the target's
Python, which cannot import the host-side driver. The wire format is shared
with ``client.py``: each message is a 4-byte big-endian length and a
JSON object; the request carries fds 0, 1, 2 as SCM_RIGHTS.
"""

from __future__ import annotations

import argparse
import atexit
import builtins
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types

HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20


def send_message(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    frame = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(conn, [frame], fds)
        frame = frame[sent:]
    if frame:
        conn.sendall(frame)


def _receive_exactly(conn: socket.socket, size: int, fds: list[int], max_fds: int) -> bytes | None:
    """Exactly ``size`` bytes (never more: a following message stays in the socket); None at EOF."""
    data = b""
    while len(data) < size:
        if max_fds and not fds:
            chunk, received, _flags, _addr = socket.recv_fds(conn, size - len(data), max_fds)
            fds += received
        else:
            chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def receive_message(conn: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the fds that came with it; (None, []) if the peer closed first."""
    fds: list[int] = []
    header = _receive_exactly(conn, HEADER.size, fds, max_fds)
    size = HEADER.unpack(header)[0] if header else 0
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is too large")
    body = _receive_exactly(conn, size, fds, max_fds) if header else None
    if body is None:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(body), fds


# ---- the child: one request ------------------------------------------------------------------------


def _reopen_stdio() -> None:
    """New sys.std* over the caller's fds, buffered as a fresh interpreter would buffer them."""
    old = {"stdin": sys.stdin, "stdout": sys.stdout, "stderr": sys.stderr}
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        template = old[name]
        encoding = getattr(template, "encoding", None) or "utf-8"
        errors = getattr(template, "errors", None) or "strict"
        if name == "stdin":
            raw = io.FileIO(fd, "r", closefd=False)
            stream = io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors)
        else:
            raw = io.FileIO(fd, "w", closefd=False)
            # stdout is line-buffered on a terminal only; stderr always (Python >= 3.9).
            line_buffering = name == "stderr" or os.isatty(fd)
            stream = io.TextIOWrapper(
                io.BufferedWriter(raw), encoding=encoding, errors=errors, line_buffering=line_buffering
            )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    """Fresh random state, as each fresh interpreter has (``random`` reseeds itself after fork).

    torch seeds its default generator from the OS at start-up, numpy its
    global RandomState: without this every child would share the server's.
    """
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _exit_code(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_python(args: list[str], base_path: list[str]) -> None:
    """Run what ``python3 <args>`` runs: ``-m module ...``, ``-c code ...`` or ``script ...``."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[:] = [os.getcwd(), *extra, *base_path]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[:] = ["", *extra, *base_path]
        exec(compile(args[1], "<string>", "exec"), main.__dict__)  # noqa: S102 - the caller's own code
    else:
        sys.argv = list(args)
        sys.path[:] = [os.path.dirname(os.path.realpath(args[0])), *extra, *base_path]
        runpy.run_path(args[0], run_name="__main__")


def _finish(code: int) -> None:
    """Exit as the interpreter would: wait for threads, run atexit handlers, flush, then leave."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe must not change the exit status
                pass
        os._exit(code)


def serve_request(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become the caller's ``python3 <args>``; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # the caller forwards Ctrl-C to this group
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked_signals", []))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        _reopen_stdio()
        _reseed()
        try:
            _run_python(request["argv"], base_path)
            code = 0
        except SystemExit as err:
            code = _exit_code(err)
        except KeyboardInterrupt:
            traceback.print_exc()
            sys.stderr.flush()
            # As CPython does: die of SIGINT, so the caller sees the signal.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - reported like an uncaught exception
            sys.excepthook(*sys.exc_info())
            code = 1
    except BaseException:  # noqa: BLE001 - setting up the request failed
        traceback.print_exc()
        code = 1
    _finish(code)


# ---- the server ------------------------------------------------------------------------------------


class Server:
    def __init__(self, socket_path: str, idle_timeout: float, info: dict) -> None:
        self.socket_path = socket_path
        self.idle_timeout = idle_timeout
        self.info = info
        self.running: dict[int, socket.socket] = {}
        self.last_activity = time.monotonic()
        self.stopping = False
        self.base_path = list(sys.path[1:])  # without this script's folder

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        listener.bind(self.socket_path)
        listener.listen(64)
        identity = os.stat(self.socket_path).st_ino
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        print(f"ready: pid {os.getpid()}, socket {self.socket_path}", flush=True)
        try:
            while not self.stopping:
                self._reap()
                idle_for = time.monotonic() - self.last_activity
                if not self.running and idle_for >= self.idle_timeout:
                    print(f"idle for {idle_for:.0f} s: exiting", flush=True)
                    break
                timeout = None if self.running else self.idle_timeout - idle_for
                ready, _, _ = select.select([listener, wake_read], [], [], timeout)
                if wake_read in ready:
                    os.read(wake_read, 4096)
                if listener in ready:
                    conn, _addr = listener.accept()
                    self._accept(conn, listener)
        finally:
            try:
                if os.stat(self.socket_path).st_ino == identity:
                    os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            print(f"stopped; {len(self.running)} request(s) still running", flush=True)

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.running.pop(pid, None)
            self.last_activity = time.monotonic()
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                result = {"signal": os.WTERMSIG(status)}
            else:
                result = {"exit": os.waitstatus_to_exitcode(status)}
            print(f"request {pid}: {result}", flush=True)
            try:
                send_message(conn, result)
            except OSError:
                pass  # the caller went away
            conn.close()

    def _accept(self, conn: socket.socket, listener: socket.socket) -> None:
        self.last_activity = time.monotonic()
        conn.settimeout(30)
        fds: list[int] = []
        try:
            request, fds = receive_message(conn, max_fds=3)
            if request is None:
                conn.close()
                return
            op = request.get("op")
            if op == "ping":
                send_message(conn, {**self.info, "pid": os.getpid(), "running": len(self.running)})
            elif op == "stop":
                send_message(conn, {"stopping": True})
                self.stopping = True
            elif op == "run" and len(fds) == 3 and request.get("argv"):
                self._fork(conn, request, fds, listener)
                return
            else:
                send_message(conn, {"error": f"bad request {op!r} with {len(fds)} fds"})
        except (OSError, ValueError) as err:
            print(f"bad request: {err}", flush=True)
        for fd in fds:
            os.close(fd)
        conn.close()

    def _fork(self, conn: socket.socket, request: dict, fds: list[int], listener: socket.socket) -> None:
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            for other in self.running.values():
                other.close()
            serve_request(request, fds, self.base_path)
        for fd in fds:
            os.close(fd)
        self.running[pid] = conn
        conn.settimeout(None)
        try:
            send_message(conn, {"started": pid})
        except OSError:
            pass
        print(f"request {pid}: {request['argv'][:4]} in {request['cwd']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle-timeout", type=float, default=900.0)
    parser.add_argument("--preload", default="torch,pytest")
    parser.add_argument("--info", default="{}", help="JSON echoed back to a ping (what this target is)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    for name in filter(None, args.preload.split(",")):
        importlib.import_module(name)
    print(f"preloaded {args.preload} in {time.monotonic() - start:.1f} s", flush=True)
    info = {**json.loads(args.info), "preloaded": args.preload.split(",")}
    Server(args.socket, args.idle_timeout, info).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
