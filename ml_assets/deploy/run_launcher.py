"""A run launcher for one machine that run monitoring can actually watch.

Dagster's DefaultRunLauncher hands runs to the code server and cannot report a run worker's health,
so the daemon's run monitoring has nothing to check and cannot resume a run: a worker killed with
SIGKILL while its code server is also gone leaves the run in STARTED forever. This launcher starts
each run worker itself (``dagster api execute_run``, the command the Kubernetes and Docker launchers
run in their containers) in its own process group, records the worker's pid, host and start time
on the run, and so supports:

- ``check_run_worker_health``: RUNNING while that exact process lives (pid reuse is caught by the
  start time), FAILED when it is gone and the run has not finished;
- ``resume_run``: the dead worker's process group is killed (no orphaned step process keeps writing)
  and ``dagster api resume_run`` continues the run, re-running the steps that had not finished;
- ``terminate``: SIGTERM to the worker, which interrupts its steps as a cancel from the UI does.

Starting a worker costs seconds of CPU before it does any work: Python imports Dagster and the
libraries the stages use (pandera, scipy, polars, torch, mlflow, scikit-learn). By default (``start_method: forkserver``) workers
fork from a server the launcher starts once, which imported those *installed* libraries: each
worker then only imports the project's own code (ml_assets, the specs, custom checks) from disk, so
an edit to them reaches the next run as with a fresh process. A change to the installed packages
needs the daemon restarted (it owns the server). The launcher also owns the trainer zygote
(ml_assets.trainer.zygote) that every worker's trainings fork their ranks from, for the same reason
and on the same terms. ``start_method: spawn`` starts each worker as a
fresh ``dagster api execute_run`` process instead, and so does a code location whose Python is not
the launcher's.

Select it in dagster.yaml (ml_assets/instance/production.yaml)::

    run_launcher:
      module: ml_assets.deploy.run_launcher
      class: LocalProcessRunLauncher
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import DagsterRun, DagsterRunStatus
from dagster._core.launcher.base import (
    CheckRunHealthResult,
    LaunchRunContext,
    ResumeRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._core.storage.tags import MAX_RETRIES_TAG
from dagster._grpc.types import ExecuteRunArgs, ResumeRunArgs
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData

from ml_assets.processes import start_ticks
from ml_assets.records.runs import InProcessRun, RunWorker
from ml_assets.trainer import zygote

# Installed libraries only (never the project's code, which must be read fresh for every run): what
# a run worker and the stages import, seconds of CPU paid once per server instead of in every run. They
# start no Python thread, but native ones idle in the server when it forks (jemalloc's background
# threads in polars and pyarrow, polars' out-of-core cleaner, numpy's and scipy's OpenBLAS workers):
# a forked worker has none of them and starts its own as it computes (a worker forked from the
# server validates real days, ml_assets_tests/production/test_launcher.py). Nothing computes in the
# server itself.
# The submodules matter: torch.distributed.checkpoint (DTensor, sympy) and matplotlib's Agg canvas
# are the slow imports the training and evaluation steps' own modules pull in.
WORKER_PRELOAD = ("dagster._cli", "dagster._cli.api", "dagster._daemon.cli", "dagster_postgres", "dagster_pipes",
                  "polars", "pyarrow.parquet", "fsspec", "s3fs", "pandera.polars", "scipy.stats", "torch",
                  "torch.distributed.checkpoint", "torch.distributed.checkpoint._fsspec_filesystem", "safetensors.torch",
                  "sklearn.metrics", "matplotlib", "matplotlib.figure",
                  "matplotlib.backends.backend_agg", "mlflow", "mlflow.pyfunc")
START_METHODS = ("forkserver", "spawn")


def _forkserver_context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_PRELOAD))  # a module that fails to import is skipped
    return context


# A run worker writes every thread's stack to its log on this signal (`kill -USR1 <pid>`, the pid in
# the run's tag ml_assets/run_worker_pid): what a run that stopped making progress is waiting on.
DUMP_STACKS = signal.SIGUSR1


def worker_setup(log_path: str) -> None:
    """What a run worker forked from the launcher's server does first: its own session (so its
    process group can be killed), output to the log, and every thread's stack there on a crash or on
    ``DUMP_STACKS``."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(DUMP_STACKS, file=sys.stderr, all_threads=True)


