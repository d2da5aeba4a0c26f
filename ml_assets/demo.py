"""``ml-assets demo``: the main job on embedded defaults, for one bundled model.

The window's days are ingested, validated and featurized, the first trainable partition runs every
stage, one tick of the promotion sensor runs, and a summary says where to look next.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shlex
import time

from ml_assets.runs import LOG_INFO, in_process_tags, model_defs, prepare_home, report_failure
from ml_assets.settings import BUNDLED_MODELS_DIR, Settings, load_settings


def _say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def demo(model: str, day: str | None) -> int:
    settings = load_settings()
    if not settings.models_dirs:  # the demo's models are the bundled ones, wherever it runs
        settings = dataclasses.replace(settings, models_dirs=(BUNDLED_MODELS_DIR,))
    prepare_home(settings)
    import dagster as dg

    from ml_assets.model_files import load_model_spec
    from ml_assets.pipeline.graph import INGEST_STAGES, ModelGraph

    spec = load_model_spec(settings.models_dirs, model)
    # The window and every test day but the target's own are ingested first.
    before = spec.training.window_days + spec.evaluation.test_days - 1
    target = dt.date.fromisoformat(day) if day else spec.partitioning.start + dt.timedelta(days=before)
    days = [target - dt.timedelta(days=before - i) for i in range(before)]
    instance = dg.DagsterInstance.get()
    defs = model_defs(settings, spec)
    graph = ModelGraph(spec)
    job = defs.resolve_job_def(graph.daily_job)
    started = time.perf_counter()
    _say(f"ml_assets demo: model {spec.name}, home {settings.home}")
    tests = spec.evaluation.test_days
    print(f"    {len(days)} days of data ({days[0]}..{days[-1]}) are ingested, validated and featurized;\n"
          f"    then partition {target} trains on the first {spec.training.window_days} of them (torchrun, "
          f"{spec.training.processes_per_node} processes; the last {spec.training.validation_days} validate), is "
          f"evaluated on the {tests} held-out day(s) ending {target} against a baseline and the champion, "
          "registered and, if the gate passed, promoted.", flush=True)
    for i, current in enumerate(days, start=1):
        _say(f"[{i}/{len(days) + 1}] {current}: {' -> '.join(INGEST_STAGES)}")
        result = job.execute_in_process(
            partition_key=current.isoformat(), instance=instance, run_config=LOG_INFO, raise_on_error=False,
            asset_selection=[graph.key(s) for s in INGEST_STAGES], tags=in_process_tags("ml-assets demo"),
        )
        if not result.success:
            return report_failure(result, f"for {current}", "ml-assets demo")
    _say(f"[{len(days) + 1}/{len(days) + 1}] {target}: all stages (ingest, train, evaluate, register)")
    result = job.execute_in_process(partition_key=target.isoformat(), instance=instance, run_config=LOG_INFO,
                                    raise_on_error=False, tags=in_process_tags("ml-assets demo"))
    if not result.success:
        return report_failure(result, f"for {target}", "ml-assets demo")
    if _refused(result, spec):
        return _gate_blocked(instance, spec, target, settings)
    _say(f"promotion: one tick of {graph.promotion_sensor} (what the Dagster daemon runs every minute)")
    status = promote_by_sensor(instance, spec, defs)
    if status:
        return status
    _summary(instance, spec, target, settings, time.perf_counter() - started)
    return 0


def promote_by_sensor(instance, spec, defs) -> int:
    """Evaluate the promotion sensor once and run what it asks for, in this process."""
    import dagster as dg

    from ml_assets.pipeline.graph import ModelGraph

    graph = ModelGraph(spec)
    sensor = defs.resolve_sensor_def(graph.promotion_sensor)
    context = dg.build_sensor_context(instance=instance, resources={"tracking": defs.resources["tracking"]})
    tick = sensor.evaluate_tick(context)
    if not tick.run_requests:
        print(f"    no promotion: {tick.skip_message}", flush=True)
        return 0
    job = defs.resolve_job_def(graph.promote_job)
    for request in tick.run_requests:
        result = job.execute_in_process(run_config={**request.run_config, **LOG_INFO}, instance=instance,
                                        tags={**request.tags, **in_process_tags("ml-assets demo")}, raise_on_error=False)
        if not result.success:
            return report_failure(result, f"of {graph.promote_job}", "ml-assets demo")
    return 0


def _refused(result, spec) -> bool:
    """The run evaluated a candidate and registered none: the promotion gate refused it (an outcome,
    and the run succeeded)."""
    from ml_assets.pipeline.graph import Stage, stage_key

    made = {event.asset_key for event in result.get_asset_materialization_events()}
    return stage_key(spec.name, Stage.EVALUATION_REPORT) in made and stage_key(spec.name, Stage.REGISTERED_MODEL) not in made


def _gate_blocked(instance, spec, target: dt.date, settings: Settings) -> int:
    """The evaluation's verdict when the gate said no: a designed outcome, not a failure of the run."""
    from ml_assets.evaluation.record import EvaluationRecord
    from ml_assets.pipeline.graph import ModelGraph

    report = ModelGraph(spec).latest(instance, EvaluationRecord, target.isoformat())
    metrics = "  ".join(f"{m} {report.metrics[m]:.4f}" for m in spec.evaluation.metrics)
    _say(f"the promotion gate refused {spec.name}'s candidate for {target}: evaluated, not registered")
    print(f"""
    test metrics       {metrics}   on {report.test_rows} held-out rows
    promotion gate     refused: {report.gate_reason}

    The evaluation report (metrics, intervals, slices, the champion's and baselines' figures) is the
    {spec.name}/evaluation_report asset: {Hints.of(settings).dagster_ui}, then Assets -> {spec.name}.
""", flush=True)
    return 0


