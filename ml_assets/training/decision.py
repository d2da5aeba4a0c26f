"""Each daily partition's training decision (``training.warm_start``, docs/training.md "Daily
retraining"): skip when a registered version already holds the result of the very same inputs,
fine-tune the champion on the newest days when its weights and fitted feature state still fit, or
train from scratch, and why. Plain functions over plain values: the registry lookups are in
ml_assets.training.warm, which gathers what these judge."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ml_assets.spec import ModelSpec
from ml_assets.trainer.config import TrainConfig

SKIP, FINE_TUNE, FULL = "skip", "fine_tune", "full"
DECISIONS = (SKIP, FINE_TUNE, FULL)


def _sha(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def warm_start_key(spec: ModelSpec, cfg: TrainConfig) -> dict[str, str]:
    """What must not change between a parent and its fine-tune, by part: the features (their
    transforms decide what the fitted state means), the target, and the network (its family or
    factory, hyperparameters and code pin). Each part's sha256, so a refusal names the part."""
    network = {"task": cfg.task, "classes": cfg.classes, "family": cfg.family, "hidden_sizes": cfg.hidden_sizes,
               "dropout": cfg.dropout, "model_factory": cfg.model_factory, "model_params": cfg.model_params,
               "model_code": cfg.model_code.get("sha256", "") if cfg.model_factory else ""}
    return {"features": _sha(spec.features.model_dump(mode="json")),
            "target": _sha(spec.target.model_dump(mode="json")), "model": _sha(network)}


def inputs_key(spec: ModelSpec, fit_files: Mapping[str, str], tuned: Mapping[str, Any], code_version: str) -> str:
    """sha256 of everything a partition's training starts from: each window day's feature bytes
    (``fit_files``: day -> sha256; the fitted state and any parent follow from them and the
    registry), the spec's features, target, model and training sections, tuned parameters and the
    training code's version (a factory's code pin is part of it). The same key means the same
    training: a registered version with it already holds the result."""
    sections = {name: getattr(spec, name).model_dump(mode="json") for name in ("features", "target", "model", "training")}
    return _sha({"files": dict(sorted(fit_files.items())), "spec": sections, "tuned": dict(tuned),
                 "code_version": code_version})


@dataclass(frozen=True)
class Parent:
    """The champion a fine-tune would start from, as its registered version's tags describe it."""

    version: str
    partition: str
    weights_sha256: str
    feature_state_sha256: str
    decision: str
    """How it was trained: full or fine_tune (an untagged version, from before decisions: full)."""
    chain_start: str
    """The partition of the full training its chain of fine-tunes began with (itself when full)."""
    key: dict[str, str]
    """Its warm_start_key; empty for a version from before decisions."""

    @classmethod
    def from_tags(cls, version: str, tags: Mapping[str, str]) -> Parent:
        """From a registered version's tags (ml_assets.registry.record.VersionTags)."""
        from ml_assets.registry.record import VersionTags

        t = VersionTags.from_tags(tags)
        return cls(version=str(version), partition=t.partition, weights_sha256=t.checkpoint_sha256,
                   feature_state_sha256=t.feature_state_sha256, decision=t.training_decision or FULL,
                   chain_start=t.chain_start_partition or t.partition, key=dict(t.warm_start_key))


@dataclass(frozen=True)
class DataChecks:
    """How far the window moved from what the parent's feature state was fitted on."""

    unknown_share: float
    """The largest share, over the vocabulary-encoded features, of the fine-tune days' rows with a
    category the parent's vocabulary lacks, beyond the share of rare values it already left out
    when it was fitted."""
    unknown_by_feature: dict[str, float]
    mean_shift: float
    """The largest |mean now - parent's mean| / parent's sd of a scaled numeric over the window's training days."""
    mean_shift_by_feature: dict[str, float]
    rows: int
    """The fine-tune days' rows the unknown share is of."""

    def worst(self, values: dict[str, float]) -> str:
        return max(values, key=values.get) if values else ""


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str
    parent: Parent | None = None
    checks: DataChecks | None = None
    holder: str = ""
    """skip: the registered version that already holds the result."""
    detail: dict[str, Any] = field(default_factory=dict)
    """fine_tune: the days trained on, the replay sample, the epochs."""

    def as_metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "reason": self.reason}
        if self.parent is not None:
            out["parent"] = {"version": self.parent.version, "partition": self.parent.partition,
                             "weights_sha256": self.parent.weights_sha256, "decision": self.parent.decision,
                             "chain_start": self.parent.chain_start}
        if self.checks is not None:
            out["checks"] = asdict(self.checks)
        if self.holder:
            out["holder_version"] = self.holder
        return {**out, **self.detail}


