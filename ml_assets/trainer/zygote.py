"""The trainer zygote: one process that imported the trainer's libraries (torch and its distributed
checkpointing, polars, numpy, safetensors, XGBoost) once, and forks a rank for each client that asks.

A rank's start is mostly imports: ~2.5 s of CPU before it trains, which a daily fine-tune of a few
days' rows pays for ~0.3 s of training. With the zygote, torchrun's worker is a thin client
(``python -m ml_assets.trainer.forked``, the standard library only) that hands the zygote its
command, environment, working directory and standard streams over a Unix socket; the zygote forks a
child that becomes the rank (``python -m ml_assets.trainer`` with exactly those), and reports its
exit status back to the client, which exits with it. The client is the worker torchrun knows, and the
forked rank stands for it in every way that matters:

- signals: the client forwards every signal torchrun or a user sends it (SIGTERM: the rank
  checkpoints and exits, as it would started directly);
- lifetime: the rank ends at once when its client ends, however (``kill -9`` of torchrun's worker
  group included), as a directly started rank would die with it (``ml_assets.processes.follow_process``);
- identity: the rank's ``/proc`` command line and environment are rewritten to its own, so ``ps``,
  ``pgrep -f ml_assets.trainer`` and the tools that read a process's environment see a rank;
- cost: its seconds alive count from the client's start (the rank-seconds a training reports);
- code: the zygote imports installed libraries only, never the project's own modules, which each
  fork imports fresh (an edit to ml_assets or a model factory reaches the next training, as with a
  new process); an upgrade of the installed libraries needs the zygote's owner restarted.

The zygote never computes, starts no Python thread and never touches CUDA, so a fork is safe: the
forked rank starts whatever native threads and devices it uses itself. It lives as long as the process
that started it (``ml_assets.processes.die_with_parent``): a training step's process, a benchmark's
worker, or the production run launcher, which hands its zygote to every run worker it starts
(``SOCKET_ENV``). Only the same user may connect (the peer's uid is checked; the socket is abstract, so
nothing is left on disk however the zygote dies). A client that finds no zygote, or one running another Python, starts the
rank itself instead (``exec``), saying why on stderr.

Stdlib and ``ml_assets.processes`` only, like the trainer's other entry points.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import secrets
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import traceback

from ml_assets import processes

SOCKET_ENV = "ML_ASSETS_TRAINER_ZYGOTE"
"""The address of a zygote's socket that processes below its owner use instead of starting their own:
``@NAME`` for a Linux abstract socket (what ``start`` makes: nothing on disk to leave behind, however
the zygote dies), else a filesystem path."""
PRELOAD = ("numpy", "polars", "pyarrow", "pyarrow.parquet", "fsspec", "torch", "torch.distributed",
           "torch.distributed.run", "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
           "torch.distributed.checkpoint.state_dict_saver", "torch.distributed.checkpoint._fsspec_filesystem",
           "torch.distributed.fsdp", "torch.distributed.device_mesh", "torch.nn.parallel", "torch.utils.checkpoint",
           "torch.utils.data", "safetensors.torch", "xgboost", "dagster_pipes")
"""Installed libraries the trainer imports (never ml_assets: it must be read fresh for every rank)."""
RANK_START_ENV = "ML_ASSETS_RANK_START"
"""``exec``: no zygote; every rank is a new process (ml_assets.settings documents it)."""
RANK_STARTS = ("fork", "exec")
ROOM_ENV = "ML_ASSETS_ZYGOTE_ROOM"
ARGV_ROOM, ENV_ROOM = 4096, 65536
"""Bytes the zygote's own command line and environment reserve, in which each forked rank writes its own."""
_UCRED = struct.Struct("3i")
_HEADER = struct.Struct("!I")


