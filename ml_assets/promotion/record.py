"""What a promotion or rollback records on the production_model asset."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ml_assets.records.base import Record, field


@dataclass(frozen=True, kw_only=True)
class PromotionRecord(Record):
    """production_model: one audited move of @champion (or "unchanged" when already in effect)."""

    model_name: str
    champion_version: str
    previous_version: str | None
    outcome: str
    """done, resumed (a record a crash left pending was finished) or unchanged."""
    action: str
    decision: str
    reason: str
    actor: str
    time: str
    promotion_id: str
    evidence: dict[str, Any] = field("json")
    policy: dict[str, Any] = field("json")
    promotions_log: str
    mlflow_model_url: str = field("url")
    record: dict[str, Any] = field("json")
    """The audit record as appended to the promotions log."""
    summary: str = field("md")


PENDING_TAG = "promotion.pending"
"""The registered model's tag that holds a promotion's record until every step of it is done."""


def pending_record(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The promotion record a crash left pending on the registered model, if any."""
    value = tags.get(PENDING_TAG)
    return json.loads(value) if value else None


def pending_tag(record: dict[str, Any]) -> tuple[str, str]:
    return PENDING_TAG, json.dumps(record, sort_keys=True)
