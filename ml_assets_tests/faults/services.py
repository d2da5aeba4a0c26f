"""Services a fault test can SIGKILL and bring back: a private PostgreSQL cluster (never the shared
server), and a TCP proxy in front of moto's S3 server (moto keeps its objects in memory: killing it
would lose them all, which is a different fault; killing the proxy is the endpoint going away)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ml_assets_tests.helpers import free_port


def _as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its tools as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _tool(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if not found:
        raise RuntimeError(f"{name} (PostgreSQL's server tools) is not installed")
    return str(found)


class PrivateCluster:
    """A throwaway PostgreSQL cluster on its own port, trust auth, fsync off (a test's data)."""

    def __init__(self) -> None:
        # Its own directory under the system's temporary directory: the postgres user must reach it,
        # and pytest's directories are private to the user running the tests.
        root = Path(tempfile.mkdtemp(prefix="ml_assets-pg-"))
        self.root, self.port = root, free_port()
        self.data, self.log = root / "pgdata", root / "postgres.log"
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run(_as_postgres([_tool("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                                     "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_postgres([_tool("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log),
                                     "-w", "-t", "60", "start"]), check=True, capture_output=True, timeout=90)

    @property
    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: a crash, not a shutdown."""
        pid = self.pid
        if pid is None:
            return
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for target in (pid, *map(int, children)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop it (immediately) and remove its files."""
        subprocess.run(_as_postgres([_tool("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", driver: str = "") -> str:
        return f"postgresql{'+' + driver if driver else ''}://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name


PROXY = Path(__file__).with_name("tcp_proxy.py")


class Proxy:
    """``tcp_proxy.py`` as a process: listen on ``port``, forward to ``target``."""

    def __init__(self, target: str, logs: Path, *options: str) -> None:
        self.target, self.port, self.logs, self.proc = target, free_port(), logs, None
        self.options = options

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.logs / "s3-proxy.log", "ab")  # noqa: SIM115 (kept for the process's life)
        self.proc = subprocess.Popen([sys.executable, str(PROXY), str(self.port), self.target, *self.options], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        import socket

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError("the S3 proxy did not start listening")

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
