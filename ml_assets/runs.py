"""Running a model's jobs from the command line, in this process: the home and the Dagster instance,
the model's definitions, a window of days ingested, and the reason a run failed said last."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ml_assets.settings import Settings

if TYPE_CHECKING:
    import dagster as dg

    from ml_assets.spec import ModelSpec

LOG_INFO = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def prepare_home(settings: Settings) -> None:
    """Create the home and point Dagster at an instance: ``DAGSTER_HOME`` when it is set (the one
    ``dg dev`` and ``dg launch`` use), else ``<home>/dagster``, given the package's local instance
    configuration when it has none."""
    from ml_assets.ingest import sources
    from ml_assets.instance import LOCAL_INSTANCE

    sources.use_cache(settings.home / "cache")
    os.environ.setdefault("DAGSTER_HOME", str(settings.dagster_home))
    dagster_home = os.environ["DAGSTER_HOME"]
    os.makedirs(dagster_home, exist_ok=True)
    target = os.path.join(dagster_home, "dagster.yaml")
    if not os.path.exists(target):
        shutil.copyfile(LOCAL_INSTANCE, target)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def model_defs(settings: Settings, spec: ModelSpec) -> dg.Definitions:
    """The model's definitions as its project (or this repository's code location) builds them."""
    from ml_assets.platform import model_definitions

    return model_definitions(spec, settings)


def in_process_tags(command: str) -> dict[str, str]:
    """Tags that name this process as the worker of a run it executes itself, so that production's
    run monitoring watches it instead of trying to resume a run that has no code origin."""
    import socket

    from ml_assets.processes import start_ticks
    from ml_assets.records.runs import InProcessRun

    return InProcessRun(pid=os.getpid(), host=socket.gethostname(), started=start_ticks(os.getpid()) or "",
                        command=command).to_tags()


def failure_reasons(result: dg.ExecuteInProcessResult) -> list[str]:
    """Each failed step's reason: the innermost error's message (a dg.Failure's description, the
    exception a stage raised), not Dagster's "Execution of step ... failed"."""
    reasons = []
    for event in result.all_events:
        data = event.step_failure_data if event.is_step_failure else None
        if data is not None and data.user_failure_data is not None and data.user_failure_data.description:
            reasons.append(f"{event.step_key}: {data.user_failure_data.description.strip()}")
        elif data is not None and data.error is not None:
            error = data.error
            while error.cause is not None:  # Dagster's wrapper, then the exception the stage raised
                error = error.cause
            reasons.append(f"{event.step_key}: {error.message.strip()}")
        elif event.is_run_failure and not reasons:
            reasons.append(event.message or "the run failed")
    return reasons


def report_failure(result: dg.ExecuteInProcessResult, what: str, command: str) -> int:
    """Print why the run failed, as the last lines the user sees; returns exit status 1."""
    print(f"\n{command}: the run {what} failed (its log is above; `dg dev` shows it in the UI). Why:", file=sys.stderr)
    for reason in failure_reasons(result) or ["no step failed; see the log above"]:
        print(f"  {reason}", file=sys.stderr)
    return 1


def published(instance: dg.DagsterInstance, spec: ModelSpec, day: dt.date) -> bool:
    """The day's features exist: its rows were ingested, passed their checks, were published and featurized."""
    from ml_assets.pipeline.graph import ModelGraph, Stage

    return ModelGraph(spec).materialized(instance, Stage.FEATURES, day.isoformat())


def days_between(start: dt.date, end: dt.date) -> Iterable[dt.date]:
    for offset in range((end - start).days + 1):
        yield start + dt.timedelta(days=offset)


def backfill(settings: Settings, spec: ModelSpec, start: dt.date, end: dt.date, force: bool = False) -> int:
    """Ingest, validate and featurize each day from ``start`` to ``end`` (one run per day of the
    model's ingest job, in this process, on the Dagster instance of ``DAGSTER_HOME``), skipping the
    days already published unless ``force``. Stops at the first failed day, saying why."""
    import dagster as dg

    from ml_assets.pipeline.graph import INGEST_STAGES, ModelGraph

    if end < start:
        raise ValueError(f"--end {end} is before --start {start}")
    first, last = spec.partitioning.start, spec.partitioning.end
    if start < first or (last is not None and end > last):
        raise ValueError(f"{start}..{end} is outside the model's partitions ({first}..{last or 'open'})")
    prepare_home(settings)
    instance = dg.DagsterInstance.get()
    job = model_defs(settings, spec).resolve_job_def(ModelGraph(spec).ingest_job)
    days = list(days_between(start, end))
    done = skipped = 0
    for i, day in enumerate(days, start=1):
        if not force and published(instance, spec, day):
            skipped += 1
            print(f"[{i}/{len(days)}] {day}: already published, skipped", flush=True)
            continue
        print(f"[{i}/{len(days)}] {day}: {' -> '.join(INGEST_STAGES)}", flush=True)
        result = job.execute_in_process(partition_key=day.isoformat(), instance=instance, raise_on_error=False,
                                        tags={"ml_assets/model": spec.name, "ml_assets/backfill": f"{start}..{end}",
                                              **in_process_tags("ml-assets backfill")})
        if not result.success:
            print(f"{done} day(s) ingested, {skipped} skipped before {day}", file=sys.stderr)
            return report_failure(result, f"for {day}", "ml-assets backfill")
        done += 1
    print(f"{spec.name}: {done} day(s) ingested, validated and featurized, {skipped} already published "
          f"({start}..{end}); Dagster instance {os.environ['DAGSTER_HOME']}")
    return 0