def _summary(instance, spec, target: dt.date, settings: Settings, seconds: float) -> None:
    from ml_assets.evaluation.record import EvaluationRecord
    from ml_assets.pipeline.graph import ModelGraph
    from ml_assets.promotion.record import PromotionRecord
    from ml_assets.registry.record import RegisteredRecord

    day, graph = target.isoformat(), ModelGraph(spec)
    registered = graph.latest(instance, RegisteredRecord, day)
    report = graph.latest(instance, EvaluationRecord, day)
    production = graph.latest(instance, PromotionRecord, None)
    metrics = "  ".join(f"{m} {report.metrics[m]:.4f}" for m in spec.evaluation.metrics)
    tested = report.test_days
    tested = tested[0] if len(tested) == 1 else f"{tested[0]}..{tested[-1]}"
    best = next((b for b in report.baseline["baselines"] if b["name"] == report.baseline["best"]), None)
    baseline = "  ".join(f"{m} {best['metrics'][m]:.4f}" for m in spec.evaluation.metrics) if best else "none"
    alias = f" (alias @{registered.alias})" if registered.alias else ""
    champion = (f"version {production.champion_version} ({production.decision} by {production.actor}: "
                f"{production.reason[:90]})") if production else "none yet"
    hints = Hints.of(settings)
    _say(f"done in {seconds:.0f} s")
    print(f"""
    registered model   {registered.model_name} version {registered.model_version}{alias}
    learned from       main commit {registered.version_tags.data_commit} of repository {spec.repository}
                       (training days' commits are in the version's 'data_commits' tag)
    test metrics       {metrics}   on {tested}: {report.test_rows} held-out rows
    best baseline      {baseline}   ({best['description'] if best else ''})
    promotion gate     {'accepted' if report.gate_passed else 'refused'}: {report.gate_reason[:150]}
    @champion          {champion}
    MLflow run         {registered.mlflow_run_id}

{hints.setup}    The champion's audit (evidence, data checks, promotions, pins):  {hints.cli} audit {spec.name}
    Its model card (add --format html --output card.html for one page with the plots):  {hints.cli} card {spec.name}
    Rebuild it from its records and compare the weights:  {hints.cli} reproduce {spec.name} --version {production.champion_version if production else registered.model_version}

    Dagster UI:  {hints.dagster_ui}   then open http://127.0.0.1:3000  (Assets -> {spec.name}: the lineage and its metadata)
    MLflow UI:   {hints.mlflow_ui}   then open http://127.0.0.1:5000  (Models -> {spec.name})
    One more day on its own, through the Dagster CLI:
      {hints.materialize(spec.name, target + dt.timedelta(days=1))}
    Everything written lives under {settings.home}
""", flush=True)


@dataclasses.dataclass(frozen=True)
class Hints:
    """The commands to run next, as they exist where the demo ran: this checkout's make targets and
    venv, or the installed package's commands with the variables that find the demo's home."""

    cli: str
    dagster_ui: str
    mlflow_ui: str
    setup: str
    checkout: bool

    @classmethod
    def of(cls, settings: Settings) -> Hints:
        if settings.project is not None and settings.project.is_this_checkout:
            return cls(cli=".venv/bin/ml-assets", dagster_ui="make dev", mlflow_ui="make mlflow-ui", setup="",
                       checkout=True)
        variables = {"ML_ASSETS_MODELS_DIR": os.pathsep.join(str(p) for p in settings.models_dirs),
                     "ML_ASSETS_HOME": str(settings.home), "DAGSTER_HOME": os.environ["DAGSTER_HOME"]}
        export = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
        return cls(cli="ml-assets", dagster_ui="dagster dev -m ml_assets",
                   mlflow_ui=f"mlflow ui --backend-store-uri {shlex.quote(settings.mlflow_tracking_uri)}",
                   setup=f"    In a new shell, first:  {export}\n", checkout=False)

    def materialize(self, model: str, day: dt.date) -> str:
        if self.checkout:
            return f"make materialize DAY={day.isoformat()}"
        return f"dagster asset materialize -m ml_assets --select 'group:{model}' --partition {day.isoformat()}"