def send_request(sock: socket.socket, request: dict, fds: list[int]) -> None:
    body = json.dumps(request).encode()
    socket.send_fds(sock, [_HEADER.pack(len(body))], fds)
    sock.sendall(body)


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, 3)
    try:
        if len(header) != _HEADER.size or len(fds) != 3:
            raise ValueError(f"a request needs a {_HEADER.size}-byte header and 3 descriptors, got "
                             f"{len(header)} bytes and {len(fds)}")
        (size,) = _HEADER.unpack(header)
        if size > 16 << 20:
            raise ValueError(f"a request of {size} bytes is too large")
        body = bytearray()
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("the client hung up mid-request")
            body += chunk
        return json.loads(body), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def reply(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


class Server:
    """The zygote's loop: accept a client, fork its rank, report the rank's exit status."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_address(path))
        self.listener.listen(64)  # clients queue here while the libraries import
        self.children: dict[int, socket.socket] = {}
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        self.selector = selectors.DefaultSelector()
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_read, 512):
                            pass
            self.reap()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10.0)  # a client that never finishes its request must not stall the others
        try:
            pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid != os.getuid():
                raise PermissionError(f"uid {uid} may not use a zygote of uid {os.getuid()}")
            request, fds = _receive_request(conn)
        except (OSError, ValueError) as exc:
            reply(conn, {"refused": str(exc)})
            conn.close()
            return
        refusal = self.refusal(request)
        started = processes.start_ticks(pid)
        if refusal or not started:
            for fd in fds:
                os.close(fd)
            reply(conn, {"refused": refusal or f"the client {pid} is gone"})
            conn.close()
            return
        conn.settimeout(None)
        self.fork(conn, request, fds, pid, started)

    @staticmethod
    def refusal(request: dict) -> str | None:
        if os.path.realpath(request.get("executable", "")) != os.path.realpath(sys.executable):
            return f"the client runs {request.get('executable')!r}, the zygote {sys.executable!r}"
        if request.get("version") != sys.version:
            return f"the client runs Python {request.get('version')!r}, the zygote {sys.version!r}"
        if not isinstance(request.get("argv"), list) or not isinstance(request.get("env"), dict):
            return "a request needs argv (a list) and env (an object)"
        return None

    def fork(self, conn: socket.socket, request: dict, fds: list[int], client: int, started: str) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self.close_in_child()
                become_rank(request, fds, conn, client, started)
            except SystemExit:
                raise
            except BaseException:
                traceback.print_exc()
                raise SystemExit(70) from None  # EX_SOFTWARE: the rank could not even start
            # The module ran to its end (it always calls sys.exit): end as the interpreter would.
            raise SystemExit(0)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        reply(conn, {"pid": pid, "started": processes.start_ticks(pid) or ""})

    def close_in_child(self) -> None:
        """What the forked rank must not hold: closed through their objects, which would otherwise
        close the same descriptor numbers again at exit, by then perhaps the rank's own files."""
        self.selector.close()
        self.listener.close()
        for other in self.children.values():
            other.close()
        self.children.clear()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_read)
        os.close(self.wake_write)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()


def become_rank(request: dict, fds: list[int], conn: socket.socket, client: int, started: str) -> None:
    """In the forked child: become ``python -m ml_assets.trainer ARGV`` as the client would have
    started it, and run it. Its SystemExit, or an exception it raises, unwinds to the zygote's
    ``main`` and ends the interpreter as it would end a rank started directly: the threads that are
    not daemons joined (a checkpoint writer), the atexit functions run, a traceback printed."""
    os.setsid()  # out of the zygote's group: what reaches the rank comes through its client
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    argv = [sys.executable, "-m", "ml_assets.trainer", *map(str, request["argv"])]
    retitle(argv, os.environ)
    sys.path[:] = request["path"]
    sys.argv = ["-m", *argv[3:]]  # run_module puts the module's file first, as python -m does
    for name in [m for m in sys.modules if m == "ml_assets" or m.startswith("ml_assets.")]:
        del sys.modules[name]  # the project's code is imported fresh, as by a new process
    importlib.import_module("ml_assets.processes").follow_process(client, started, hangup=conn)
    if (threads := os.environ.get("OMP_NUM_THREADS", "")).isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))  # the zygote's OpenMP read its own environment at import
    runpy.run_module("ml_assets.trainer", run_name="__main__", alter_sys=True)


