"""Which processes are alive, and processes that must not outlive their parent. Standard library
only: the trainer imports this, and it never imports dagster.

A training runs as a chain of processes: the Dagster step (or the run worker that runs it) starts
torchrun's agent (``ml_assets.trainer.agent``), which starts one trainer process per rank
(``python -m ml_assets.trainer``). Each link but the first calls ``follow_parent`` as its first
statement, so that whatever kills its parent (an out-of-memory kill, ``kill -9`` of a process group,
a crashed node agent) also ends it within seconds instead of leaving it running, reparented to
init, holding memory and GPUs and writing checkpoints beside the run that replaces it. torchrun
starts its workers in sessions of their own, so killing the run worker's process group never
reaches the ranks by itself.

The parent names itself to its child in ``ML_ASSETS_PARENT`` (``pid:start``, see ``parent_token``)
rather than the child trusting ``getppid()`` when it starts: a parent that died before the child got
to ``follow_parent`` would otherwise go unnoticed (the child would already be init's).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PARENT_ENV = "ML_ASSETS_PARENT"
"""Set by a process for the child it starts: its own ``parent_token()``."""
PR_SET_PDEATHSIG = 1
ORPHAN_SIGNAL = signal.SIGTERM
"""What a process gets when its parent dies: it dies of it, or its handler checkpoints and exits."""
ORPHAN_EXIT = 75
"""The exit code of a process its lifeline ends (EX_TEMPFAIL, like a preempted trainer)."""
POLL_SECONDS = 0.25


def stat_fields(pid: int | str = "self") -> list[str] | None:
    """/proc/PID/stat's fields from the third (the state) on: field N of proc(5) is index N - 3.
    None where there is no such process or no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(")") + 2:].split()


def start_ticks(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc: with the pid, it names one
    process even after the pid is reused. None when there is no such live process (a zombie is not
    live); "" where /proc does not exist and the process exists."""
    fields = stat_fields(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return None
        return "" if _exists(pid) else None
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def seconds_alive() -> float | None:
    """Seconds since this process started (its interpreter's start, imports included; for a rank
    forked by the trainer zygote, since its client started), from /proc; None where /proc does not say."""
    client = _lifeline.started if _lifeline is not None else None  # a forked rank's life began with its client's
    started = client or start_ticks(os.getpid())
    if not started:
        return None
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return max(0.0, uptime - int(started) / os.sysconf("SC_CLK_TCK"))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_alive(pid: int, started: str | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` (``start_ticks``) still runs."""
    now = start_ticks(pid)
    if now is None:
        return False
    return not started or not now or now == started


def pid_namespace() -> str:
    """Where a pid means the same process: this boot of this machine and this pid namespace (a
    container has its own). Two processes that report the same value can check each other's pid."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "|".join(parts)


def parent_token(pid: int | None = None) -> str:
    """``pid:start`` of this process (or ``pid``), for ``PARENT_ENV`` in a child's environment."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_ticks(pid) or ''}"


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) naming this process as the child's parent."""
    return {**(os.environ if env is None else env), PARENT_ENV: parent_token()}


class Lifeline:
    """Ties this process to its parent (see ``follow_parent``), or to the client a forked rank
    works for (``follow_process``: ``started`` set)."""

    def __init__(self, parent: int, *, grace_seconds: float, use_prctl: bool, started: str | None = None,
                 hangup: socket.socket | None = None) -> None:
        self.parent, self.grace_seconds, self.started, self.hangup = parent, grace_seconds, started, hangup
        self.before_exit: list[Callable[[], None]] = []
        """Run (errors ignored) just before the process ends itself once the grace is over."""
        self.prctl = use_prctl and _set_parent_death_signal(ORPHAN_SIGNAL)
        threading.Thread(target=self._watch, name="lifeline", daemon=True).start()

    @property
    def orphaned(self) -> bool:
        if self.started is not None:
            return not is_alive(self.parent, self.started)
        return os.getppid() != self.parent

    def _watch(self) -> None:
        # Polls even where the kernel delivers the signal (prctl): the signal only asks; a process
        # whose main thread is blocked (a collective waiting for a dead peer) never runs its Python
        # handler, so this thread is what guarantees the exit.
        if self.hangup is not None:
            with contextlib.suppress(OSError):
                self.hangup.recv(1)  # returns when the client's end closes: it exited or was killed
        while not self.orphaned:
            time.sleep(POLL_SECONDS)
        if not self.prctl and self.grace_seconds > 0:
            with contextlib.suppress(OSError):
                os.kill(os.getpid(), ORPHAN_SIGNAL)
        time.sleep(self.grace_seconds)
        for callback in self.before_exit:
            with contextlib.suppress(BaseException):
                callback()
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"[{os.getpid()}] its parent process {self.parent} is gone; exiting after "
                             f"{self.grace_seconds:g}s\n")
            sys.stderr.flush()
        os._exit(ORPHAN_EXIT)


