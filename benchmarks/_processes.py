"""Process helpers the benchmarks share (no test code: a benchmark runs from a checkout without the
test package)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process under ``pid``, from /proc (Linux)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    out = []
    for child in (int(p) for p in children.read_text().split()) if children.exists() else ():
        out += [child, *descendants(child)]
    return out


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """A torchrun agent and every process under it (its workers run in sessions of their own)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    proc.wait(timeout=60)