def retitle(argv: list[str], env) -> None:
    """Write ``argv`` and ``env`` over this process's original command line and environment (the
    memory /proc/PID/cmdline and /proc/PID/environ show, as PostgreSQL's ps display does), within the
    room the zygote's own reserved; what does not fit is left out. Linux only; elsewhere nothing."""
    try:
        arg_start, arg_end, env_start, env_end = (int(v) for v in (processes.stat_fields() or [])[45:49])
    except ValueError:  # no /proc, or a kernel older than 3.5
        return
    _write(arg_start, arg_end, [a.encode() for a in argv])
    _write(env_start, env_end, [f"{k}={v}".encode() for k, v in env.items() if k != ROOM_ENV])


def _write(start: int, end: int, items: list[bytes]) -> None:
    room, out = end - start, b""
    for item in items:
        if len(out) + len(item) + 1 >= room:
            break
        out += item + b"\0"
    if room > 0:
        ctypes.memmove(start, out.ljust(room, b"\0"), room)


_owned: dict[int, tuple[subprocess.Popen, str]] = {}


def address() -> str | None:
    """The socket of the zygote this process's trainings fork from: the one ``SOCKET_ENV`` names
    (its owner is further up: the run launcher), else one this process starts on first use (it
    ends with this process). None under ``ML_ASSETS_RANK_START=exec``, off Linux, or when none
    could be started: the ranks are then started directly."""
    how = os.environ.get(RANK_START_ENV, "").strip() or RANK_STARTS[0]
    if how not in RANK_STARTS:
        raise ValueError(f"{RANK_START_ENV}={how!r} is not one of {list(RANK_STARTS)}")
    if how == "exec" or not sys.platform.startswith("linux"):  # SO_PEERCRED, /proc, the parent-death signal
        return None
    if given := os.environ.get(SOCKET_ENV, ""):
        return given  # a worker that cannot reach it starts its rank itself
    mine = _owned.get(os.getpid())
    if mine and mine[0].poll() is None:
        return mine[1]
    process, path = start()
    if path is not None:
        _owned[os.getpid()] = (process, path)
        atexit.register(stop, process)
    return path


def cpu_seconds() -> float | None:
    """The CPU seconds (user and system) the zygote this process started has used so far: its
    imports, and the forks (each rank's own CPU is the rank's). None if this process has none."""
    mine = _owned.get(os.getpid())
    fields = processes.stat_fields(mine[0].pid) if mine else None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None


def socket_address(address: str) -> str:
    """What ``socket.bind``/``connect`` take for ``address``: ``@NAME`` is the abstract ``\\0NAME``."""
    return "\0" + address[1:] if address.startswith("@") else address


def start(timeout: float = 30.0) -> tuple[subprocess.Popen, str | None]:
    """A zygote owned by this process, and its address once it listens (None if it did not). Its
    socket is abstract, named at random; only this user may use it (the peer's uid is checked)."""
    address = f"@ml-assets-zygote-{secrets.token_hex(16)}"
    ready_read, ready_write = os.pipe()
    env = processes.child_env({**os.environ, ROOM_ENV: "x" * ENV_ROOM})
    env.pop(SOCKET_ENV, None)
    try:
        process = subprocess.Popen([sys.executable, "-m", "ml_assets.trainer.zygote", address, str(ready_write),
                                    " " * ARGV_ROOM], env=env, stdin=subprocess.DEVNULL, pass_fds=(ready_write,))
    finally:
        os.close(ready_write)
    try:
        # It listens before it imports (milliseconds), then says so; a zygote that died says nothing.
        ready, _, _ = select.select([ready_read], [], [], timeout)
        listening = bool(ready) and os.read(ready_read, 1) == b"1"
    finally:
        os.close(ready_read)
    if not listening:
        stop(process)
        return process, None
    return process, address


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or not args[1].isdigit():
        raise SystemExit("usage: python -m ml_assets.trainer.zygote ADDRESS READY_FD")
    processes.die_with_parent()  # it lives as long as its owner, and starts no thread to watch it
    server = Server(args[0])
    os.write(int(args[1]), b"1")
    os.close(int(args[1]))
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    server.serve()


if __name__ == "__main__":
    main()
