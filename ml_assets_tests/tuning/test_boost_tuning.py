"""A tuning study of a boosted model (family xgboost) with the real trainer (torchrun) on toy data:
its trials report to the pruner every few rounds (tuning.max_epochs reports per trial), hyperband
prunes by those reports, the trials train on the tuned XGBoost params (whole numbers where XGBoost
wants them), and the study's best params become the next training's model_params."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from ml_assets.resources import MlflowTrackingResource
from ml_assets.spec import TuningSpec, parse_spec
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.training.trainer_config import train_config
from ml_assets.tuning import study as st
from ml_assets.tuning.search import study_record
from ml_assets.tuning.space import config_overrides, integer_dims, suggest
from ml_assets_tests.helpers import spec_data, whole
from ml_assets_tests.trainer.toy import toy_data

pytestmark = pytest.mark.torchrun

MAX_EPOCHS = 4
"""Pruning reports of a trial that is never pruned."""
SPACE = {
    # No ``integer: true``: a boosted model's integer params are drawn as ints all the same.
    "params.max_depth": {"low": 1, "high": 6},
    "params.num_boost_round": {"low": 12, "high": 30, "step": 6},
    # From a rate too small to learn in 30 rounds to a good one: the pruner has something to stop.
    "params.learning_rate": {"low": 0.002, "high": 0.5, "log": True},
}
BOOST = {"family": "xgboost", "threads": 1, "model_params": {"max_bin": 32, "min_child_weight": 1.0}}


def tracking(tmp_path: Path) -> MlflowTrackingResource:
    return MlflowTrackingResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                  artifact_root=str(tmp_path / "mlartifacts"))


def boosted_job(tmp_path: Path, **tuning: object) -> st.Job:
    data = toy_data(tmp_path / "data", train_rows=1200, val_rows=301)
    base = json.loads(TrainConfig(**data, output_dir="unused", **BOOST).to_json())
    spec = TuningSpec(space=SPACE, max_epochs=MAX_EPOCHS, **tuning)
    mlflow = tracking(tmp_path)
    experiment = mlflow.experiment_id("toy")
    parent = mlflow.client().create_run(experiment, run_name="study").info.run_id
    # A fixed name: hyperband's bracket of each trial is a hash of it, so the study is repeatable.
    return st.Job(model="toy", study_name="toy-boost", storage_url=f"sqlite:///{tmp_path / 'optuna.db'}",
                  base_config=base, space={k: v.model_dump(mode="json") for k, v in spec.space.items()},
                  trials=spec.trials, max_epochs=spec.max_epochs, processes_per_trial=1,
                  workdir=str(tmp_path / "work"), pruner=spec.pruner.model_dump(mode="json"), sampler_seed=0,
                  startup_trials=spec.startup_trials, heartbeat_seconds=spec.heartbeat_seconds,
                  max_retries=spec.max_retries, run_id="the-run", tracking_uri=mlflow.tracking_uri,
                  experiment_id=experiment, parent_run_id=parent)


def test_boosted_integer_params_are_drawn_and_applied_as_ints() -> None:
    dims = {k: v.model_dump(mode="json") for k, v in TuningSpec(space=SPACE).space.items()}
    trial = optuna.trial.FixedTrial({"params.max_depth": 4, "params.num_boost_round": 18,
                                     "params.learning_rate": 0.1})
    params = suggest(trial, dims, integer_dims("xgboost"))
    assert params == {"params.max_depth": 4, "params.num_boost_round": 18, "params.learning_rate": 0.1}
    assert {"params.max_depth", "params.max_bin", "params.num_boost_round"} <= integer_dims("xgboost")
    assert not integer_dims("mlp")  # a factory's params are its own: drawn as the spec says
    # The spec's other params stay; the tuned ones replace theirs.
    fields = config_overrides(params, [64], {"max_depth": 8, "subsample": 0.8})
    assert fields == {"model_params": {"max_depth": 4, "subsample": 0.8, "num_boost_round": 18,
                                       "learning_rate": 0.1}}
    assert st.report_every(200, 9) == 23 and st.report_every(18, 4) == 5 and st.report_every(3, 4) == 1


def test_a_boosted_study_prunes_by_rounds_and_its_best_params_reach_training(tmp_path: Path) -> None:
    j = boosted_job(tmp_path, trials=4, startup_trials=2,
                    pruner={"kind": "hyperband", "min_resource": 1, "reduction_factor": 2})
    st.open_study(j, create=True)
    st.run_worker(j)
    study = st.open_study(j)
    counts = st.counts(study)
    assert counts["complete"] >= 1 and counts["complete"] + counts["pruned"] == 4, counts
    assert counts["pruned"] >= 1  # the worse trials of a bracket stop at a rung (a fixed, repeatable study)
    client = tracking(tmp_path).client()
    for t in study.get_trials():
        _check_trial(Path(j.workdir) / f"trial-{t.number:04d}", t)
        # MLflow's steps are the booster's rounds; its run says how many it trained.
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["rounds"] == str(t.user_attrs["rounds"])
        history = client.get_metric_history(run.info.run_id, "val_loss")
        assert [m.step for m in history][-1] == t.user_attrs["rounds"]
    record = study_record(j, study, {"train": ["d1"], "validation": ["d2"]}, tracking(tmp_path))
    assert record.rounds_spent == sum(t.user_attrs["rounds"] for t in study.get_trials())
    assert record.epochs_spent == sum(len(t.intermediate_values) for t in study.get_trials())
    assert f"{record.rounds_spent} boosting rounds" in record.summary
    assert record.best_params == study.best_params and all("rounds" in entry for entry in record.trials)
    best = study.best_trial
    assert best.state.name == "COMPLETE" and isinstance(best.params["params.max_depth"], int)
    _check_training_applies(tmp_path, j, best.params)


def _check_trial(out: Path, t: optuna.trial.FrozenTrial) -> None:
    """The trial trained on its own params as XGBoost's, all its rounds, reported MAX_EPOCHS times."""
    config = json.loads((out / "train_config.json").read_text())
    params = config["model_params"]
    rounds = t.params["params.num_boost_round"]
    assert params["max_depth"] == t.params["params.max_depth"] and type(params["max_depth"]) is int
    assert params["num_boost_round"] == rounds and type(rounds) is int
    assert params["learning_rate"] == t.params["params.learning_rate"] and params["max_bin"] == 32
    every = -(-rounds // MAX_EPOCHS)
    assert config["report_every_steps"] == every and config["early_stopping_patience"] == 0
    logged = [json.loads(line) for line in (out / "epochs.jsonl").read_text().splitlines()]
    expected = [r for r in range(every, rounds + 1, every)] + ([rounds] if rounds % every else [])
    # The pruner's steps are the reports' numbers (hyperband's resource); the trainer's are rounds.
    steps = sorted(t.intermediate_values)
    assert steps == list(range(1, len(steps) + 1)) and t.user_attrs["epochs"] == len(steps)
    assert [e["step"] for e in logged[:len(steps)]] == expected[:len(steps)]
    assert t.user_attrs["rounds"] == expected[len(steps) - 1]
    seen = [t.intermediate_values[s] for s in steps]
    losses = [e["val_loss"] for e in logged]
    assert seen == pytest.approx([min(losses[:i + 1]) for i in range(len(seen))])
    if t.state.name == "COMPLETE":
        assert len(steps) == len(expected) <= MAX_EPOCHS and t.value == pytest.approx(min(losses))
        assert json.loads((out / "export" / "meta.json").read_text())["rounds"] == rounds
    else:
        # Hyperband's last rung is the last report: a trial may be pruned there too.
        assert t.state.name == "PRUNED" and len(steps) <= len(expected)


def _check_training_applies(tmp_path: Path, j: st.Job, best: dict) -> None:
    """The best params of the study, as training applies them (ml_assets.training.tuned's params go
    through train_config), become the boosted model's model_params over the spec's."""
    data = spec_data(model=whole({"family": "xgboost", "params": {"max_depth": 9, "num_boost_round": 50,
                                                                  "max_bin": 32}}))
    data["training"].pop("warm_start", None)
    data["tuning"] = {"space": SPACE, "max_epochs": MAX_EPOCHS}
    spec = parse_spec(yaml.safe_dump(data), tmp_path / "flights_delay.yaml")
    ref = DataRef(**j.base_config["train_files"][0])
    cfg = train_config(spec, [ref], [ref], DataRef(**j.base_config["feature_state"]), "unused",
                       json.loads(json.dumps(best)))  # as a record's metadata holds them
    assert cfg.model_params == {"max_depth": best["params.max_depth"], "max_bin": 32,
                                "num_boost_round": best["params.num_boost_round"],
                                "learning_rate": best["params.learning_rate"]}
    assert cfg.family == "xgboost" and type(cfg.model_params["max_depth"]) is int
