"""The study: storage, sampler, pruner, and the trials of one worker process.

Storage: SQLite under the local home for one worker; PostgreSQL (a URL from the environment) for
several workers on one machine or many pods. Both are Optuna's RDBStorage with a heartbeat: a
trial whose worker died stops beating, is failed when another trial starts, and is queued again
(``RetryHeartbeatStaleTrialCallback``) up to ``max_retries`` times.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from ml_assets import processes
from ml_assets.trainer import zygote
from ml_assets.tuning.record import COMPUTE_ATTR, TrialCompute
from ml_assets.tuning.space import BOOSTED, config_overrides, integer_dims, suggest

# The heartbeat and the retry of stale trials are marked experimental in Optuna 5; we rely on them.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class TrialFailed(Exception):
    """The trainer of a trial exited with an error: the trial is recorded as FAIL, the study goes on."""


@dataclass
class Job:
    """What every worker of one study needs, written as JSON by the hyperparameters asset."""

    model: str
    study_name: str
    storage_url: str
    base_config: dict[str, Any]
    space: dict[str, dict[str, Any]]
    trials: int
    max_epochs: int
    processes_per_trial: int
    workdir: str
    pruner: dict[str, Any]
    sampler_seed: int = 0
    startup_trials: int = 5
    heartbeat_seconds: int = 10
    max_retries: int = 2
    tracking_uri: str = ""
    experiment_id: str = ""
    parent_run_id: str = ""
    threads_per_process: int = 1
    env: dict[str, str] = field(default_factory=dict)
    run_id: str = ""
    """The Dagster run that started the workers: each trial's compute names it."""

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        return path

    @classmethod
    def read(cls, path: str | Path) -> Job:
        """From a path or an fsspec URL (trial-worker pods read it from object storage)."""
        if "://" in str(path):
            import fsspec

            with fsspec.open(str(path), "r") as fh:
                return cls(**json.loads(fh.read()))
        return cls(**json.loads(Path(path).read_text()))

    def storage_location(self) -> str:
        """The storage URL; ``env:NAME`` (what a job written to object storage holds instead of a
        URL with a password) is read from the worker's environment."""
        if not self.storage_url.startswith("env:"):
            return self.storage_url
        name = self.storage_url.removeprefix("env:")
        value = os.environ.get(name, "").strip()
        if not value:
            raise SystemExit(f"tuning worker: {name} is not set (the study's storage URL, from its Secret)")
        return value


def storage(url: str, heartbeat_seconds: int = 10, max_retries: int = 2) -> optuna.storages.RDBStorage:
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(
        url, engine_kwargs=engine, heartbeat_interval=heartbeat_seconds, grace_period=3 * heartbeat_seconds,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retries),
    )


def pruner(spec: dict[str, Any], max_epochs: int) -> optuna.pruners.BasePruner:
    kind = spec["kind"]
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec["min_resource"], max_resource=max_epochs,
                                              reduction_factor=spec["reduction_factor"])
    if kind == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=spec["min_resource"],
                                                      reduction_factor=spec["reduction_factor"])
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=spec["warmup_epochs"])
    return optuna.pruners.NopPruner()


def open_study(job: Job, *, create: bool = False) -> optuna.Study:
    sampler = optuna.samplers.TPESampler(seed=job.sampler_seed, n_startup_trials=job.startup_trials)
    store = storage(job.storage_location(), job.heartbeat_seconds, job.max_retries)
    return optuna.create_study(storage=store, study_name=job.study_name, direction="minimize", sampler=sampler,
                               pruner=pruner(job.pruner, job.max_epochs), load_if_exists=True) if create else \
        optuna.load_study(study_name=job.study_name, storage=store, sampler=sampler,
                          pruner=pruner(job.pruner, job.max_epochs))


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state; a FAIL that was queued again (its worker died) is counted as "retried"."""
    trials = study.get_trials(deepcopy=False)
    retried = {optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials} - {None}
    out = {"complete": 0, "pruned": 0, "failed": 0, "retried": 0, "running": 0, "waiting": 0}
    for t in trials:
        state = t.state
        if state == optuna.trial.TrialState.FAIL:
            out["retried" if t.number in retried else "failed"] += 1
        else:
            out[{"COMPLETE": "complete", "PRUNED": "pruned", "RUNNING": "running", "WAITING": "waiting"}[state.name]] += 1
    return out


def finished(study: optuna.Study, total: int) -> bool:
    c = counts(study)
    return c["complete"] + c["pruned"] + c["failed"] >= total and not c["waiting"]


def run_worker(job: Job) -> None:
    """Run trials until the study has ``job.trials`` finished ones (including other workers')."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(job)
    while not finished(study, job.trials):
        study.optimize(lambda trial: objective(job, trial), n_trials=1, catch=(TrialFailed,))


def _mlflow(job: Job):
    if not job.tracking_uri:
        return None
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=job.tracking_uri)


