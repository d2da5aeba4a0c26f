"""Processes that follow their parent (ml_assets.processes), with real processes and real SIGKILL.

Each test builds a chain: this test starts a *parent* script, which starts a *follower* that calls
``follow_parent`` and reports its pid; the test then kills the parent and watches the follower,
which is not its child (it is reparented to init when the parent dies), through /proc.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ml_assets import processes
from ml_assets_tests.helpers import cli_env

FOLLOWER = textwrap.dedent("""
    import os, signal, sys, time
    time.sleep(float(sys.argv[1]))  # a process that is slow to start (imports)
    from ml_assets import processes
    if sys.argv[2] == "handler":  # a process that wants to finish something first, and never does
        signal.signal(signal.SIGTERM, lambda *_: print("asked to stop", flush=True))
    line = processes.follow_parent(grace_seconds=float(sys.argv[3]), use_prctl=sys.argv[4] == "prctl")
    print("following", line.parent if line else None, flush=True)
    time.sleep(600)
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    from ml_assets import processes
    env = dict(os.environ) if sys.argv[1] == "passes-env-on" else processes.child_env()
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], *sys.argv[3:]], env=env)
    print(child.pid, flush=True)
    if sys.argv[1] == "exits-at-once":
        os._exit(0)
    time.sleep(600)
""")


_started: list[tuple[subprocess.Popen, int]] = []


def alive(pid: int) -> bool:
    return processes.start_ticks(pid) is not None


@pytest.fixture(autouse=True)
def no_leftovers():
    """Whatever a failing test leaves running is killed (a follower that failed to follow sleeps on)."""
    yield
    while _started:
        parent, follower = _started.pop()
        if parent.poll() is None:
            kill(parent)
        if alive(follower):
            with contextlib.suppress(ProcessLookupError):
                os.kill(follower, signal.SIGKILL)


def start_chain(mode: str, *, delay: float = 0.0, handler: bool = False, grace: float = 5.0,
                mechanism: str = "prctl", **env: str) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, FOLLOWER, str(delay), "handler" if handler else "none", str(grace),
         mechanism], stdout=subprocess.PIPE, text=True, env=cli_env(**env), start_new_session=True)
    follower = int(parent.stdout.readline())
    _started.append((parent, follower))
    return parent, follower


def wait_gone(pid: int, timeout: float) -> float:
    started = time.monotonic()
    while alive(pid):
        if time.monotonic() - started > timeout:
            raise AssertionError(f"process {pid} still runs {timeout}s after its parent died")
        time.sleep(0.02)
    return time.monotonic() - started


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("mechanism", ["prctl", "watchdog"])
def test_a_follower_dies_with_its_parent_killed_by_sigkill(mechanism):
    parent, follower = start_chain("names-itself", mechanism=mechanism)
    time.sleep(1.0)  # following by now
    assert alive(follower)
    kill(parent)
    assert wait_gone(follower, timeout=3) < 2


def test_a_follower_whose_parent_died_while_it_started_exits_as_soon_as_it_looks():
    """The kernel cannot tell a process about a parent that died before it asked: the parent's pid
    in the environment is what gives it away."""
    parent, follower = start_chain("exits-at-once", delay=1.0)
    parent.wait()
    assert alive(follower)  # still "importing": it has not looked yet
    wait_gone(follower, timeout=5)


def test_a_follower_that_handles_the_signal_is_ended_after_its_grace():
    parent, follower = start_chain("names-itself", handler=True, grace=1.0)
    time.sleep(1.0)
    kill(parent)
    gone = wait_gone(follower, timeout=5)
    assert 0.9 < gone < 3  # it was asked (and ignored it), then ended after the grace


def test_an_inherited_parent_variable_is_not_taken_for_a_dead_parent():
    """A parent that did not name itself passes on its own parent's name: the follower must follow
    its real parent, neither dying at once nor outliving it."""
    parent, follower = start_chain("passes-env-on", **{processes.PARENT_ENV: processes.parent_token()})
    time.sleep(1.5)
    assert alive(follower)
    kill(parent)
    wait_gone(follower, timeout=3)


def test_a_process_whose_parent_is_init_follows_nothing_and_lives_on(tmp_path):
    """Started by init (a container's first process, or reparented before it looked, with nothing
    naming its parent): there is nothing to follow, and it must not end itself."""
    out = tmp_path / "out"
    code = ("import os, sys, time\n"
            "time.sleep(0.5)  # its parent exits meanwhile: init (or a subreaper) adopts it\n"
            "from ml_assets import processes\n"
            "line = processes.follow_parent(grace_seconds=0.2)\n"
            f"open({str(out)!r}, 'w').write(f'{{os.getppid()}} {{line}} {{processes.orphaned()}}')\n"
            "time.sleep(1.0)\n"
            f"open({str(out)!r}, 'a').write(' alive')\n")
    launcher = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]])"
    env = {k: v for k, v in cli_env().items() if k != processes.PARENT_ENV}
    subprocess.run([sys.executable, "-c", launcher, code], env=env, check=True)
    deadline = time.monotonic() + 20
    while not (out.exists() and out.read_text().endswith("alive")) and time.monotonic() < deadline:
        time.sleep(0.05)
    ppid, line, orphaned, alive_after = out.read_text().split()
    if int(ppid) == 1:  # no subreaper here: the adopted process's parent is init
        assert (line, orphaned) == ("None", "False")
    assert alive_after == "alive"  # a second after following (grace 0.2 s) it still ran


def test_start_ticks_name_one_process_even_when_its_pid_is_reused():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = processes.start_ticks(child.pid)
        assert ticks and processes.is_alive(child.pid, ticks)
        assert not processes.is_alive(child.pid, str(int(ticks) - 1))  # another process with that pid
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while processes.start_ticks(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes.is_alive(child.pid, ticks)  # a zombie until reaped: not a live process
    child.wait()
    assert processes.start_ticks(child.pid) is None


def test_the_pid_namespace_names_the_machine_boot_and_namespace():
    assert Path("/proc/self/stat").exists()  # the liveness checks above rely on /proc (Linux)
    host, boot, namespace = processes.pid_namespace().split("|")
    assert host and len(boot) == 36 and namespace.startswith("pid:[")
