"""A tuning study of one model on its newest window of features: the window, the study (named by
what decides its trials, so the same study continues), the workers, and the record of its outcome."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import dagster as dg

from ml_assets.layout import MLFLOW_TUNING
from ml_assets.resources import MlflowTrackingResource
from ml_assets.step import Step
from ml_assets.training.preflight import check_model
from ml_assets.training.prepare import Prepared
from ml_assets.training.trainer_config import train_config
from ml_assets.tuning.record import COMPUTE_ATTR, SpentTrial, TrialCompute, TunedRecord, run_totals
from ml_assets.tuning.resource import TuningResource
from ml_assets.tuning.space import BOOSTED


def latest_window(instance: dg.DagsterInstance, spec, key: dg.AssetKey) -> tuple[list[str], list[str]]:
    """The newest run of ``width`` consecutive days with features: (training days, validation days),
    the last ``training.validation_days`` validating."""
    width = spec.tuning.window_days or spec.training.window_days
    val = min(spec.training.validation_days, width - 1)
    have = sorted(instance.get_materialized_partitions(key), reverse=True)
    days = {dt.date.fromisoformat(d) for d in have}
    for last in sorted(days, reverse=True):
        run = [last - dt.timedelta(days=i) for i in range(width)]
        if all(d in days for d in run):
            ordered = [d.isoformat() for d in reversed(run)]
            return ordered[:-val], ordered[-val:]
    raise dg.Failure(description=(
        f"model {spec.name}: tuning needs {width} consecutive days of features; materialized: "
        f"{len(days)} day(s){' up to ' + max(have) if have else ''}. Materialize features for more days first."),
        allow_retries=False)


def study_job(step: Step, prepared: Prepared, val_day: str, tracking: MlflowTrackingResource,
              store: TuningResource):
    """The study's job description, its MLflow parent run created once (re-runs continue it)."""
    from ml_assets.registry.versions import keyed_run
    from ml_assets.tuning import study as st

    spec, tuning = step.spec, step.spec.tuning
    try:
        base = train_config(spec, prepared.train, prepared.val, prepared.state.as_data_ref(), "unused",
                            data_mode=prepared.data.mode)
        check_model(base)
    except ValueError as exc:
        raise step.failure(exc) from None
    space = {k: v.model_dump(mode="json") for k, v in tuning.space.items()}
    # Same space, pruner, sampler, data and base config: the same study, continued.
    key = json.dumps({"space": space, "pruner": tuning.pruner.model_dump(mode="json"),
                      "seed": tuning.sampler_seed, "max_epochs": tuning.max_epochs,
                      "config": base.fingerprint()}, sort_keys=True)
    name = f"{spec.name}-{val_day}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    workdir = Path(store.workdir) / name
    workdir.mkdir(parents=True, exist_ok=True)
    experiment_id = tracking.experiment_id(spec.name)
    parent = keyed_run(tracking.client(), experiment_id, "tuning_study", name, f"tuning {name}", {
        "ml_assets/stage": "tuning", "dagster_run_id": step.run_id, "dagster_run_url": step.run_url})
    return st.Job(
        model=spec.name, study_name=name, storage_url=store.storage_url,
        base_config=json.loads(base.to_json()), space=space, trials=tuning.trials, max_epochs=tuning.max_epochs,
        processes_per_trial=tuning.processes_per_trial, workdir=str(workdir),
        pruner=tuning.pruner.model_dump(mode="json"), sampler_seed=tuning.sampler_seed,
        startup_trials=tuning.startup_trials, heartbeat_seconds=tuning.heartbeat_seconds,
        max_retries=tuning.max_retries, tracking_uri=tracking.tracking_uri, experiment_id=experiment_id,
        parent_run_id=parent, threads_per_process=store.threads_per_process, run_id=step.run_id)


def study_record(job, study, window: dict[str, list[str]], tracking: MlflowTrackingResource) -> TunedRecord:
    """Log the finished study's plots and figures to its MLflow run; its record."""
    from ml_assets.tuning import study as st

    best, after = study.best_trial, st.counts(study)
    trials = study.get_trials(deepcopy=False)
    epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in trials)
    # A boosted model's "epochs" are its pruning reports; what it trained is counted in rounds.
    boosted = job.base_config.get("family") == BOOSTED
    rounds = sum(int(t.user_attrs.get("rounds", 0)) for t in trials) if boosted else None
    workdir, client, parent = Path(job.workdir), tracking.client(), job.parent_run_id
    plots, importances = _plots(study, workdir / "plots")
    client.log_artifacts(parent, str(workdir / "plots"), MLFLOW_TUNING)
    for k, v in {"best_val_loss": best.value, **{f"trials_{k}": float(v) for k, v in after.items()}}.items():
        client.log_metric(parent, k, float(v))
    for k, v in best.params.items():
        client.set_tag(parent, f"best.{k}", str(v))
    spent = [spent_trial(t) for t in trials]
    history = [{"trial": t.number, "state": t.state.name, "value": t.value, "epochs": t.user_attrs.get("epochs"),
                **({"rounds": t.user_attrs.get("rounds")} if boosted else {}), "params": t.params, **s.as_entry()}
               for t, s in zip(trials, spent, strict=True)]
    urls = {p: tracking.artifact_url(parent, f"{MLFLOW_TUNING}/{p}") for p in plots}
    trained = f"{rounds} boosting rounds ({epochs} pruning reports)" if boosted else f"{epochs} epochs"
    return TunedRecord(
        study_name=job.study_name, storage=job.storage_url.split("@")[-1],  # no credentials
        best_value=float(best.value), best_trial=best.number, best_params=best.params,
        trials_completed=after["complete"], trials_pruned=after["pruned"], trials_failed=after["failed"],
        trials_retried=after["retried"], epochs_spent=epochs, rounds_spent=rounds, window=window,
        param_importances=importances, trials=history, mlflow_run_url=tracking.run_url(job.experiment_id, parent),
        plots=urls, summary=(f"**best val_loss {best.value:.4f}** (trial {best.number} of {len(history)}): "
                             f"`{best.params}`\n\ncompleted {after['complete']}, pruned {after['pruned']}, failed "
                             f"{after['failed']}, re-run after a dead worker {after['retried']}; {trained} spent.\n\n"
                             + "\n".join(f"![{p}]({url})" for p, url in urls.items())),
        **run_totals(spent, job.run_id))


def spent_trial(trial) -> SpentTrial:
    """An Optuna trial as its record lists it. One without a worker's measure finished at Optuna's
    datetime_complete: a naive local time, read as this machine's."""
    measured = trial.user_attrs.get(COMPUTE_ATTR)
    compute = TrialCompute(**measured) if measured else None
    done = trial.datetime_complete
    finished = (compute.finished if compute else
                done.astimezone(dt.UTC).isoformat(timespec="seconds") if done else None)
    return SpentTrial(number=trial.number, state=trial.state.name, finished=finished, compute=compute)


def _plots(study, out: Path) -> tuple[list[str], dict[str, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    out.mkdir(parents=True, exist_ok=True)
    ax = ovm.plot_optimization_history(study)
    ax.figure.savefig(out / "optimization_history.png", dpi=100, bbox_inches="tight")
    names, importances = ["optimization_history.png"], {}
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) >= 2 and len(study.best_trial.params) >= 1:
        try:
            importances = {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
            ax = ovm.plot_param_importances(study)
            ax.figure.savefig(out / "param_importances.png", dpi=100, bbox_inches="tight")
            names.append("param_importances.png")
        except (RuntimeError, ValueError):  # e.g. every completed trial has the same value
            pass
    plt.close("all")
    return names, importances
