import datetime as dt
import hashlib
import json
from pathlib import Path

import dagster as dg

from ml_assets.defs.automation.schedules import TRAINING_TEAM_TAG, job_tags
from ml_assets.defs.common import GPU_POOL, asset_key, code_version, dagster_run_url
from ml_assets.defs.training.assets import train_config
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource, TuningResource
from ml_assets.spec import ModelSpec
from ml_assets.trainer.config import DataRef


def latest_window(instance: dg.DagsterInstance, spec: ModelSpec, key: dg.AssetKey) -> tuple[list[str], list[str]]:
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


def build_hyperparameters(spec: ModelSpec) -> dg.AssetsDefinition:
    features_key = asset_key(spec, "features")
    tuning = spec.tuning
    version = code_version(spec, ("tuning", "training", "features", "target"), "ml_assets.tuning.study",
                           "ml_assets.tuning.space")

    @dg.asset(
        key=asset_key(spec, "hyperparameters"),
        deps=[features_key],
        group_name=f"{spec.name}_tuning",
        kinds={"optuna", "mlflow"},
        code_version=version,
        tags={"ml_assets/stage": "tuning"},
        pool=GPU_POOL,
        description=(f"An Optuna study of {spec.name} ({tuning.trials} trials, TPE, {tuning.pruner.kind} pruning) "
                     "on the newest window of features; its best parameters become the training defaults."),
    )
    def hyperparameters(
        context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource, tracking: MlflowTrackingResource,
        tuning_store: TuningResource,
    ) -> dg.MaterializeResult:
        import optuna

        from ml_assets.defs.common import upstream_metadata
        from ml_assets.features import state as feature_state
        from ml_assets.trainer.data import read_frame
        from ml_assets.tuning import study as st

        if tuning.workers > 1 and tuning_store.is_sqlite():
            raise dg.Failure(description=(
                f"model {spec.name}: tuning.workers is {tuning.workers}, but the study storage is SQLite, which "
                "serves one worker: set ML_ASSETS_OPTUNA_STORAGE to a PostgreSQL URL "
                "(postgresql+psycopg://user@host/db) or use workers: 1"), allow_retries=False)
        train_days, val_days = latest_window(context.instance, spec, features_key)
        val_day = val_days[-1]  # names the study: the newest day it saw
        records = {d: upstream_metadata(context, features_key, d) for d in [*train_days, *val_days]}
        refs = {d: DataRef(uri=str(m["uri"]), sha256=m["sha256"], day=d, commit=m["data_commit"])
                for d, m in records.items()}
        train_refs = [refs[d] for d in train_days]
        try:
            state = feature_state.fit_state(read_frame(train_refs), spec.features, spec.target.name, spec.target.task)
        except ValueError as exc:
            raise dg.Failure(description=f"model {spec.name}: {exc}", allow_retries=False) from None
        state_ref = artifacts.put(f"{spec.name}/feature_state/tuning-{val_day}", feature_state.state_bytes(state), ".json")
        base = train_config(spec, train_refs, [refs[d] for d in val_days], state_ref.as_data_ref(), "unused")
        space = {k: v.model_dump(mode="json") for k, v in tuning.space.items()}
        # Same space, pruner, sampler, data and base config: the same study, continued.
        key = json.dumps({"space": space, "pruner": tuning.pruner.model_dump(mode="json"),
                          "seed": tuning.sampler_seed, "max_epochs": tuning.max_epochs,
                          "config": base.fingerprint()}, sort_keys=True)
        name = f"{spec.name}-{val_day}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
        workdir = Path(tuning_store.workdir) / name
        workdir.mkdir(parents=True, exist_ok=True)
        client = tracking.client()
        experiment_id = tracking.experiment_id(spec.name)
        from ml_assets.registry import keyed_run

        parent = keyed_run(client, experiment_id, "tuning_study", name, f"tuning {name}", {
            "ml_assets/stage": "tuning", "dagster_run_id": context.run_id,
            "dagster_run_url": dagster_run_url(context.run_id)})
        job = st.Job(
            model=spec.name, study_name=name, storage_url=tuning_store.storage_url,
            base_config=json.loads(base.to_json()), space=space, trials=tuning.trials, max_epochs=tuning.max_epochs,
            processes_per_trial=tuning.processes_per_trial, workdir=str(workdir),
            pruner=tuning.pruner.model_dump(mode="json"), sampler_seed=tuning.sampler_seed,
            startup_trials=tuning.startup_trials, heartbeat_seconds=tuning.heartbeat_seconds,
            max_retries=tuning.max_retries, tracking_uri=tracking.tracking_uri, experiment_id=experiment_id,
            parent_run_id=parent, threads_per_process=tuning_store.threads_per_process)
        study = st.open_study(job, create=True)
        study.set_user_attr("window", {"train": train_days, "validation": val_days})
        before = st.counts(study)
        context.log.info(f"hyperparameters: study {name} ({before}); {tuning.workers} worker(s) until "
                         f"{tuning.trials} trials are finished; train {train_days[0]}..{train_days[-1]}, "
                         f"validate {val_days[0]}..{val_day}")
        codes = tuning_store.run_workers(context, spec, job, tuning.workers)
        study = st.open_study(job)
        after = st.counts(study)
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            raise dg.Failure(description=(f"model {spec.name}: study {name} has no completed trial ({after}); "
                                          f"worker exit codes {codes}; trial logs under {workdir}"),
                             allow_retries=False)
        best = study.best_trial
        epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in study.get_trials(deepcopy=False))
        plots, importances = _plots(study, workdir / "plots")
        client.log_artifacts(parent, str(workdir / "plots"), "tuning")
        for k, v in {"best_val_loss": best.value, **{f"trials_{k}": float(v) for k, v in after.items()}}.items():
            client.log_metric(parent, k, float(v))
        for k, v in best.params.items():
            client.set_tag(parent, f"best.{k}", str(v))
        context.log.info(f"hyperparameters: best val_loss {best.value:.4f} (trial {best.number}) {best.params}; "
                         f"{after}")
        history = [{"trial": t.number, "state": t.state.name, "value": t.value, "epochs": t.user_attrs.get("epochs"),
                    "params": t.params} for t in study.get_trials(deepcopy=False)]
        return dg.MaterializeResult(metadata={
            "study_name": name, "storage": tuning_store.storage_url.split("@")[-1],  # no credentials
            "best_value": float(best.value), "best_trial": best.number,
            "best_params": dg.MetadataValue.json(best.params),
            "trials_completed": after["complete"], "trials_pruned": after["pruned"],
            "trials_failed": after["failed"], "trials_retried": after["retried"],
            "epochs_spent": epochs, "window": dg.MetadataValue.json({"train": train_days, "validation": val_days}),
            "param_importances": dg.MetadataValue.json(importances),
            "trials": dg.MetadataValue.json(history),
            "mlflow_run_url": dg.MetadataValue.url(tracking.run_url(experiment_id, parent)),
            **{f"plot_{Path(p).stem}": dg.MetadataValue.url(tracking.artifact_url(parent, f"tuning/{p}"))
               for p in plots},
            "summary": dg.MetadataValue.md(
                f"**best val_loss {best.value:.4f}** (trial {best.number} of {len(history)}): `{best.params}`\n\n"
                f"completed {after['complete']}, pruned {after['pruned']}, failed {after['failed']}, "
                f"re-run after a dead worker {after['retried']}; {epochs} epochs spent.\n\n"
                + "\n".join(f"![{p}]({tracking.artifact_url(parent, f'tuning/{p}')})" for p in plots)),
        })

    return hyperparameters


