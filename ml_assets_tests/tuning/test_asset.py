"""The hyperparameters asset through Dagster: a study on the newest window of features, tracked in
MLflow (one nested run per trial), whose best parameters the next training takes and records."""

import datetime as dt

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.definitions import build_definitions
from ml_assets.settings import load_settings
from ml_assets_tests.helpers import small_training, write_spec

pytestmark = pytest.mark.torchrun

INGEST = ("raw_data", "validated_snapshot", "features")


def test_best_parameters_flow_into_the_next_training_and_its_lineage(home, tmp_path, spec_dict, monkeypatch):
    data = small_training(spec_dict, window_days=3, epochs=1)
    data["tuning"] = {"trials": 3, "max_epochs": 2, "startup_trials": 1,
                      "space": {"learning_rate": {"low": 0.001, "high": 0.03, "log": True},
                                "width": {"low": 8, "high": 32}, "depth": {"low": 1, "high": 2}}}
    write_spec(tmp_path / "models", data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    defs = build_definitions(load_settings())
    instance = dg.DagsterInstance.get()
    daily = defs.resolve_job_def("flights_delay_daily")
    day = dt.date(2013, 4, 10)
    key = lambda stage: dg.AssetKey(["flights_delay", stage])  # noqa: E731

    tune = defs.resolve_job_def("flights_delay_tune")
    early = tune.execute_in_process(instance=instance, raise_on_error=False)
    assert not early.success  # no features yet: a clear refusal, not an empty study
    [failure] = [e for e in early.all_events if e.is_step_failure]
    assert "tuning needs 3 consecutive days of features" in failure.step_failure_data.error.message

    for back in (3, 2, 1):
        result = daily.execute_in_process(partition_key=(day - dt.timedelta(days=back)).isoformat(),
                                          instance=instance, asset_selection=[key(s) for s in INGEST])
        assert result.success
    result = tune.execute_in_process(instance=instance)
    assert result.success
    [tuned] = result.asset_materializations_for_node("flights_delay__hyperparameters")
    meta = {k: v.value for k, v in tuned.metadata.items()}
    assert meta["trials_completed"] + meta["trials_pruned"] + meta["trials_failed"] == 3
    assert meta["window"] == {"train": ["2013-04-07", "2013-04-08"], "validation": ["2013-04-09"]}
    assert set(meta["best_params"]) == {"learning_rate", "width", "depth"} and "plot_optimization_history" in meta

    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    parent = meta["mlflow_run_url"].rsplit("/", 1)[-1]
    trials = client.search_runs([client.get_run(parent).info.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert len(trials) == 3 and all(r.data.params.get("learning_rate") for r in trials)
    assert {r.data.tags["optuna_state"] for r in trials} <= {"COMPLETE", "PRUNED"}
    assert client.get_run(parent).data.metrics["best_val_loss"] == meta["best_value"]

    # Materializing again continues the same study: it is complete, so no trial is added.
    again = tune.execute_in_process(instance=instance)
    [second] = again.asset_materializations_for_node("flights_delay__hyperparameters")
    assert second.metadata["study_name"].value == meta["study_name"]
    assert len(second.metadata["trials"].value) == 3

    train = daily.execute_in_process(partition_key=day.isoformat(), instance=instance,
                                     asset_selection=[key("trained_checkpoint")])
    assert train.success
    [ckpt] = train.asset_materializations_for_node("flights_delay__trained_checkpoint")
    used = ckpt.metadata["hyperparameters"].value
    best = meta["best_params"]
    assert used["params"] == best and used["study_name"] == meta["study_name"]
    config = ckpt.metadata["training_config"].value
    assert config["learning_rate"] == best["learning_rate"]
    assert config["hidden_sizes"] == [best["width"]] * best["depth"]

    # The partition whose test day the study validated on does not take its parameters: they were
    # chosen on that day's rows.
    earlier = day - dt.timedelta(days=1)
    assert daily.execute_in_process(partition_key=(day - dt.timedelta(days=4)).isoformat(), instance=instance,
                                    asset_selection=[key(s) for s in INGEST]).success
    again = daily.execute_in_process(partition_key=earlier.isoformat(), instance=instance,
                                     asset_selection=[key("trained_checkpoint")])
    [ckpt] = again.asset_materializations_for_node("flights_delay__trained_checkpoint")
    assert ckpt.metadata["hyperparameters"].value == {"source": "the spec's training section"}
    assert any(f"it validated on days up to {earlier}" in e.user_message for e in instance.all_logs(again.run_id))
