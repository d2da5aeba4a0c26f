"""The spec's ``card:`` section: what a model card says that no record can (ml_assets.cards)."""

from __future__ import annotations

from pydantic import Field

from ml_assets.spec.base import StrictModel


class CardSpec(StrictModel):
    intended_use: str = Field(default="", description="who uses the predictions, for what decision (default: the "
                              "spec's description)")
    out_of_scope: list[str] = Field(default=[], description="uses the model is not meant for")
    considerations: list[str] = Field(default=[], description="known risks, caveats and fairness notes to show "
                                      "beside the limits the evaluation found")