def _plots(study, out: Path) -> tuple[list[str], dict[str, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as ovm

    out.mkdir(parents=True, exist_ok=True)
    names = []
    ax = ovm.plot_optimization_history(study)
    ax.figure.savefig(out / "optimization_history.png", dpi=100, bbox_inches="tight")
    names.append("optimization_history.png")
    importances: dict[str, float] = {}
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) >= 2 and len(study.best_trial.params) >= 1:
        try:
            importances = {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
            ax = ovm.plot_param_importances(study)
            ax.figure.savefig(out / "param_importances.png", dpi=100, bbox_inches="tight")
            names.append("param_importances.png")
        except (RuntimeError, ValueError):  # e.g. every completed trial has the same value
            pass
    import matplotlib.pyplot as plt

    plt.close("all")
    return names, importances


def build_tuning_job(spec: ModelSpec, asset: dg.AssetsDefinition) -> dg.JobDefinition:
    return dg.define_asset_job(name=f"{spec.name}_tune", selection=dg.AssetSelection.assets(asset),
                               description=f"Run (or continue) {spec.name}'s hyperparameter study.",
                               tags={**job_tags(spec, trains=False), TRAINING_TEAM_TAG: spec.owner})


def build_tuning_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    # Weekly, Sunday 03:00; stopped by default: tuning costs many trainings.
    return dg.ScheduleDefinition(job=job, cron_schedule="0 3 * * 0", default_status=dg.DefaultScheduleStatus.STOPPED)


__all__ = ["build_hyperparameters", "build_tuning_job", "build_tuning_schedule", "latest_window"]
