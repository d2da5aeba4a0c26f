"""model_monitor and retraining on evidence through Dagster, on a files source whose days the test
rewrites: a normal day is ok; a day whose labels, arriving later, contradict the champion's scores
crosses the blocking limit (its check fails with severity ERROR, the reason names the metric) and
the retrain sensor launches exactly one training of the latest partition, with that reason, and no
second one within the cooldown; a day without labels is pending, not failed; the lifecycle
notifications say each of it once to a receiver on loopback; a monitoring section with a limit of
the wrong sign is refused at load."""

import datetime as dt

import dagster as dg
import polars as pl
import pytest

from ml_assets.definitions import build_definitions
from ml_assets.deploy.alerts.sensor import build_lifecycle_sensor
from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE
from ml_assets.promotion.assets import promotion_run_config
from ml_assets.records.read import latest
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.scoring.record import MonitorRecord, PredictionsRecord
from ml_assets.scoring.retrain import REASON_TAG, RETRAIN_TAG, latest_partition
from ml_assets.settings import load_settings
from ml_assets.spec import SpecError, load_spec
from ml_assets_tests.helpers import flights_files, small_training, write_spec
from ml_assets_tests.production.conftest import Webhook

pytestmark = pytest.mark.torchrun

NAME = "flights_delay"
TRAIN = dt.date(2013, 3, 14)
NORMAL, CONTRADICTED, UNLABELED = (TRAIN + dt.timedelta(days=i) for i in (1, 2, 3))
MONITORING = {"metrics": {"roc_auc": {"warn_below": 0.5, "block_below": 0.35}}, "min_labeled_rows": 100,
              "prediction_drift": {"warn_above": 0.5, "block_above": 1.0}}


def key(stage: str) -> dg.AssetKey:
    return dg.AssetKey([NAME, stage])


def monitored_spec(spec_dict: dict, root) -> dict:
    days = [TRAIN - dt.timedelta(days=back) for back in range(5, 0, -1)] + [TRAIN, NORMAL, CONTRADICTED, UNLABELED]
    data = small_training(spec_dict, window_days=3, epochs=1)
    data["source"] = flights_files(root, days)
    data["monitoring"] = MONITORING
    data["retrain"] = {"on": "both", "cooldown_hours": 24}
    # The two rewritten days are waived where a rewrite trips the snapshot's checks on purpose.
    data["validation"]["waivers"] = [
        {"day": CONTRADICTED.isoformat(), "checks": ["drift"], "reason": "labels rewritten by the test"},
        {"day": UNLABELED.isoformat(), "checks": ["nulls", "drift"], "reason": "labels removed by the test"}]
    return data


