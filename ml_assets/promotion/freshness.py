"""How fresh a model's champion is and what its daily retraining has been doing (``ml-assets status``,
and the production_model asset's metadata in the UI).

Ages are counted in partitions (data days), not on the wall clock: a backfill of last year's days
and a daily schedule read the same. The newest partition is the newest one trained_checkpoint has
materialized; the champion's, the partition its registered version was trained for.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg

    from ml_assets.versioning import VersionStore

WEEK = 7
READ = 400  # the newest materializations read: more than a year of daily partitions, with reruns


@dataclass(frozen=True)
class Freshness:
    model: str
    champion_version: str | None = None
    champion_partition: str | None = None
    newest_partition: str | None = None
    champion_age_days: int | None = None
    last_decision: dict[str, str] = field(default_factory=dict)
    """{partition, kind (skip, fine_tune, full), reason} of the newest trained_checkpoint."""
    last_refusal: dict[str, str] = field(default_factory=dict)
    """{partition, reason} of the newest refused candidate (ml_assets.evaluation.refusals)."""
    last_full_partition: str | None = None
    days_since_full: int | None = None
    compute_7d: dict[str, float] = field(default_factory=dict)
    """Over the newest 7 partitions: trainings, cpu_rank_seconds, gpu_rank_seconds, wall_seconds."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _days(later: str | None, earlier: str | None) -> int | None:
    try:
        return (dt.date.fromisoformat(later) - dt.date.fromisoformat(earlier)).days
    except (TypeError, ValueError):
        return None


def _checkpoints(instance: dg.DagsterInstance, model: str) -> dict[str, Any]:
    """The newest trained_checkpoint record of each partition, by partition."""
    import dagster as dg

    from ml_assets.pipeline.graph import Stage, stage_key
    from ml_assets.training.record import CheckpointRecord

    found: dict[str, Any] = {}
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=stage_key(model, Stage.TRAINED_CHECKPOINT)),
                                              limit=READ, ascending=False).records
    for event in records:  # newest first: a rerun's record replaces the earlier one
        day = event.asset_materialization.partition
        if day and day not in found:
            found[day] = CheckpointRecord.from_metadata(event.asset_materialization.metadata)
    return found


def freshness(instance: dg.DagsterInstance, client, store: VersionStore, model: str) -> Freshness:
    """The model's freshness from its records: the instance's materializations, the registry's
    @champion and the refusals log on main."""
    from ml_assets.evaluation.refusals import refusals
    from ml_assets.registry import versions as registry
    from ml_assets.registry.record import VersionTags

    checkpoints = _checkpoints(instance, model)
    newest = max(checkpoints, default=None)
    champion = registry.by_alias(client, model, registry.CHAMPION)
    partition = VersionTags.from_tags(champion.tags).partition if champion else None
    full = max((d for d, c in checkpoints.items() if c.decision_kind == "full"), default=None)
    week = [c for d, c in checkpoints.items() if (age := _days(newest, d)) is not None and 0 <= age < WEEK]
    trained = [c for c in week if c.decision_kind != "skip"]
    refused = refusals(store, model)
    last = checkpoints[newest] if newest else None
    return Freshness(
        model=model, champion_version=str(champion.version) if champion else None, champion_partition=partition,
        newest_partition=newest, champion_age_days=_days(newest, partition),
        last_decision={"partition": newest, "kind": last.decision_kind,
                       "reason": last.decision.get("reason", "")} if last else {},
        last_refusal={"partition": refused[-1]["partition"], "reason": refused[-1]["reason"]} if refused else {},
        last_full_partition=full, days_since_full=_days(newest, full),
        compute_7d={"partitions": len(week), "trainings": len(trained),
                    "cpu_rank_seconds": round(sum(c.result.cpu_rank_seconds or 0.0 for c in trained), 1),
                    "gpu_rank_seconds": round(sum(c.result.gpu_rank_seconds or 0.0 for c in trained), 1),
                    "wall_seconds": round(sum(c.result.wall_seconds or 0.0 for c in trained), 1)})


def render(f: Freshness) -> list[str]:
    """``ml-assets status``'s lines for one model."""
    age = f"{f.champion_age_days} day(s) behind the newest partition {f.newest_partition}" \
        if f.champion_age_days is not None else "no partition trained yet"
    champion = f"v{f.champion_version} (partition {f.champion_partition}), {age}" if f.champion_version else "none yet"
    decision = (f"{f.last_decision['partition']}: {f.last_decision['kind']}: {f.last_decision['reason']}"
                if f.last_decision else "none yet")
    refusal = f"{f.last_refusal['partition']}: {f.last_refusal['reason']}" if f.last_refusal else "none"
    full = (f"{f.days_since_full} day(s) ago (partition {f.last_full_partition})" if f.last_full_partition
            else "none in the newest partitions")
    c = f.compute_7d
    compute = (f"{c['trainings']} training(s) in {c['partitions']} partition(s): {c['cpu_rank_seconds']:.0f} CPU "
               f"rank-s, {c['gpu_rank_seconds']:.0f} GPU rank-s, {c['wall_seconds']:.0f} s wall") if c else "none"
    return [f"{f.model}", f"  champion          {champion}", f"  last decision     {decision}",
            f"  last refusal      {refusal}", f"  last full         {full}", f"  compute, 7 days   {compute}"]


def to_metadata(f: Freshness) -> dict[str, Any]:
    """The same, as the production_model asset's metadata."""
    import dagster as dg

    return {"champion_age_days": f.champion_age_days if f.champion_age_days is not None else dg.MetadataValue.null(),
            "last_decision": f.last_decision.get("kind", ""), "last_decision_reason": f.last_decision.get("reason", ""),
            "last_refusal": dg.MetadataValue.json(f.last_refusal),
            "days_since_full_training": f.days_since_full if f.days_since_full is not None else dg.MetadataValue.null(),
            "compute_7d": dg.MetadataValue.json(f.compute_7d), "freshness": dg.MetadataValue.md("\n".join(
                ["```", *render(f), "```"]))}
