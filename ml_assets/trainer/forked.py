"""torchrun's worker when the trainer zygote forks the ranks (ml_assets.trainer.zygote says why):
``python -m ml_assets.trainer.forked --config CONFIG`` asks the zygote named by
``ML_ASSETS_TRAINER_ZYGOTE`` for a rank running ``python -m ml_assets.trainer --config CONFIG``
with this process's environment, working directory and standard streams, forwards it every signal
this process gets, and exits as the rank did (its exit code, or the signal that killed it).

Without a zygote (none named, gone, or running another Python) it becomes that rank itself
(``exec``), after one line on stderr saying why: a training never depends on the zygote.
The standard library only, so that it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time

from ml_assets import processes
from ml_assets.trainer import zygote

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
GRACE_SECONDS = 65.0
"""Until the config is read: the longest orphan grace a config may set (60 s), and a margin."""
DEFAULT_ORPHAN_GRACE = 5.0
"""training.checkpoint.orphan_grace_seconds when the config does not say (TrainConfig's default)."""


class _Rank:
    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []

    def forward(self, signum: int, _frame=None) -> None:
        if self.pid is None:
            self.pending.append(signum)  # sent once the rank exists
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def started(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self.forward(signum)


def main(argv: list[str] | None = None) -> None:
    processes.follow_parent(grace_seconds=GRACE_SECONDS)
    args = sys.argv[1:] if argv is None else argv
    # After torchrun's agent dies, the rank gets the forwarded signal and checkpoints; it follows this
    # process (not the agent), so this grace is what bounds it, as the orphan grace bounds an exec'd rank.
    processes.follow_parent(grace_seconds=_orphan_grace(args))
    rank = _Rank()
    for signum in FORWARDED:
        signal.signal(signum, rank.forward)
    path = os.environ.get(zygote.SOCKET_ENV, "")
    if not path:
        _start_here(args, f"{zygote.SOCKET_ENV} is not set", rank)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(zygote.socket_address(path))
        zygote.send_request(sock, {"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path,
                                   "executable": sys.executable, "version": sys.version}, _streams())
        replies = sock.makefile("rb")
        first = _read(replies)
    except OSError as exc:
        _start_here(args, f"the trainer zygote at {path} cannot be reached ({exc})", rank)
    if first is None or "pid" not in first:
        _start_here(args, f"the trainer zygote at {path} {'refused: ' + first['refused'] if first else 'hung up'}", rank)
    rank.started(int(first["pid"]))
    said = None  # the code the rank said it ends with (processes.report_exit), should the zygote be gone
    while (last := _read(replies)) is not None and "exit" not in last:
        said = last.get("rank_exit", said)
    _exit_as(last, int(first["pid"]), str(first.get("started", "")), said)


def _orphan_grace(args: list[str]) -> float:
    """The config's ``orphan_grace_seconds`` (a local config file; a URL or an unreadable file: the
    default, and the rank itself will say what is wrong with its config)."""
    path = args[args.index("--config") + 1] if "--config" in args[:-1] else ""
    try:
        with open(path, encoding="utf-8") as fh:
            grace = float(json.load(fh).get("orphan_grace_seconds", DEFAULT_ORPHAN_GRACE))
    except (OSError, ValueError, TypeError, AttributeError):
        return DEFAULT_ORPHAN_GRACE
    return grace if 0 < grace <= 60 else DEFAULT_ORPHAN_GRACE


def _streams() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # a closed stream: the rank gets /dev/null there, as it would read or write nothing
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _read(replies) -> dict | None:
    line = replies.readline()
    return json.loads(line) if line else None


def _exit_as(last: dict | None, pid: int, started: str, said: int | None) -> None:
    if last is None or "exit" not in last:
        # The zygote is gone (its owner died): the rank follows this process; wait until it is gone too.
        while processes.is_alive(pid, started or None):
            time.sleep(processes.POLL_SECONDS)
        if said is not None:
            sys.stderr.write(f"[ml_assets.trainer.forked] the trainer zygote exited before rank {pid}, which said it "
                             f"ended with code {said}\n")
            sys.exit(int(said))
        sys.stderr.write(f"[ml_assets.trainer.forked] the trainer zygote exited before rank {pid}; its exit status "
                         f"is unknown\n")
        sys.exit(processes.ORPHAN_EXIT)
    code = int(last["exit"])
    if code >= 0:
        sys.exit(code)
    signal.signal(-code, signal.SIG_DFL)  # die of the same signal, so torchrun sees what the rank saw
    os.kill(os.getpid(), -code)
    sys.exit(128 - code)


def _start_here(args: list[str], why: str, rank: _Rank) -> None:
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    for signum in rank.pending:  # asked to stop before there was a rank: stop as it would have
        os.kill(os.getpid(), signum)
    sys.stderr.write(f"[ml_assets.trainer.forked] {why}; starting the rank in this process\n")
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ml_assets.trainer", *args])


if __name__ == "__main__":
    main()