def test_the_monitor_judges_live_metrics_and_drift_and_waits_for_labels(home, tmp_path, spec_dict, monkeypatch):
    spec_path = write_spec(tmp_path / "models", monitored_spec(spec_dict, tmp_path / "files"))
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    settings = load_settings()
    defs = build_definitions(settings)
    instance = dg.DagsterInstance.get()
    daily, ingest = defs.resolve_job_def(f"{NAME}_daily"), defs.resolve_job_def(f"{NAME}_ingest")
    score = defs.resolve_job_def(f"{NAME}_score")
    for back in range(5, 0, -1):
        assert ingest.execute_in_process(partition_key=(TRAIN - dt.timedelta(days=back)).isoformat(),
                                         instance=instance).success
    assert daily.execute_in_process(partition_key=TRAIN.isoformat(), instance=instance).success
    hook = Webhook()
    monkeypatch.setenv(WEBHOOK_VARIABLE, hook.url)
    notify = Ticker(build_lifecycle_sensor(interval_seconds=30, webhook=dg.EnvVar(WEBHOOK_VARIABLE), models=[NAME]),
                    instance, {"links": DagsterLinksResource(base_url="http://dagster.internal:3000")})
    assert "started watching" in notify().skip_message
    promote = defs.resolve_job_def(f"{NAME}_promote")  # as the sensor and the CLI promote: through the job
    assert promote.execute_in_process(instance=instance, run_config=promotion_run_config(
        load_spec(spec_path), "promote", "1", "monitor it", "pytest")).success

    def monitor(day: dt.date) -> tuple[MonitorRecord, dict[str, dg.AssetCheckEvaluation]]:
        assert ingest.execute_in_process(partition_key=day.isoformat(), instance=instance).success
        result = score.execute_in_process(partition_key=day.isoformat(), instance=instance, raise_on_error=False)
        [event] = result.asset_materializations_for_node(f"{NAME}__model_monitor")
        checks = {e.event_specific_data.check_name: e.event_specific_data
                  for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
        return MonitorRecord.from_metadata(event.metadata), checks

    normal, checks = monitor(NORMAL)
    assert normal.status == "ok" and normal.model_version == "1" and normal.rows_labeled > 100
    lo, hi = normal.primary_interval
    assert lo < normal.metrics["roc_auc"] < hi and "psi" in normal.prediction_drift
    assert set(normal.feature_drift) >= {"distance", "carrier"} and all(c.passed for c in checks.values())

    # The day is scored; its labels then arrive and contradict the scores: the flights scored as
    # least likely to leave late are the ones that did.
    files = tmp_path / "files" / "flights"
    monitor(CONTRADICTED)
    scored = pl.read_parquet(latest(instance, key("predictions"), CONTRADICTED.isoformat(), PredictionsRecord).uri)
    rows = pl.read_parquet(files / f"{CONTRADICTED}.parquet")
    cut = scored["score"].median()
    late = scored.filter(pl.col("score") < cut).select("carrier", "flight", "sched_dep_time").with_columns(
        pl.lit(45).alias("late"))
    rows = (rows.join(late, on=["carrier", "flight", "sched_dep_time"], how="left")
            .with_columns(pl.when(pl.col("dep_delay").is_null()).then(None)
                          .otherwise(pl.col("late").fill_null(-5)).cast(pl.Int64).alias("dep_delay")).drop("late"))
    rows.write_parquet(files / f"{CONTRADICTED}.parquet")
    bad, checks = monitor(CONTRADICTED)
    assert bad.status == "blocked" and bad.metrics["roc_auc"] < 0.35
    [finding] = [f for f in bad.findings if f["kind"] == "metric"]
    assert finding["level"] == "blocked" and finding["text"].startswith("roc_auc 0.")
    live = checks["live_metrics"]
    assert not live.passed and live.severity == dg.AssetCheckSeverity.ERROR and "roc_auc" in live.description

    # Retraining on evidence: exactly one training of the latest partition, saying why.
    retrain = Ticker(defs.resolve_sensor_def(f"{NAME}_retrain_sensor"), instance, definitions=defs)
    [request] = retrain().run_requests
    assert request.partition_key == CONTRADICTED.isoformat() and request.tags[RETRAIN_TAG] == "degradation"
    assert request.tags[REASON_TAG].startswith(f"model_monitor {CONTRADICTED}, version 1: roc_auc 0.")
    launched = daily.execute_in_process(partition_key=request.partition_key, tags=request.tags, instance=instance,
                                        raise_on_error=False)  # its own gate may refuse the new model: that is fine
    assert "no new model_monitor results" in retrain().skip_message
    again, _ = monitor(CONTRADICTED)  # the same evidence once more, within the cooldown: nothing launched
    assert again.status == "blocked"
    cooled = retrain()
    assert cooled.run_requests == [] and f"run {launched.run_id} retrained" in cooled.skip_message
    assert len(instance.get_run_records(dg.RunsFilter(tags={RETRAIN_TAG: "degradation"}))) == 1

    # A day whose labels have not arrived: pending, with the reason; nothing fails.
    rows = pl.read_parquet(files / f"{UNLABELED}.parquet").with_columns(pl.lit(None, pl.Int64).alias("dep_delay"))
    rows.write_parquet(files / f"{UNLABELED}.parquet")
    waiting, checks = monitor(UNLABELED)
    assert waiting.status == "pending" and waiting.metrics == {}
    assert "0 labelled row(s)" in waiting.pending_reason and checks["live_metrics"].passed
    assert "pending:" in checks["live_metrics"].description
    assert "none past a blocking limit" in retrain().skip_message
    # A retraining now would train the newest day with labels, not the one still waiting for them.
    assert latest_partition(instance, load_spec(spec_path)) == CONTRADICTED.isoformat()

    # One message per event: the promotion, each blocked monitor result, the retraining.
    notify()
    kinds = [m["kind"] for m in hook.received]
    assert kinds == ["promotion", "monitor_blocked", "monitor_blocked", "retraining"], kinds
    blocked, retraining = hook.received[1], hook.received[-1]
    assert blocked["day"] == CONTRADICTED.isoformat() and "roc_auc" in blocked["text"]
    assert retraining["run_id"] == launched.run_id and retraining["reason"] == request.tags[REASON_TAG]
    assert "no new lifecycle events" in notify().skip_message
    hook.close()


class Ticker:
    """A sensor evaluated tick after tick, keeping its cursor as the daemon would."""

    def __init__(self, sensor, instance, resources=None, definitions=None) -> None:
        self.sensor, self.instance, self.resources, self.definitions = sensor, instance, resources, definitions
        self.cursor = None

    def __call__(self):
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursor, resources=self.resources,
                                          definitions=self.definitions)
        result = self.sensor.evaluate_tick(context)
        self.cursor = context.cursor
        return result


@pytest.mark.parametrize(("limits", "problem"), [
    ({"metrics": {"roc_auc": {"block_above": 0.9}}}, "roc_auc is higher-is-better, so its limits are warn_below"),
    ({"metrics": {"rmse": {"warn_above": 3}}}, "binary_classification has no metric 'rmse'"),
    ({"metrics": {"log_loss": {"warn_above": 0.7, "block_above": 0.6}}}, "the blocking level must be the worse one"),
    ({"feature_drift": {"block_above": -0.2}}, "greater than 0"),
])
def test_a_monitoring_section_that_cannot_work_is_refused_at_load(tmp_path, spec_dict, limits, problem):
    spec_dict["monitoring"] = limits
    path = write_spec(tmp_path, spec_dict)
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert str(path) in str(refused.value) and "monitoring" in str(refused.value) and problem in str(refused.value)


def test_retraining_on_evidence_without_a_blocking_limit_is_refused_at_load(tmp_path, spec_dict):
    spec_dict["monitoring"] = {"metrics": {"roc_auc": {"warn_below": 0.6}}}
    spec_dict["retrain"] = {"on": "on_degradation"}
    path = write_spec(tmp_path, spec_dict)
    with pytest.raises(SpecError, match="retrain.on: on_degradation retrains when model_monitor crosses a blocking"):
        load_spec(path)