def _run_worker(argv: list[str], log_path: str) -> None:
    """A run worker forked from the launcher's server: ``worker_setup``, then exactly what
    ``dagster api execute_run`` does."""
    worker_setup(log_path)
    from dagster._cli import main

    sys.argv = ["dagster", *argv]
    main()


class LocalProcessRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data: ConfigurableClassData | None = None, log_dir: str | None = None,
                 start_method: str = "forkserver"):
        if start_method not in START_METHODS:
            raise ValueError(f"LocalProcessRunLauncher: start_method {start_method!r} is not one of {list(START_METHODS)}")
        self._inst_data = inst_data
        self._log_dir = log_dir
        self._start_method = start_method
        self._forkserver: multiprocessing.context.BaseContext | None = None
        self._children: dict[str, subprocess.Popen | multiprocessing.process.BaseProcess] = {}
        # The daemon calls a launcher from several threads at once (the run queue launches while run
        # monitoring checks workers): two threads must not reap the same finished worker.
        self._children_lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        from dagster import Field, StringSource

        return {"log_dir": Field(StringSource, is_required=False,
                                 description="where run workers' stdout/stderr go (default $DAGSTER_HOME/run_workers)"),
                "start_method": Field(StringSource, is_required=False, default_value="forkserver",
                                      description="forkserver: workers fork from a server that imported the installed "
                                                  "libraries once; spawn: a fresh `dagster api execute_run` process each")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, **config_value)

    # -- starting workers -------------------------------------------------------------------

    def _log_path(self, run_id: str, what: str) -> Path:
        base = Path(self._log_dir or Path(os.environ.get("DAGSTER_HOME", ".")) / "run_workers")
        base.mkdir(parents=True, exist_ok=True)
        return base / f"{run_id}.{what}.log"

    def _start(self, run: DagsterRun, args: list[str], what: str) -> int:
        self._reap()
        log_path = self._log_path(run.run_id, what)
        # ``[python, -m, dagster, api, ...]`` or ``[dagster, api, ...]``: the worker's Dagster CLI arguments
        cli = args[args.index("api"):]
        same_python = args[0] in ("dagster", sys.executable) or Path(args[0]).parent == Path(sys.executable).parent
        # Under the lock: Process.start() polls multiprocessing's other children, which _reap polls too.
        with self._children_lock:
            if same_python and zygote.SOCKET_ENV not in os.environ and (path := zygote.address()):
                # Before the server forks: every worker inherits it, and their trainings fork ranks from it.
                os.environ[zygote.SOCKET_ENV] = path
            if self._start_method == "forkserver" and same_python:
                if self._forkserver is None:
                    self._forkserver = _forkserver_context()
                child = self._forkserver.Process(target=_run_worker, args=(cli, str(log_path)), daemon=False,
                                                 name=f"dagster-run-{run.run_id}")
                child.start()
                # Not one of multiprocessing's children: at exit it would join them, and the daemon's
                # restart would wait for every running run to finish (a spawned worker outlives it too).
                multiprocessing.process._children.discard(child)
            else:
                with open(log_path, "ab") as log:
                    child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, close_fds=True)
            self._children[run.run_id] = child
        started = start_ticks(child.pid) or ""
        self._instance.add_run_tags(run.run_id, RunWorker(pid=child.pid, host=socket.gethostname(),
                                                          started=started).to_tags())
        return child.pid

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if run.job_code_origin is None:
            raise ValueError(f"run {run.run_id} has no code origin: it cannot be launched in a process")
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id,
                              instance_ref=self._instance.get_ref(), set_exit_code_on_failure=True)
        pid = self._start(run, list(args.get_command_args()), "execute")
        self._instance.report_engine_event(f"Started run worker process {pid} on {socket.gethostname()}", run,
                                           cls=self.__class__)

    @property
    def supports_resume_run(self) -> bool:
        return True

    def resume_run(self, context: ResumeRunContext) -> None:
        run = context.dagster_run
        if run.job_code_origin is None:  # a command ran it in its own process: nothing to resume from
            command = InProcessRun.from_tags(run.tags)
            who = f"`{command.command}` (pid {command.pid} on {command.host})" if command else "its process"
            self._instance.report_run_failed(
                run, f"{who} ran this run in its own process and ended before the run finished; a run "
                     "executed inside a command cannot be resumed: run the command again")
            return
        self._kill_group(run)  # what the dead worker started (step processes, torchrun) goes too
        args = ResumeRunArgs(job_origin=run.job_code_origin, run_id=run.run_id,
                             instance_ref=self._instance.get_ref(), set_exit_code_on_failure=True)
        pid = self._start(run, list(args.get_command_args()), f"resume-{context.resume_attempt_number or 1}")
        self._instance.report_engine_event(
            f"Resumed run with worker process {pid} (attempt {context.resume_attempt_number})", run,
            cls=self.__class__)

    # -- watching workers -------------------------------------------------------------------

    def _reap(self) -> None:
        """Forgets (and so collects the exit status of) the workers that have exited."""
        with self._children_lock:
            for run_id, child in list(self._children.items()):
                done = child.poll() is not None if isinstance(child, subprocess.Popen) else not child.is_alive()
                if done:
                    del self._children[run_id]

    def _worker(self, run: DagsterRun) -> tuple[int | None, bool]:
        """The worker's pid and whether it is alive (None when this run has no recorded worker)."""
        worker = RunWorker.from_tags(run.tags)
        if worker is None:
            return None, False
        self._reap()
        started = start_ticks(worker.pid)
        return worker.pid, started is not None and started == worker.started

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        run = self._instance.get_run_by_id(run.run_id) or run  # the latest tags (a resume changes the pid)
        if (command := InProcessRun.from_tags(run.tags)) is not None:
            return _in_process_health(command)
        worker = RunWorker.from_tags(run.tags)
        if worker is None and run.job_code_origin is None:
            # Someone's own execute_in_process: no process to watch, none to resume; its max runtime
            # still applies. Reported as lost, run monitoring would try to resume it and fail.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "an in-process run that names no process: not watched")
        if worker is not None and worker.host and worker.host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run worker runs on {worker.host}")
        pid, alive = self._worker(run)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, "no run worker was recorded for this run")
        if alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(pid))
        if run.status == DagsterRunStatus.SUCCESS:
            return CheckRunHealthResult(WorkerStatus.SUCCESS, run_worker_id=str(pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {pid} exited before the run finished",
                                    run_worker_id=str(pid))

    def get_run_worker_debug_info(self, run: DagsterRun, include_container_logs: bool | None = True) -> str | None:
        logs = sorted(self._log_path(run.run_id, "").parent.glob(f"{run.run_id}.*.log"))
        if not logs:
            return None
        tail = logs[-1].read_text(errors="replace")[-2000:]
        return f"last output of the run worker ({logs[-1].name}):\n{tail}"

    # -- stopping workers -------------------------------------------------------------------

    def _kill_group(self, run: DagsterRun) -> None:
        worker = RunWorker.from_tags(run.tags)
        if worker is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)
        self._reap()

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        pid, alive = self._worker(run)
        if not alive or pid is None:
            return False
        # A run stopped on purpose (a cancel, or run monitoring past dagster/max_runtime, which then
        # marks it failed) is not a crash: run retries must not start it again. (dagster/will_retry
        # is recomputed when the failure is stored, from dagster/max_retries.)
        self._instance.add_run_tags(run_id, {MAX_RETRIES_TAG: "0"})
        if run.status != DagsterRunStatus.CANCELING:  # run monitoring reports it before calling us
            self._instance.report_run_canceling(run)
        os.kill(pid, signal.SIGTERM)  # the worker interrupts its steps and reports the run canceled
        return True

    def dispose(self) -> None:
        self._reap()


def _in_process_health(command: InProcessRun) -> CheckRunHealthResult:
    """A run a command executes in its own process: RUNNING while that process lives."""
    if command.host and command.host != socket.gethostname():
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"run in process by `{command.command}` on {command.host}: "
                                                          "not watched from here")
    if start_ticks(command.pid) == command.started and command.started:
        return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(command.pid))
    return CheckRunHealthResult(WorkerStatus.FAILED, f"`{command.command}` (pid {command.pid}), which ran this run in "
                                                     "its own process, has ended")
