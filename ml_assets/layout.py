"""Every path a model writes, in one place: version-store objects, artifact prefixes, checkpoint
directories, the exported files and the MLflow artifact folders.

Paths are strings, not ``Path``: most are keys in a store or fsspec URLs (``s3://...``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ml_assets.spec import ModelSpec

ROWS = "rows"
"""The table of a day's source rows (the others are the spec's dimension tables)."""

WEIGHTS_FILE = "model.safetensors"
BOOSTER_FILE = "model.ubj"
"""A gradient-boosted model's booster (XGBoost's UBJSON), in place of the weights."""
META_FILE = "meta.json"
FEATURE_STATE_FILE = "feature_state.json"
EXPORT_FILES = (WEIGHTS_FILE, META_FILE, FEATURE_STATE_FILE)
"""What the trainer exports side by side in its output directory (and the registered model carries);
a booster's export holds BOOSTER_FILE in place of WEIGHTS_FILE (``weights_file``)."""


def weights_file(meta: dict) -> str:
    """The file that holds an export's trained parameters, as its meta.json names it."""
    name = meta.get("weights_file", WEIGHTS_FILE)
    if name not in (WEIGHTS_FILE, BOOSTER_FILE):
        raise ValueError(f"meta.json names weights file {name!r}, not {WEIGHTS_FILE} or {BOOSTER_FILE}")
    return name

# Folders of a training's MLflow run.
MLFLOW_MODEL = "model"
MLFLOW_TRAINING = "training"
DECISION_FILE = "decision.json"
"""In a version's MLflow run, under training/: its training decision (ml_assets.training.decision)."""
MLFLOW_EVALUATION = "evaluation"
MLFLOW_PLOTS = "evaluation/plots"
MLFLOW_TUNING = "tuning"


def _iso(day: dt.date | str) -> str:
    return day.isoformat() if isinstance(day, dt.date) else day


def sibling(uri: str, name: str) -> str:
    """The file ``name`` beside ``uri`` (an exported file beside the weights)."""
    return f"{uri.rsplit('/', 1)[0]}/{name}"


@dataclass(frozen=True)
class Layout:
    """Where one model's things live. Build it with ``Layout.of(spec)``."""

    model: str
    dimensions: tuple[tuple[str, bool], ...] = ()
    """The spec's dimension tables in order, each with whether it is stored by day."""

    @classmethod
    def of(cls, spec: ModelSpec) -> Layout:
        return cls(spec.name, tuple(
            (name, table.timestamp_column is not None or (table.path is not None and "{date}" in table.path))
            for name, table in spec.source.dimensions.items()))

    # The model's version-store repository.
    def rows_path(self, day: dt.date | str) -> str:
        return f"rows/date={_iso(day)}/part-0.parquet"

    def object_paths(self, day: dt.date | str) -> dict[str, str]:
        """Each table of the day by name: the rows, then the dimensions (daily or static)."""
        paths = {ROWS: self.rows_path(day)}
        for name, by_day in self.dimensions:
            paths[name] = f"dimensions/{name}/date={_iso(day)}/part-0.parquet" if by_day else f"dimensions/{name}/part-0.parquet"
        return paths

    @staticmethod
    def quarantine_path(day: dt.date | str) -> str:
        return f"quarantine/date={_iso(day)}/part-0.parquet"

    @property
    def promotions_log(self) -> str:
        return f"promotions/{self.model}.jsonl"

    @property
    def refusals_log(self) -> str:
        return f"promotions/{self.model}.refused.jsonl"

    # The artifact store (content-addressed under these prefixes).
    def features_prefix(self, day: dt.date | str) -> str:
        return f"{self.model}/features/date={_iso(day)}"

    def feature_state_prefix(self, day: dt.date | str) -> str:
        return f"{self.model}/feature_state/date={_iso(day)}"

    def tuning_state_prefix(self, last_day: str) -> str:
        return f"{self.model}/feature_state/tuning-{last_day}"

    def parent_prefix(self, version: str) -> str:
        """A registered version's weights, copied for the fine-tunes that start from them."""
        return f"{self.model}/parents/v{int(version)}"

    def replay_prefix(self, day: dt.date | str) -> str:
        return f"{self.model}/replay/date={_iso(day)}"

    def evaluation_prefix(self, day: dt.date | str) -> str:
        return f"{self.model}/evaluation/date={_iso(day)}"

    def predictions_prefix(self, day: dt.date | str) -> str:
        return f"{self.model}/predictions/date={_iso(day)}"

    # The checkpoint store.
    def partition_dir(self, root: str, day: dt.date | str) -> str:
        return f"{root.rstrip('/')}/{self.model}/date={_iso(day)}"

    def output_dir(self, root: str, day: dt.date | str, run_id: str, attempt: str) -> str:
        """Where one execution of a run's training step exports its model. ``attempt`` tells apart
        two executions of the same run (a step retry, a resumed run), so that one never exports over
        another's meta.json, whose sha256 the first one's record holds. (torchrun restarting ranks
        within one execution shares its directory; a finished rank is never restarted, see
        ml_assets.processes.report_exit.)"""
        return f"{self.partition_dir(root, day)}/{run_id}-{attempt}"

    def checkpoint_dir(self, root: str, day: dt.date | str, fingerprint: str) -> str:
        """Keyed by what decides the weights (the config's fingerprint), not by the run: a retry or a
        re-run of the same training resumes; a changed config starts its own."""
        return f"{self.partition_dir(root, day)}/train-{fingerprint[:16]}"

