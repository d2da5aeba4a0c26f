"""A run worker as the production launcher forks it (ml_assets.deploy.run_launcher): from a server that imported
the installed libraries (WORKER_PRELOAD), with ``worker_setup``'s log and stack dumps."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ml_assets.deploy.run_launcher import (
    DUMP_STACKS,
    LocalProcessRunLauncher,
    _forkserver_context,
    worker_setup,
)
from ml_assets_tests.helpers import BUNDLED_SPEC

DAYS = [dt.date(2013, 3, 18), dt.date(2013, 3, 19), dt.date(2013, 3, 20)]
VALIDATED = "validated every day"


def _validate_then_wait(log_path: str) -> None:
    """The forked worker: validates real days as the snapshot step does (the key check's sort on a
    thread of its own, polars' pool, its streaming engine), then waits to be asked for its stacks."""
    worker_setup(log_path)
    from ml_assets.ingest.sources import ROWS, read_day
    from ml_assets.spec import load_spec
    from ml_assets.validation.schema_checks import schema_checks

    spec = load_spec(BUNDLED_SPEC)
    for day in DAYS:
        outcomes = schema_checks(spec.data_schema, read_day(spec, day).tables[ROWS])
        assert all(o.passed for o in outcomes.values()), {k: o.summary for k, o in outcomes.items()}
    print(VALIDATED, flush=True)
    time.sleep(120)


def wait_for_text(path: Path, text: str, timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = path.read_text() if path.exists() else ""
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:.0f} s; the worker's log:\n{log[-3000:]}")


@pytest.mark.slow
def test_a_forked_run_worker_validates_real_days_and_dumps_its_stacks_on_request(tmp_path):
    log = tmp_path / "worker.log"
    worker = _forkserver_context().Process(target=_validate_then_wait, args=(str(log),))
    worker.start()
    try:
        wait_for_text(log, VALIDATED, 120, "the forked worker did not validate three real days")
        assert os.getpgid(worker.pid) == worker.pid, "the worker leads its own process group"
        os.kill(worker.pid, DUMP_STACKS)
        dump = wait_for_text(log, "(most recent call first)", 30, "no stack dump on SIGUSR1")
        assert "in _validate_then_wait" in dump.split(VALIDATED)[1], "the dump names where the worker waits"
        assert worker.is_alive(), "the stack dump must not end the worker"
    finally:
        worker.kill()
        worker.join(30)
    assert worker.exitcode == -signal.SIGKILL


class _ExitedWorker:
    """A run worker that has exited, as the launcher sees one; like a real process's check, asking
    lets other threads run."""

    def is_alive(self) -> bool:
        time.sleep(0.0005)
        return False


def test_exited_workers_reaped_by_several_threads_at_once_are_each_forgotten_once():
    """The daemon's run queue and its run monitoring call the launcher from their own threads: both
    reaping the same exited worker once failed a run at launch with a KeyError."""
    launcher = LocalProcessRunLauncher(start_method="spawn")
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)  # the four threads start reaping together, round after round

    def reap() -> None:
        barrier.wait()
        try:
            launcher._reap()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    for round_ in range(30):
        launcher._children.update({f"run-{round_}-{i}": _ExitedWorker() for i in range(8)})
        threads = [threading.Thread(target=reap) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert launcher._children == {}