def objective(job: Job, trial: optuna.Trial) -> float:
    """Train with the trial's parameters, reporting each epoch's validation loss to the pruner (a
    boosted model's: every ``report_every`` rounds)."""
    family = str(job.base_config.get("family", ""))
    params, boosted = suggest(trial, job.space, integer_dims(family)), family == BOOSTED
    # Which worker ran it (the pod's name on Kubernetes): for reading a failed trial's logs.
    trial.set_user_attr("worker", f"{os.environ.get('HOSTNAME') or socket.gethostname()}:{os.getpid()}")
    out = Path(job.workdir) / f"trial-{trial.number:04d}"
    out.mkdir(parents=True, exist_ok=True)
    epochs_file = out / "epochs.jsonl"
    epochs_file.unlink(missing_ok=True)
    _write_config(job, params, out, epochs_file)
    client = _mlflow(job)
    run_id = None if client is None else _start_run(client, job, trial, params)
    log = open(out / "trainer.log", "wb")  # noqa: SIM115 - closed below
    started = time.monotonic()
    proc = _start_trainer(job, out, log)
    try:
        seen, best = _follow_epochs(trial, proc, epochs_file, client, run_id, boosted)
    except optuna.TrialPruned:
        _record_compute(trial, job, time.monotonic() - started, epochs_file)
        raise
    except BaseException:
        _stop(proc)
        raise
    finally:
        log.close()
    _record_compute(trial, job, time.monotonic() - started, epochs_file)
    if proc.returncode != 0 or seen == 0:
        tail = (out / "trainer.log").read_text(errors="replace")[-2000:]
        trial.set_user_attr("error", f"trainer exited with code {proc.returncode}: {tail[-500:]}")
        _finish(client, run_id, "FAILED", {"optuna_state": "FAIL"})
        raise TrialFailed(f"trial {trial.number}: the trainer exited with code {proc.returncode}; "
                          f"its log: {out / 'trainer.log'}")
    _finish(client, run_id, "FINISHED", {"optuna_state": "COMPLETE", **_spent_tags(trial, seen)},
            {"best_val_loss": best})
    return best


def _record_compute(trial: optuna.Trial, job: Job, wall_seconds: float, epochs_file: Path) -> None:
    """What the trial held, on the device its trainer's epochs name: a trainer that failed before its
    first epoch named none, and its seconds count as CPU."""
    text = epochs_file.read_text() if epochs_file.exists() else ""
    lines = text[:text.rfind("\n") + 1].splitlines()  # a line a kill cut short is not one
    device = str(json.loads(lines[-1]).get("device", "cpu")) if lines else "cpu"
    compute = TrialCompute.measured(job.run_id, device, job.processes_per_trial, wall_seconds)
    trial.set_user_attr(COMPUTE_ATTR, compute.as_attr())


def _write_config(job: Job, params: dict[str, Any], out: Path, epochs_file: Path) -> None:
    """The trial's trainer config: the study's base config with the trial's parameters, writing its
    epochs to ``epochs_file`` and its files under ``out``, with no early stopping (the pruner stops it)."""
    from ml_assets.trainer.config import TrainConfig

    base = {k: v for k, v in job.base_config.items()}
    base.update(config_overrides(params, list(base["hidden_sizes"]), base.get("model_params")))
    base.update(epochs=job.max_epochs, output_dir=str(out / "export"), checkpoint_dir=str(out / "checkpoints"),
                epoch_log=str(epochs_file), early_stopping_patience=0, checkpoint_every_seconds=0,
                checkpoint_every_steps=0, keep_last=1, report_every_steps=10_000)
    if base.get("family") == BOOSTED:
        base.update(_boosted_fields(base.get("model_params") or {}, job.max_epochs))
    config = TrainConfig.from_dict(base)
    (out / "train_config.json").write_text(config.to_json())


def _boosted_fields(model_params: dict[str, Any], max_epochs: int) -> dict[str, Any]:
    """A boosted trial's fields: its XGBoost params with whole numbers where XGBoost wants them (a
    value Optuna drew as a float, e.g. from ``choices``), trained for all its rounds (the spec's
    ``num_boost_round``, or the trial's when it is tuned), and reported to the pruner ``max_epochs``
    times: for a boosted model ``tuning.max_epochs`` counts pruning reports, the resource hyperband
    and the median pruner's warmup are measured in. ``epochs`` means nothing to the boosting trainer."""
    from ml_assets.trainer import boosting

    params = {k: (round(v) if k in boosting.INTEGER and isinstance(v, float) else v)
              for k, v in model_params.items()}
    return {"model_params": params, "report_every_steps": report_every(boosting.rounds(params), max_epochs)}


