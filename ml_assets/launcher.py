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

Select it in dagster.yaml (deploy/production/dagster.yaml)::

    run_launcher:
      module: ml_assets.launcher
      class: LocalProcessRunLauncher
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster._core.launcher.base import (
    CheckRunHealthResult,
    LaunchRunContext,
    ResumeRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._core.storage.tags import MAX_RETRIES_TAG
from dagster._grpc.types import ExecuteRunArgs, ResumeRunArgs
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData

PID_TAG = "ml_assets/run_worker_pid"
HOST_TAG = "ml_assets/run_worker_host"
STARTED_TAG = "ml_assets/run_worker_started"  # the process's start time in clock ticks since boot


def process_start_ticks(pid: int) -> str | None:
    """The process's start time from /proc (None when there is no such live process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # a zombie or dead process is not a running worker
        return None
    return fields[19]


class LocalProcessRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data: ConfigurableClassData | None = None, log_dir: str | None = None):
        self._inst_data = inst_data
        self._log_dir = log_dir
        self._children: dict[str, subprocess.Popen] = {}
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        from dagster import Field, StringSource

        return {"log_dir": Field(StringSource, is_required=False,
                                 description="where run workers' stdout/stderr go (default $DAGSTER_HOME/run_workers)")}

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
        with open(self._log_path(run.run_id, what), "ab") as log:
            child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, close_fds=True)
        self._children[run.run_id] = child
        started = process_start_ticks(child.pid) or ""
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(child.pid), HOST_TAG: socket.gethostname(),
                                                 STARTED_TAG: started})
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
        self._kill_group(run)  # what the dead worker started (step processes, torchrun) goes too
        args = ResumeRunArgs(job_origin=run.job_code_origin, run_id=run.run_id,
                             instance_ref=self._instance.get_ref(), set_exit_code_on_failure=True)
        pid = self._start(run, list(args.get_command_args()), f"resume-{context.resume_attempt_number or 1}")
        self._instance.report_engine_event(
            f"Resumed run with worker process {pid} (attempt {context.resume_attempt_number})", run,
            cls=self.__class__)

    # -- watching workers -------------------------------------------------------------------

    def _reap(self) -> None:
        for run_id, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[run_id]

    def _worker(self, run: DagsterRun) -> tuple[int | None, bool]:
        """The worker's pid and whether it is alive (None when this run has no recorded worker)."""
        tags = run.tags
        if PID_TAG not in tags:
            return None, False
        pid = int(tags[PID_TAG])
        self._reap()
        started = process_start_ticks(pid)
        return pid, started is not None and started == tags.get(STARTED_TAG)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        run = self._instance.get_run_by_id(run.run_id) or run  # the latest tags (a resume changes the pid)
        if run.tags.get(HOST_TAG, socket.gethostname()) != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run worker runs on {run.tags[HOST_TAG]}")
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
        pid = run.tags.get(PID_TAG)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)
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
