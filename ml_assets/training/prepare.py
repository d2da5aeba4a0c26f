"""The training window made ready for the trainer, shared by training and tuning: the feature
records become pinned file references, the trainer's data mode is chosen from the window's size
(training.data), the feature state is fitted on the training days alone (validation and test rows
never shape the transform) and stored content-addressed. A window to be streamed is fitted out of
core too: polars' streaming engine scans its files, never the whole window in memory."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from ml_assets.features.record import FeaturesRecord
from ml_assets.resources import ArtifactStoreResource
from ml_assets.resources.artifacts import ArtifactRef
from ml_assets.spec import ModelSpec
from ml_assets.trainer.config import DataRef
from ml_assets.training.trainer_config import DataChoice, choose_data_mode


@dataclass(frozen=True)
class Prepared:
    train: list[DataRef]
    val: list[DataRef]
    state: ArtifactRef
    data: DataChoice
    """How the trainer reads the window (its config's data_mode), and why."""


def prepare(spec: ModelSpec, records: Mapping[str, FeaturesRecord], train_days: list[str], val_days: list[str],
            artifacts: ArtifactStoreResource, state_prefix: str, check_validation: bool = True,
            state: ArtifactRef | None = None, extra_train: list[DataRef] = ()) -> Prepared:
    """``records``: the features record of each day, by ISO day. ``state``: a fitted state to keep
    (a fine-tune's parent's) instead of fitting one; ``extra_train``: more files to train on (a
    fine-tune's replay sample). Raises ValueError (a feature file that no longer matches its
    sha256, too few validation rows) naming what is wrong."""
    import datetime as dt

    from ml_assets.features import state as feature_state
    from ml_assets.features.window import scan_verified
    from ml_assets.trainer.data import read_frame  # torch: imported when training runs
    from ml_assets.training.window import check_rows

    train = [records[d].ref(d) for d in train_days] + list(extra_train)
    val = [records[d].ref(d) for d in val_days]
    training = spec.training
    extra_bytes = sum(_size(ref.uri) for ref in extra_train)
    data = choose_data_mode(training, sum(records[d].bytes for d in [*train_days, *val_days]) + extra_bytes)
    if check_validation:  # the last few days: in memory, whatever the mode
        check_rows(spec, read_frame(val), "validation days", tuple(dt.date.fromisoformat(d) for d in val_days),
                   "training.min_validation_rows", training.min_validation_rows, "training.validation_days",
                   training.validation_days)
    if state is not None:
        return Prepared(train, val, state, data)
    with tempfile.TemporaryDirectory(prefix="ml_assets-fit-") as cache:  # remote files, copied as verified
        rows = read_frame(train) if data.mode == "memory" else scan_verified(train, cache)
        state = feature_state.fit_state(rows, spec.features, spec.target.name, spec.target.task)
    return Prepared(train, val, artifacts.put(state_prefix, feature_state.state_bytes(state), ".json"), data)


def _size(uri: str) -> int:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    return int(fs.size(path))
