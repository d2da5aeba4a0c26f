"""Assembles the code location: one asset group per model spec, resources for the environment."""

import dagster as dg

from ml_assets.ingest import sources
from ml_assets.model_files import load_declared_specs
from ml_assets.pipeline.model import build_model_defs
from ml_assets.platform import alert_sensors, local_resources, step_executor
from ml_assets.settings import Settings, load_settings


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    """This repository's code location: the models ML_ASSETS_MODELS_DIR (or, in this checkout, the
    bundled directory) declares, with the resources and executor set once for all of them."""
    settings = settings or load_settings()
    sources.use_cache(settings.home / "cache")
    specs = load_declared_specs(settings)  # <name>.yaml specs and <name>/defs.yaml components
    models = [build_model_defs(spec) for spec in specs]
    shared = dg.Definitions(resources=local_resources(settings), executor=step_executor(settings, specs),
                            sensors=alert_sensors(settings, [spec.name for spec in specs]))
    return dg.Definitions.merge(*models, shared)