def decide(spec: ModelSpec, partition: str, parent: Parent | None, key: dict[str, str],
           checks: DataChecks | None, last_full: str = "") -> Decision:
    """Fine-tune or full (a skip is found before: ml_assets.training.warm). ``parent``: the champion
    (None: there is none); ``key``: this training's warm_start_key; ``checks``: the window against
    the parent's feature state (None when there is no parent to compare with); ``last_full``: the
    latest earlier partition that trained from scratch, promoted or not (the schedule counts from
    it, so a full retrain that lost the gate is not tried again every day)."""
    warm = spec.training.warm_start
    if warm is None:
        return Decision(FULL, "training.warm_start is not set: every partition trains from scratch")
    if parent is None:
        return Decision(FULL, f"no @champion of {spec.name} to fine-tune yet")
    if not parent.partition or parent.partition >= partition:
        # Its training or validation days may lie after this partition's test days.
        return Decision(FULL, f"the champion v{parent.version} was trained for partition {parent.partition or '?'}, "
                              f"not before {partition}: fine-tuning from it could train on this partition's test days",
                        parent)
    start = max(parent.chain_start, last_full if last_full < partition else "")
    since = (dt.date.fromisoformat(partition) - dt.date.fromisoformat(start)).days
    if since >= warm.full_every_days:
        began = (f"the champion v{parent.version}'s chain began with the full training of {start}, {since} days "
                 "before" if start == parent.chain_start else
                 f"the last full training (of {start}, not promoted) was {since} days before")
        return Decision(FULL, f"scheduled: {began}, and training.warm_start.full_every_days is "
                              f"{warm.full_every_days}", parent)
    changed = [part for part in ("features", "target", "model") if parent.key.get(part) != key[part]]
    if changed:
        why = ("it records no warm-start key (registered before fine-tunes)" if not parent.key
               else f"its {' and '.join(changed)} section{'s' if len(changed) > 1 else ''} differ from the spec's now")
        return Decision(FULL, f"the champion v{parent.version} is incompatible: {why}", parent)
    limits = warm.full_when
    if checks is not None and checks.unknown_share > limits.unknown_share_above:
        name = checks.worst(checks.unknown_by_feature)
        return Decision(FULL, f"the data moved: {checks.unknown_share:.2%} more of the fine-tune days' rows hold a "
                              f"{name!r} the champion's vocabulary lacks than when it was fitted, more than "
                              f"training.warm_start.full_when.unknown_share_above ({limits.unknown_share_above:g})",
                        parent, checks)
    if checks is not None and checks.mean_shift > limits.mean_shift_above:
        name = checks.worst(checks.mean_shift_by_feature)
        return Decision(FULL, f"the data moved: {name!r}'s mean over the window is {checks.mean_shift:.3g} of the "
                              f"champion's standard deviations from what it was fitted on, more than "
                              f"training.warm_start.full_when.mean_shift_above ({limits.mean_shift_above:g})",
                        parent, checks)
    if spec.model.boosted:
        from ml_assets.trainer.boosting import rounds

        how = f"adding up to {warm.added_rounds(rounds(spec.model.params))} boosting round(s)"
    else:
        how = f"for {warm.network_epochs} epoch(s)"
    return Decision(FINE_TUNE, f"fine-tuning the champion v{parent.version} (partition {parent.partition}, chain from "
                               f"{parent.chain_start}) on the newest {warm.days} day(s) {how}", parent, checks)


def data_checks(spec: ModelSpec, state: dict, new_rows, window_rows) -> DataChecks:
    """The parent's fitted ``state`` against the fine-tune days' rows (``new_rows``: their unknown
    categories) and the window's training days (``window_rows``: each scaled numeric's mean), both
    polars LazyFrames of built feature rows."""
    import polars as pl

    from ml_assets.features.state import _pre

    limits = spec.training.warm_start.full_when if spec.training.warm_start else None
    wanted, ignored = set(limits.features or []) if limits else set(), set(limits.ignore) if limits else set()
    kept = lambda name: (not wanted or name in wanted) and name not in ignored  # noqa: E731
    vocab = [c for c in state["categorical"] if c["encoding"] == "vocabulary" and kept(c["name"])]
    scaled = [s for s in state["numeric"] if kept(s["name"])]
    unknown = [(pl.col(c["name"]).is_not_null() & ~pl.col(c["name"]).cast(pl.String).is_in(c["vocabulary"]))
               .alias(c["name"]) for c in vocab]
    flags = new_rows.select(pl.len().alias("__rows"), *(u.sum() for u in unknown)).collect().row(0, named=True)
    rows = int(flags["__rows"] or 0)
    share = lambda n: (n or 0) / rows if rows else 0.0  # noqa: E731
    means = window_rows.select(_pre(s["name"], s["steps"]).mean().alias(s["name"]) for s in scaled).collect() \
        if scaled else None
    shifts = {s["name"]: abs(((means[s["name"]][0] if means is not None else None) or s["mean"]) - s["mean"]) / s["std"]
              for s in scaled}
    # Beyond what already fell out of each vocabulary when it was fitted (its rare values).
    by_feature = {c["name"]: round(max(0.0, share(flags[c["name"]]) - c.get("oov_share", 0.0)), 6) for c in vocab}
    return DataChecks(unknown_share=max(by_feature.values(), default=0.0), unknown_by_feature=by_feature,
                      mean_shift=round(max(shifts.values(), default=0.0), 6),
                      mean_shift_by_feature={k: round(v, 6) for k, v in shifts.items()}, rows=rows)
