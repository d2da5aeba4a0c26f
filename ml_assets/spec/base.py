"""What the spec's sections share: strict, frozen models and the checks several of them make."""

from __future__ import annotations

import re
import zoneinfo
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ml_assets.names import InvalidName, check_model_name

PositiveInt = Annotated[int, Field(gt=0)]
# A function the spec names for the platform to import: a custom check or a custom transform.
CUSTOM_CHECK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Orchestration:
    """Marks a training setting the trainer never sees (``Annotated[int, ORCHESTRATION]``): it chooses
    the days trained on, or how Dagster launches, places, retries or feeds the training. Every other
    training setting is read by a field of the trainer's config (ml_assets.trainer.config, its
    ``spec=``); ml_assets_tests/test_spec_trainer_config.py holds the two sides to it."""

    def __repr__(self) -> str:
        return "ORCHESTRATION"


ORCHESTRATION = Orchestration()


class StrictModel(BaseModel):
    """A spec section: unknown keys are errors (a typo is not silently ignored), values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def model_name(value: str) -> str:
    """A model's name (ml_assets.names), its problem said as a spec field's error."""
    try:
        return check_model_name(value)
    except InvalidName as exc:
        raise ValueError(str(exc)) from None


def check_zone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}") from None
    return value
