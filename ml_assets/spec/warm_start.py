"""The spec's ``training.warm_start`` section: how each daily partition decides between skipping,
fine-tuning the champion and training from scratch (ml_assets.training.decision)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ml_assets.spec.base import PositiveInt, StrictModel


class FullWhenSpec(StrictModel):
    """When the data moved too far for the champion's fitted feature state: a full retrain refits it."""

    unknown_share_above: float = Field(default=0.05, ge=0, le=1, description=(
        "share of the fine-tune days' rows with a category the champion's vocabulary of a feature lacks, beyond the "
        "share of rare values it left out when fitted (the largest over the vocabulary-encoded features): above "
        "it, retrain from scratch"))
    mean_shift_above: float = Field(default=0.5, gt=0, le=100, description=(
        "the largest shift of a numeric feature's mean over the window's training days, in the champion's "
        "standard deviations (its fitted scaler): above it, retrain from scratch"))
    features: list[str] | None = Field(default=None, description=(
        "the features the two checks look at (unset: every vocabulary-encoded categorical and scaled (not bucketized) "
        "numeric)"))
    ignore: list[str] = Field(default=[], description=(
        "features the two checks leave out (e.g. a calendar month, new in every row of a new month); with "
        "features unset"))

    @model_validator(mode="after")
    def _one_list(self) -> FullWhenSpec:
        if self.features is not None and self.ignore:
            raise ValueError("full_when: name the features to check or those to ignore, not both")
        return self


class WarmStartSpec(StrictModel):
    from_: Literal["champion"] = Field(default="champion", alias="from", description=(
        "the model a fine-tune starts from: the model's own @champion"))
    days: PositiveInt = Field(default=3, description=(
        "the newest training days of the window a fine-tune trains on (the validation days stay the window's)"))
    replay_fraction: float = Field(default=0.0, ge=0, le=1, description=(
        "a seeded sample of this share of the older training days' rows, trained on with the newest days so the "
        "model does not forget them (0: none)"))
    epochs: PositiveInt | None = Field(default=None, description=(
        "a network's fine-tune: its epochs, early stopping as training's (unset: 2)"))
    rounds: PositiveInt | None = Field(default=None, le=100_000, description=(
        "family xgboost: the boosting rounds a fine-tune adds to the champion's trees, early stopping as "
        "training's (unset: a tenth of model.params.num_boost_round, at least 1)"))
    learning_rate: float | None = Field(default=None, gt=0, lt=1, description=(
        "a fine-tune's peak learning rate (unset: training.learning_rate), or family xgboost's shrinkage of the "
        "rounds it adds (unset: model.params.learning_rate)"))
    processes_per_node: int | None = Field(default=None, ge=1, le=64, description=(
        "a fine-tune's torchrun processes (unset: training.processes_per_node); a few days' rows rarely pay "
        "for more than one"))
    full_every_days: PositiveInt = Field(default=7, le=366, description=(
        "retrain from scratch when the champion's chain of fine-tunes began this many days or more before the "
        "partition"))
    full_when: FullWhenSpec = FullWhenSpec()

    @property
    def network_epochs(self) -> int:
        """A network's fine-tune: its epochs."""
        return self.epochs or 2

    def added_rounds(self, num_boost_round: int) -> int:
        """family xgboost: the rounds a fine-tune adds, for a model of ``num_boost_round`` rounds."""
        return self.rounds or max(1, num_boost_round // 10)

    @model_validator(mode="after")
    def _replay_has_a_share(self) -> WarmStartSpec:
        if self.replay_fraction and self.replay_fraction >= 1:
            raise ValueError("replay_fraction: 1 replays every older day whole: that is a full window, not a "
                             "fine-tune; use a share below 1")
        return self
