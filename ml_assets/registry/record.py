"""What a registered MLflow model version says of itself (its tags), and the registered_model asset's
record. Tags are strings: lists and mappings travel as JSON, and a version registered before a tag
existed reads it as empty."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from ml_assets.records.base import Record, field

_JSON_TAGS = ("data_commits", "test_days", "skipped_days", "classes", "warm_start_key")
# Left out while empty: a full training has no parent; a version from before decisions has none of them.
_OPTIONAL_TAGS = ("model_factory", "model_code_sha256", "parent_version", "parent_checkpoint_sha256",
                  "inputs_sha256", "warm_start_key")


@dataclass(frozen=True, kw_only=True)
class GateTags:
    """The evaluation's decision and the evidence behind it: what the sensor and promotion read.
    Refreshed on an existing version when its weights are evaluated again."""

    gate: str
    """passed or failed"""
    gate_reason: str
    gate_champion_version: str
    """The champion it was compared with, or "none"."""
    decision_threshold: str
    evaluation_report_uri: str
    evaluation_report_sha256: str
    primary_metric: str
    primary_value: str
    """Tagged as ``test_<primary_metric>``."""

    @property
    def passed(self) -> bool:
        return self.gate == "passed"

    def to_tags(self) -> dict[str, str]:
        tags = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "primary_value"}
        return {**tags, f"test_{self.primary_metric}": self.primary_value}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self:
        primary = tags.get("primary_metric", "")
        values = {f.name: tags.get(f.name, "") for f in dataclasses.fields(cls) if f.name != "primary_value"}
        return cls(**values, primary_value=tags.get(f"test_{primary}", "") if primary else "")


@dataclass(frozen=True, kw_only=True)
class VersionTags:
    """Everything a model version links to: data commits, run, code, weights, feature state."""

    data_commit: str
    """Main commit of the newest training day."""
    data_commits: dict[str, str]
    test_data_commit: str
    test_days: list[str]
    skipped_days: dict[str, str]
    """Window and test days the spec let the partition go without (training.missing_days: skip)."""
    dagster_run_id: str
    dagster_run_url: str
    partition: str
    code_version: str
    checkpoint_sha256: str
    checkpoint_uri: str
    feature_state_sha256: str
    feature_state_uri: str
    world_size: str
    seed: str
    torch_version: str
    hyperparameters_source: str
    """The spec, or a tuning study's best trial."""
    task: str = ""
    """Multiclass only (with ``classes``): a scorer reading the tags knows what it predicts."""
    classes: list[str] = dataclasses.field(default_factory=list)
    model_factory: str = ""
    """A model of the team's own: its factory's import path (absent for a built-in family)."""
    model_code_sha256: str = ""
    """And the sha256 its code was pinned by (ml_assets.trainer.code_pin)."""
    training_decision: str = ""
    """full or fine_tune (ml_assets.training.decision); empty on versions from before decisions (full)."""
    training_decision_reason: str = ""
    parent_version: str = ""
    """A fine-tune: the version its weights started from."""
    parent_checkpoint_sha256: str = ""
    """And that version's weights' sha256, as the fine-tune read them."""
    chain_start_partition: str = ""
    """The partition of the full training this version descends from (its own when full)."""
    inputs_sha256: str = ""
    """What its training started from: a later partition with the same inputs skips."""
    warm_start_key: dict[str, str] = dataclasses.field(default_factory=dict)
    """What a fine-tune of it must match: features, target, network (sha256 each)."""
    gate: GateTags | None = None

    def to_tags(self) -> dict[str, str]:
        tags = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "gate" or (f.name in ("task", "classes") and not self.classes):
                continue
            if f.name in _OPTIONAL_TAGS and not value:
                continue
            tags[f.name] = json.dumps(value, sort_keys=True) if f.name in _JSON_TAGS else str(value)
        return {**tags, **(self.gate.to_tags() if self.gate else {})}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "gate" or (f.name not in tags and f.default is not dataclasses.MISSING):
                continue
            if f.name in _JSON_TAGS:
                values[f.name] = json.loads(tags.get(f.name) or ("[]" if f.name in ("test_days", "classes") else "{}"))
            else:
                values[f.name] = tags.get(f.name, "")
        return cls(**values, gate=GateTags.from_tags(tags) if "gate" in tags else None)


@dataclass(frozen=True, kw_only=True)
class RegisteredRecord(Record):
    """registered_model: the MLflow model version of one trained checkpoint."""

    model_name: str
    model_version: str
    alias: str | None
    mlflow_run_id: str
    mlflow_run_url: str = field("url")
    mlflow_model_url: str = field("url")
    tags: dict[str, str] = field("json")
    """The version's tags as registered (VersionTags.from_tags reads them)."""
    model_card: str | None = field("md", default=None)
    """The version's model card as registered (ml_assets.cards; also in its MLflow run, card/)."""

    @property
    def version_tags(self) -> VersionTags:
        return VersionTags.from_tags(self.tags)