_lifeline: Lifeline | None = None


def follow_parent(*, grace_seconds: float = 5.0, use_prctl: bool = True) -> Lifeline | None:
    """From now on, when this process's parent exits (however it died), this process gets
    ``ORPHAN_SIGNAL`` at once (Linux: ``prctl(PR_SET_PDEATHSIG)``; elsewhere, or with ``use_prctl``
    off, within ``POLL_SECONDS``) and ends itself ``grace_seconds`` later if it has not exited by
    then. A process that has no handler for the signal yet simply dies of it; one that has (the
    trainer's checkpoint-then-exit) gets the grace to use it.

    The parent is the one ``PARENT_ENV`` names; if that process already exited, this process is an
    orphan already and gets the signal now. Without ``PARENT_ENV`` (a plain ``torchrun`` by hand), or
    when it names a live process that is not our parent (the variable was inherited from further up
    the chain), the current parent is followed. Started by init or from outside the pid namespace
    (parent 0 or 1), there is nothing to follow: returns None. Calling it again returns the first
    lifeline with the new grace."""
    global _lifeline
    if _lifeline is not None:
        if _lifeline.started is None:  # a forked rank ends with its client, without grace
            _lifeline.grace_seconds = grace_seconds
        return _lifeline
    parent = _named_parent()
    if parent <= 1:
        return None
    _lifeline = Lifeline(parent, grace_seconds=grace_seconds, use_prctl=use_prctl)
    if os.getppid() != parent:  # it died before the kernel was asked to tell us
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), ORPHAN_SIGNAL)
    return _lifeline


def die_with_parent() -> bool:
    """Linux only: ``ORPHAN_SIGNAL`` when the parent exits, from the kernel alone, with no watcher
    thread (for a process that forks: the trainer zygote). Whether the kernel will deliver it."""
    parent = _named_parent()
    if parent <= 1 or not _set_parent_death_signal(ORPHAN_SIGNAL):
        return False
    if os.getppid() != parent:  # it died before the kernel was asked to tell us
        os.kill(os.getpid(), ORPHAN_SIGNAL)
    return True


def follow_process(pid: int, started: str, hangup: socket.socket | None = None) -> Lifeline:
    """For a rank the trainer zygote forked on behalf of the client ``pid`` (``started``: its
    ``start_ticks``), which torchrun started as its worker: this process is that worker. It lives no
    longer than the client: when the client ends (``hangup``, the client's connection, closes at
    once; else polled), it ends at once as the client did, freeing what ``before_exit`` frees. Its
    seconds alive count from the client's start. A signal the client gets, it forwards here."""
    global _lifeline
    _lifeline = Lifeline(pid, grace_seconds=0.0, use_prctl=False, started=started, hangup=hangup)
    return _lifeline


def report_exit(code: int) -> None:
    """A rank forked on a client's behalf (``follow_process``) tells its client how it ends. The zygote
    reports the exit status once it reaps the rank, but the zygote dies with its owner (a daemon
    restarted mid-training): without this line the client cannot know, exits as failed, and torchrun
    restarts a training that had finished. Nothing for a rank started directly."""
    if _lifeline is not None and _lifeline.hangup is not None:
        with contextlib.suppress(OSError):
            _lifeline.hangup.sendall(b'{"rank_exit": %d}\n' % int(code))


def launcher() -> int:
    """The process that started this one as a worker (torchrun's agent, for a rank): the parent, or
    for a rank forked on a client's behalf (``follow_process``), the client's parent."""
    if _lifeline is not None and _lifeline.started is not None:
        fields = stat_fields(_lifeline.parent)
        return int(fields[1]) if fields else 0
    return os.getppid()


def lifeline() -> Lifeline | None:
    return _lifeline


def orphaned() -> bool:
    """Whether the process ``follow_parent`` tied this one to has exited."""
    return _lifeline is not None and _lifeline.orphaned


def _named_parent() -> int:
    actual = os.getppid()
    pid_text, _, started = os.environ.get(PARENT_ENV, "").partition(":")
    if not pid_text.isdigit() or int(pid_text) == actual:
        return actual
    if is_alive(int(pid_text), started):  # alive but not ours: inherited from an ancestor
        return actual
    return int(pid_text)  # our parent died before we looked


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