def report_every(rounds: int, max_epochs: int) -> int:
    """Rounds between a boosted trial's reports, so that its ``rounds`` make at most ``max_epochs``
    reports, the last one at its last round (the trainer reports every ``report_every`` rounds and at
    the last): rounded up, as rounded down a 200-round trial with max_epochs 9 would report 10 times,
    once past the resource hyperband stops at. Fewer rounds than max_epochs: every round."""
    return max(1, -(-rounds // max_epochs))


def _start_run(client, job: Job, trial: optuna.Trial, params: dict[str, Any]) -> str:
    """The trial's MLflow run, a child of the study's, with the trial's parameters; its id."""
    run = client.create_run(job.experiment_id, run_name=f"trial-{trial.number}", tags={
        "mlflow.parentRunId": job.parent_run_id, "optuna_study": job.study_name,
        "optuna_trial": str(trial.number), "ml_assets/stage": "tuning"})
    run_id = run.info.run_id
    from mlflow.entities import Param

    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in sorted(params.items())])
    trial.set_user_attr("mlflow_run_id", run_id)
    return run_id


def _start_trainer(job: Job, out: Path, log) -> subprocess.Popen:
    """torchrun of the trial's config, its output to ``log``."""
    threads = str(job.threads_per_process)
    socket_path = zygote.address()  # this worker's trials fork their ranks from one zygote
    command = [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone",
               f"--nproc_per_node={job.processes_per_trial}", "--max-restarts=0",
               "-m", "ml_assets.trainer.forked" if socket_path else "ml_assets.trainer",
               "--config", str(out / "train_config.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, **job.env)
    if socket_path:
        env[zygote.SOCKET_ENV] = socket_path
    env = processes.child_env(env)  # the trial's torchrun ends if this worker dies
    # Its own session: pruning or a stopped worker kills torchrun and its ranks together.
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _follow_epochs(trial: optuna.Trial, proc: subprocess.Popen, epochs_file: Path, client,
                   run_id: str | None, boosted: bool = False) -> tuple[int, float]:
    """Each epoch the trainer writes (a boosted model's: each report of its rounds), reported to the
    pruner (and MLflow) until the trainer exits: the reports seen and the best validation loss.
    Raises TrialPruned after stopping the trainer."""
    seen, best = 0, float("inf")
    while True:
        lines = epochs_file.read_text().splitlines() if epochs_file.exists() else []
        for line in lines[seen:]:
            entry = json.loads(line)
            value = float(entry["val_loss"])
            best = min(best, value)
            seen += 1
            # The pruner sees the trial's value as it would be if it stopped now (its best
            # epoch so far), the same measure it is finally ranked by: a trial whose loss
            # rises after a good epoch is not judged by its worse epoch. Its step is the report's
            # number, the unit of tuning.max_epochs (a network's epoch; a boosted model's
            # report_every rounds), so hyperband's resource is the same for both.
            trial.report(best, seen)
            if client is not None:  # MLflow's steps: the network's epochs, the booster's rounds
                client.log_metric(run_id, "val_loss", value, step=int(entry["epoch"]))
                client.log_metric(run_id, "train_loss", float(entry["train_loss"]), step=int(entry["epoch"]))
            trial.set_user_attr("epochs", seen)
            if boosted:
                trial.set_user_attr("rounds", int(entry["step"]))
            if trial.should_prune():
                _stop(proc)
                _finish(client, run_id, "KILLED", {"optuna_state": "PRUNED", **_spent_tags(trial, seen)})
                where = f"report {seen} (round {entry['step']})" if boosted else f"epoch {seen}"
                raise optuna.TrialPruned(f"pruned after {where} (val_loss {value:.4f})")
        if proc.poll() is not None and len(lines) == seen:
            return seen, best
        time.sleep(0.2)


def _spent_tags(trial: optuna.Trial, seen: int) -> dict[str, str]:
    """What a trial's MLflow run is tagged with as spent: its epochs (reports), and a boosted
    trial's rounds."""
    rounds = trial.user_attrs.get("rounds")
    return {"epochs": str(seen), **({"rounds": str(rounds)} if rounds is not None else {})}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _finish(client, run_id, status: str, tags: dict[str, str], metrics: dict[str, float] | None = None) -> None:
    if client is None or run_id is None:
        return
    for k, v in tags.items():
        client.set_tag(run_id, k, v)
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, v)
    client.set_terminated(run_id, status)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="one worker of a tuning study")
    parser.add_argument("job", help="the study's job.json (a path or an fsspec URL), written by the hyperparameters asset")
    args = parser.parse_args(argv)
    # A worker whose step died (killed with its run worker) ends too, and with it its trial's trainer.
    processes.follow_parent(grace_seconds=10)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stops the running trial's trainer (finally)
    run_worker(Job.read(args.job))


if __name__ == "__main__":
    main()
