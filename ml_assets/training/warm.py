"""A partition's training planned against the registry (``training.warm_start``): a skip when a
registered version holds the result of the same inputs, else the decision of
ml_assets.training.decision, and the window, feature state, starting weights and config it trains
with. A fine-tune reads its parent from the registry (weights and feature state verified against
the version's sha256 tags) and keeps content-addressed copies in the artifact store, so its config
pins them like any input and a reproduction reads the same bytes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ml_assets.features.record import FeaturesRecord
from ml_assets.layout import BOOSTER_FILE, FEATURE_STATE_FILE, WEIGHTS_FILE, Layout
from ml_assets.pipeline.graph import ModelGraph
from ml_assets.records.runs import RetrainTags
from ml_assets.registry.record import VersionTags
from ml_assets.resources import ArtifactStoreResource
from ml_assets.step import Step
from ml_assets.trainer import boosting
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.training import decision as D
from ml_assets.training.launch import configure
from ml_assets.training.prepare import Prepared, prepare
from ml_assets.training.trainer_config import train_config
from ml_assets.training.tuned import Tuned
from ml_assets.training.window import Window


@dataclass(frozen=True)
class Plan:
    decision: D.Decision
    inputs_sha256: str
    key: dict[str, str]
    """This training's warm_start_key (what a later fine-tune of it must match)."""
    run: Step
    """The step to launch: a fine-tune's spec carries its epochs and processes."""
    prepared: Prepared | None = None
    cfg: TrainConfig | None = None
    """None on a skip."""


def _parent(client, spec) -> tuple[D.Parent, object] | None:
    from ml_assets.registry import versions as registry

    mv = registry.by_alias(client, spec.name, registry.CHAMPION)
    return (D.Parent.from_tags(str(mv.version), dict(mv.tags)), mv) if mv is not None else None


def version_with_inputs(client, name: str, inputs: str):
    """The first registered version trained from ``inputs`` (an inputs_key), or None."""
    found = client.search_model_versions(f"name='{name}' and tags.inputs_sha256='{inputs}'")
    return min(found, key=lambda v: int(v.version)) if found else None


def _run_tags(context: dg.AssetExecutionContext) -> dict[str, str]:
    """The run's tags; none for an asset body called directly (a test, a benchmark), which has no run."""
    try:
        return dict(context.run.tags)
    except dg.DagsterError:  # DagsterInvalidPropertyError, not exported: the body was called directly
        return {}


def _registered_behind_dagster(context: dg.AssetExecutionContext, graph: ModelGraph, partition: str, holder) -> bool:
    """The version was registered for this very partition, yet Dagster's latest registered_model of
    it is not that version: a skip would leave the registry and Dagster disagreeing for good."""
    from ml_assets.registry.record import RegisteredRecord

    if VersionTags.from_tags(holder.tags).partition != partition:
        return False
    recorded = graph.latest(context.instance, RegisteredRecord, partition)
    return recorded is None or recorded.model_version != str(holder.version)


def last_full_attempt(instance: dg.DagsterInstance, graph: ModelGraph, partition: str, days: int) -> str:
    """The latest of the ``days`` partitions before ``partition`` whose training was full (its latest
    checkpoint record says so; one from before decisions was), or ""."""
    from ml_assets.training.record import CheckpointRecord

    day = dt.date.fromisoformat(partition)
    for back in range(1, days + 1):
        earlier = (day - dt.timedelta(days=back)).isoformat()
        record = graph.latest(instance, CheckpointRecord, earlier)
        if record is not None and record.decision_kind == D.FULL:
            return earlier
    return ""


