"""What the promotion job is asked to do: its config, as the sensor, the CLI and the demo fill it in."""

import dagster as dg

from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.spec import ModelSpec


class PromotionConfig(dg.Config):
    """What the promotion job is asked to do; the sensor and the CLI fill it in."""

    action: str = "promote"
    version: str = ""
    reason: str = ""
    actor: str = ""


def promotion_run_config(spec: ModelSpec, action: str, version: str, reason: str, actor: str) -> dict:
    return {"ops": {ModelGraph(spec).key(Stage.PRODUCTION_MODEL).to_python_identifier(): {"config": {
        "action": action, "version": version, "reason": reason, "actor": actor}}}}
