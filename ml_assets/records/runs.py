"""What a Dagster run's tags record: the worker process the production run launcher started, what
the run ran (model, partition, backfill), and why a training run trains."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

PID_TAG = "ml_assets/run_worker_pid"
HOST_TAG = "ml_assets/run_worker_host"
STARTED_TAG = "ml_assets/run_worker_started"


@dataclass(frozen=True, kw_only=True)
class RunWorker:
    """The run worker's process: its pid, host and start time (clock ticks since boot, so a reused
    pid is not mistaken for it)."""

    pid: int
    host: str
    started: str

    def to_tags(self) -> dict[str, str]:
        return {PID_TAG: str(self.pid), HOST_TAG: self.host, STARTED_TAG: self.started}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self | None:
        """None when the launcher recorded no worker on this run."""
        if PID_TAG not in tags:
            return None
        return cls(pid=int(tags[PID_TAG]), host=tags.get(HOST_TAG, ""), started=tags.get(STARTED_TAG, ""))


IN_PROCESS_PID_TAG = "ml_assets/in_process_pid"
IN_PROCESS_HOST_TAG = "ml_assets/in_process_host"
IN_PROCESS_STARTED_TAG = "ml_assets/in_process_started"
IN_PROCESS_COMMAND_TAG = "ml_assets/in_process_command"


@dataclass(frozen=True, kw_only=True)
class InProcessRun:
    """A run a command executes in its own process (``ml-assets backfill``, ``demo``, ``promote``):
    that process is its worker. Tags of their own, not RunWorker's: the launcher kills a worker's
    process group, and a command's group is the user's shell job. Run monitoring reads them to tell a
    command still running from one that died; such a run has no code origin to resume from."""

    pid: int
    host: str
    started: str
    command: str

    def to_tags(self) -> dict[str, str]:
        return {IN_PROCESS_PID_TAG: str(self.pid), IN_PROCESS_HOST_TAG: self.host,
                IN_PROCESS_STARTED_TAG: self.started, IN_PROCESS_COMMAND_TAG: self.command}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self | None:
        if IN_PROCESS_PID_TAG not in tags:
            return None
        return cls(pid=int(tags[IN_PROCESS_PID_TAG]), host=tags.get(IN_PROCESS_HOST_TAG, ""),
                   started=tags.get(IN_PROCESS_STARTED_TAG, ""), command=tags.get(IN_PROCESS_COMMAND_TAG, ""))


@dataclass(frozen=True, kw_only=True)
class RunLabels:
    """What a Dagster run's tags say about what it ran: the model, the partition (or partition
    range) and the backfill it belongs to."""

    model: str
    partition: str
    backfill: str

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], job_name: str) -> Self:
        partition = tags.get("dagster/partition", "")
        if not partition and tags.get("dagster/asset_partition_range_start"):
            partition = (f"{tags['dagster/asset_partition_range_start']}.."
                         f"{tags.get('dagster/asset_partition_range_end', '')}")
        return cls(model=tags.get("ml_assets/model", job_name), partition=partition,
                   backfill=tags.get("dagster/backfill", ""))


RETRAIN_TAG = "ml_assets/retrain"
REASON_TAG = "ml_assets/retrain_reason"
EVIDENCE_TAG = "ml_assets/retrain_evidence"


@dataclass(frozen=True, kw_only=True)
class RetrainTags:
    """Why a run of a model's daily job trains: ``schedule``, or ``degradation`` with the reason
    and the evidence (the model_monitor result) that launched it."""

    why: str
    reason: str = ""
    evidence: str = ""

    def to_tags(self) -> dict[str, str]:
        return {RETRAIN_TAG: self.why, **({REASON_TAG: self.reason[:1000]} if self.reason else {}),
                **({EVIDENCE_TAG: self.evidence} if self.evidence else {})}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self | None:
        """None for a run that was not launched to retrain (a run by hand, a backfill)."""
        if RETRAIN_TAG not in tags:
            return None
        return cls(why=tags[RETRAIN_TAG], reason=tags.get(REASON_TAG, ""), evidence=tags.get(EVIDENCE_TAG, ""))