def plan(context: dg.AssetExecutionContext, graph: ModelGraph, run: Step, win: Window,
         records: dict[str, FeaturesRecord], artifacts: ArtifactStoreResource, client, checkpoint_root: str,
         tuned: Tuned | None, code_version: str) -> Plan:
    """Raises dg.Failure (a parent whose bytes no longer match their sha256 tags, a bad window)."""
    spec, warm = run.spec, run.spec.training.warm_start
    train_days, val_days = [d.isoformat() for d in win.train_days], [d.isoformat() for d in win.val_days]
    inputs = D.inputs_key(spec, {d: r.sha256 for d, r in records.items()}, tuned.params if tuned else {},
                          code_version)
    retrain = RetrainTags.from_tags(_run_tags(context))
    evidence = retrain is not None and retrain.why == "degradation"
    holder = version_with_inputs(client, spec.name, inputs) if warm is not None and not evidence else None
    if holder is not None and _registered_behind_dagster(context, graph, run.partition, holder):
        context.log.warning(
            f"trained_checkpoint {run.partition}: version {holder.version} holds these inputs and was registered for "
            "this partition, but Dagster recorded no registered_model of it (a run that ended between the registry "
            f"and Dagster): training again, so that the same bytes find version {holder.version} and both agree")
        holder = None
    if holder is not None:
        tags = VersionTags.from_tags(holder.tags)
        return Plan(D.Decision(D.SKIP, f"version {holder.version} (partition {tags.partition or '?'}) was trained "
                                       "from the same feature bytes, spec, tuned parameters and code; nothing new to train",
                               holder=str(holder.version)), inputs, tags.warm_start_key, run)
    refs = [records[d].ref(d) for d in train_days]
    probe = train_config(spec, refs, [records[d].ref(d) for d in val_days], refs[0], "", tuned.params if tuned else {})
    key = D.warm_start_key(spec, probe)
    found = _parent(client, spec) if warm is not None else None
    last_full = last_full_attempt(context.instance, graph, run.partition, warm.full_every_days) if found else ""
    decision = D.decide(spec, run.partition, found[0] if found else None, key, None, last_full)
    if evidence and warm is not None:  # the monitor saw the champion degrade: what it learned is in question
        reason = retrain.reason or "model_monitor crossed a blocking limit"
        decision = D.Decision(D.FULL, f"retraining on evidence (retrain.on: on_degradation): {reason}",
                              found[0] if found else None)
    if decision.kind == D.FINE_TUNE:
        fine = _fine_tune(context, run, win, records, artifacts, client, checkpoint_root, tuned, found, key, last_full)
        if isinstance(fine, Plan):
            return dataclasses.replace(fine, inputs_sha256=inputs)
        decision = fine
    try:
        prepared = prepare(spec, records, train_days, val_days, artifacts, Layout.of(spec).feature_state_prefix(run.partition))
    except ValueError as exc:  # includes a feature file that no longer matches its sha256
        raise run.failure(exc) from None
    return Plan(decision, inputs, key, run, prepared, configure(run, prepared, checkpoint_root, tuned))


