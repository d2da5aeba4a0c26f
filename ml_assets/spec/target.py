"""The spec's ``target`` section: the label, computed from the raw columns, and the task."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import StrictModel

Task = Literal["binary_classification", "regression", "multiclass_classification"]


class TargetSpec(StrictModel):
    name: str
    expression: str = Field(description=(
        "polars SQL expression over the raw columns; multiclass: a class name (or a class index), e.g. "
        "CASE WHEN dep_delay >= 60 THEN 'very_late' WHEN dep_delay >= 15 THEN 'late' ELSE 'on_time' END"))
    task: Task
    classes: list[str] | None = Field(default=None, description=(
        "multiclass_classification only: the class names, at least 3; a class's index is its position here"))

    @model_validator(mode="after")
    def _classes(self) -> TargetSpec:
        if self.task != "multiclass_classification":
            if self.classes is not None:
                raise ValueError(f"classes apply to task multiclass_classification, not {self.task}")
            return self
        if self.classes is None:
            raise ValueError("task multiclass_classification needs classes: the class names, e.g. "
                             "[on_time, late, very_late]")
        twice = sorted({c for c in self.classes if self.classes.count(c) > 1})
        if twice:
            raise ValueError(f"classes: {twice} named more than once")
        if len(self.classes) < 3 or not all(c.strip() for c in self.classes):
            raise ValueError(f"classes: {self.classes} must be at least 3 non-empty names (2 classes: use "
                             "binary_classification)")
        if "predicted_class" in self.classes:  # the served model's column of the predicted class's name
            raise ValueError("classes: 'predicted_class' is reserved; name the class otherwise")
        return self

    @field_validator("expression")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            pl.sql_expr(value)
        except Exception as exc:  # polars raises several error types for bad SQL
            raise ValueError(f"expression {value!r} does not parse: {exc}") from None
        return value

    @property
    def input_columns(self) -> list[str]:
        return pl.sql_expr(self.expression).meta.root_names()
