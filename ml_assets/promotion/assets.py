import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.pipeline.jobs import job_tags
from ml_assets.promotion.config import PromotionConfig, promotion_run_config
from ml_assets.promotion.record import PromotionRecord
from ml_assets.registry.record import VersionTags
from ml_assets.resources import MlflowTrackingResource, VersionStoreResource
from ml_assets.spec import ModelSpec


def build_production_model(spec: ModelSpec) -> dg.AssetsDefinition:
    graph = ModelGraph(spec)
    wiring = graph.wiring(Stage.PRODUCTION_MODEL)

    @dg.asset(
        key=wiring.key,
        deps=wiring.deps,
        # Its own group: not partitioned and materialized only with a promotion's config, so
        # "materialize the model's group for a day" never tries to promote.
        group_name=graph.production_group,
        kinds={"mlflow"},
        code_version=code_version(spec, ("promotion", "evaluation"), __name__),
        tags={"ml_assets/stage": "promotion"},
        description=(f"The {spec.name} version that serves (MLflow alias 'champion'). Each materialization is one "
                     f"audited promotion or rollback; mode {spec.promotion.mode}."),
    )
    def production_model(
        context: dg.AssetExecutionContext, config: PromotionConfig,
        tracking: MlflowTrackingResource, version_store: VersionStoreResource,
    ) -> dg.MaterializeResult:
        from ml_assets import cards
        from ml_assets.evaluation.refusals import refusals
        from ml_assets.promotion import moves as promotion
        from ml_assets.promotion.freshness import freshness
        from ml_assets.promotion.freshness import to_metadata as freshness_metadata

        actor = config.actor or f"dagster run {context.run_id}"
        try:
            req = promotion.Request(spec.name, config.action, config.version or None, config.reason, actor,
                                    context.run_id)
            record, outcome = promotion.execute(tracking.client(), version_store.get_store(), spec, req)
        except (promotion.PromotionRefused, promotion.registry.RegistryError, ValueError) as exc:
            raise dg.Failure(description=f"model {spec.name}: {config.action} refused: {exc}",
                             allow_retries=False) from None
        result = promotion_record(spec, record, outcome, config.action, actor, tracking)
        # The cards of both versions now tell this decision in their promotion history.
        store = version_store.get_store()
        history, refused = promotion.history(store, spec.name), refusals(store, spec.name)
        for version in {v for v in (result.champion_version, result.previous_version) if v}:
            cards.publish(tracking.client(), spec, version, history, refused)
        context.log.info(f"production_model: {spec.name} @champion = version {result.champion_version} ({outcome}); "
                         f"previous {result.previous_version}; {result.reason}")
        fresh = freshness(context.instance, tracking.client(), store, spec.name)
        return dg.MaterializeResult(metadata={**result.to_metadata(), **freshness_metadata(fresh)})

    return production_model


def promotion_record(spec: ModelSpec, record: dict, outcome: str, action: str, actor: str,
                     tracking: MlflowTrackingResource) -> PromotionRecord:
    """The production_model record of a promotion's audit record (or of a request already in effect)."""
    from ml_assets.promotion import moves as promotion

    version, decision = record["version"], record.get("decision", "unchanged")
    lines = [f"**{decision}**: {spec.name} version {version} is @champion "
             f"(previous: {record.get('previous') or 'none'})", "",
             f"- reason: {record.get('reason', '')}", f"- actor: {record.get('actor', '')}",
             f"- time: {record.get('time', '')}",
             f"- evidence: {record.get('evidence', {}).get('gate_reason', '')}"]
    return PromotionRecord(
        model_name=spec.name, champion_version=version, previous_version=record.get("previous") or None,
        outcome=outcome, action=record.get("action", action), decision=decision,
        reason=record.get("reason", ""), actor=record.get("actor", actor), time=record.get("time", ""),
        promotion_id=record.get("id", ""), evidence=record.get("evidence", {}),
        policy=record.get("policy", spec.promotion.model_dump(mode="json")),
        promotions_log=f"{spec.repository}@main:{promotion.log_path(spec.name)}",
        mlflow_model_url=tracking.model_url(spec.name, version), record=record, summary="\n".join(lines))


def build_promotion_job(spec: ModelSpec, production_model: dg.AssetsDefinition,
                        executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    return dg.define_asset_job(
        name=ModelGraph(spec).promote_job,
        selection=dg.AssetSelection.assets(production_model),
        description=f"Move {spec.name}'s @champion (promote or roll back) and record why.",
        tags=job_tags(spec, trains=False),
        executor_def=executor_def,
    )


def build_promotion_sensor(spec: ModelSpec, job: dg.JobDefinition) -> dg.SensorDefinition:
    automatic = spec.promotion.mode == "automatic"

    @dg.sensor(
        name=ModelGraph(spec).promotion_sensor, job=job, minimum_interval_seconds=60,
        # On with automatic promotion: the spec's mode is the decision. Approval mode promotes by CLI.
        default_status=dg.DefaultSensorStatus.RUNNING if automatic else dg.DefaultSensorStatus.STOPPED,
        description=(f"Promotes the newest registered {spec.name} version whose gate passed against the current "
                     "champion (automatic mode)."),
    )
    def promotion_sensor(context: dg.SensorEvaluationContext, tracking: MlflowTrackingResource):
        from ml_assets.promotion import moves as promotion
        from ml_assets.registry import versions as registry

        if not automatic:
            return dg.SkipReason(f"{spec.name} promotion mode is approval_required: "
                                 f"ml-assets promote {spec.name} VERSION --reason TEXT")
        client = tracking.client()
        try:
            client.get_registered_model(spec.name)
        except Exception:  # noqa: BLE001 - MlflowException: nothing registered yet
            return dg.SkipReason(f"{spec.name} is not registered yet")
        left = promotion.pending(client, spec.name)
        if left is not None:  # a promotion run died half-way: run it again to finish it
            version, why = left["version"], f"finishing promotion {left['id']} left pending"
            run_key = f"finish-{left['id']}"
            action, reason = left["action"], left["reason"]
        else:
            mv, why = promotion.candidate(client, spec)
            if mv is None:
                return dg.SkipReason(why)
            champion = registry.by_alias(client, spec.name, registry.CHAMPION)
            version, action = str(mv.version), "promote"
            # One run per (candidate, champion) pair: re-ticks launch nothing new.
            run_key = f"promote-v{version}-over-{champion.version if champion else 'none'}"
            gate = VersionTags.from_tags(mv.tags).gate
            reason = f"automatic: {gate.gate_reason if gate else 'gate passed'}"
        context.log.info(why)
        return dg.RunRequest(
            run_key=run_key,
            run_config=promotion_run_config(spec, action, version, reason, f"sensor {ModelGraph(spec).promotion_sensor}"),
            tags={"ml_assets/model": spec.name, "ml_assets/promotion": action,
                  "ml_assets/version": version},
        )

    return promotion_sensor


__all__ = ["PromotionConfig", "build_production_model", "promotion_record", "build_promotion_job", "build_promotion_sensor",
           "promotion_run_config"]