def _fine_tune(context, run: Step, win: Window, records, artifacts: ArtifactStoreResource, client,
               checkpoint_root: str, tuned: Tuned | None, found, key, last_full: str) -> Plan | D.Decision:
    """The fine-tune's plan, or the full-retrain decision the data or the parent's weights force."""
    from ml_assets.features.window import scan_verified
    from ml_assets.registry import versions as registry
    from ml_assets.serving.pyfunc import model_files
    from ml_assets.storage import IntegrityError, read_verified
    from ml_assets.training.preflight import check_parent

    spec, warm, layout = run.spec, run.spec.training.warm_start, Layout.of(run.spec)
    parent, mv = found
    with tempfile.TemporaryDirectory(prefix="ml_assets-parent-") as tmp:
        try:  # the registered weights, checked against the version's checkpoint_sha256 tag
            files = model_files(registry.download_model(client, mv, Path(tmp)))
            state = read_verified(str(files[FEATURE_STATE_FILE]), parent.feature_state_sha256)
        except (registry.RegistryError, IntegrityError) as exc:
            raise run.failure(f"the champion v{parent.version} cannot be fine-tuned: {exc}") from None
        name = BOOSTER_FILE if spec.model.boosted else WEIGHTS_FILE  # download_model checked its sha256
        weights = artifacts.put(layout.parent_prefix(parent.version), files[name].read_bytes(), f".{name.split('.')[-1]}")
    state_ref = artifacts.put(layout.feature_state_prefix(run.partition), state, ".json")
    train_days = [d.isoformat() for d in win.train_days]
    new_days, older = train_days[-warm.days:], train_days[:-warm.days]
    with tempfile.TemporaryDirectory(prefix="ml_assets-checks-") as cache:
        try:
            checks = D.data_checks(spec, json.loads(state), scan_verified([records[d].ref(d) for d in new_days], cache),
                                   scan_verified([records[d].ref(d) for d in train_days], cache))
        except ValueError as exc:
            raise run.failure(exc) from None
    decision = D.decide(spec, run.partition, parent, key, checks, last_full)
    if decision.kind != D.FINE_TUNE:
        return decision
    replay = _replay(spec, records, older, warm.replay_fraction, artifacts, layout, run.partition) \
        if warm.replay_fraction and older else None
    val_days = [d.isoformat() for d in win.val_days]
    try:
        prepared = prepare(spec, records, new_days, val_days, artifacts, "", state=state_ref,
                           extra_train=[replay[0]] if replay else [])
    except ValueError as exc:
        raise run.failure(exc) from None
    training = spec.training.model_copy(update={"processes_per_node": warm.processes_per_node
                                                or spec.training.processes_per_node})
    fine_run = dataclasses.replace(run, spec=spec.model_copy(update={"training": training}))
    cfg = configure(fine_run, prepared, checkpoint_root, tuned, fine_tune=_fine_tune_fields(spec, weights.as_data_ref()))
    try:
        problem = check_parent(cfg)
    except IntegrityError as exc:
        raise run.failure(f"the champion v{parent.version}'s weights changed since they were copied: {exc}") from None
    if problem:
        return D.Decision(D.FULL, f"the champion v{parent.version}'s weights cannot start this model: {problem}",
                          parent, checks)
    how = ({"rounds": boosting.rounds(cfg.model_params), "learning_rate": cfg.model_params.get("learning_rate")}
           if spec.model.boosted else {"epochs": cfg.epochs, "learning_rate": cfg.learning_rate})
    detail = {"fine_tune_days": new_days, **how, "replay": replay[1] if replay else {}}
    return Plan(dataclasses.replace(decision, detail=detail), "", key, fine_run, prepared, cfg)


def _fine_tune_fields(spec, parent: DataRef):
    """What a fine-tune sets over the spec's and the tuned values, given the config they make: the
    parent's weights and a network's epochs and learning rate, or the rounds a booster adds and
    their shrinkage (in its model_params, which the trainer boosts from)."""
    warm = spec.training.warm_start

    def fields(cfg: TrainConfig) -> dict:
        if not spec.model.boosted:
            return {"epochs": warm.network_epochs, "init_weights": parent,
                    **({"learning_rate": warm.learning_rate} if warm.learning_rate else {})}
        params = {**cfg.model_params, boosting.ROUNDS: warm.added_rounds(boosting.rounds(cfg.model_params)),
                  **({"learning_rate": warm.learning_rate} if warm.learning_rate else {})}
        return {"init_weights": parent, "model_params": params}
    return fields


def _replay(spec, records, days: list[str], fraction: float, artifacts: ArtifactStoreResource, layout: Layout,
            partition: str) -> tuple[DataRef, dict]:
    """A seeded sample of ``fraction`` of each older training day's rows, as one content-addressed
    Parquet file the fine-tune trains on with the newest days."""
    import polars as pl

    from ml_assets.trainer.data import read_frame

    seed = spec.training.seed
    parts = [read_frame([records[d].ref(d)]).sample(fraction=fraction, seed=seed + i) for i, d in enumerate(days)]
    frame = pl.concat(parts, how="vertical")
    buffer = io.BytesIO()
    frame.write_parquet(buffer, statistics=False)
    ref = artifacts.put(layout.replay_prefix(partition), buffer.getvalue(), ".parquet")
    sources = [{"day": d, **{k: v for k, v in vars(records[d].ref(d)).items() if k != "day"}} for d in days]
    return ref.as_data_ref(), {"days": days, "fraction": fraction, "seed": seed, "rows": frame.height,
                               "uri": ref.uri, "sha256": ref.sha256, "sources": sources}
