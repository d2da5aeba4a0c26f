"""What one check found: enough for a person to act on, and for Dagster's check metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

MAX_FAILING_ROWS = 50


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    summary: str
    """One line naming the column(s), the check and the numbers, e.g. "carrier: 4 rows outside the
    allowed categories"."""
    counts: dict[str, int] = field(default_factory=dict)
    """Failures per kind, e.g. {"carrier: isin": 4}."""
    observed: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    failing_rows: pl.DataFrame | None = None
    """Up to MAX_FAILING_ROWS of the rows that failed, with a column saying why."""
    row_indices: set[int] = field(default_factory=set)
    """Every failing row's index, when the failure is row-level (it could be quarantined)."""
    waived: str | None = None
    """The reason of the spec's waiver that let this failure pass, if one did."""
    blocking: bool = True
    """False when the spec sets the check to ``severity: warn``: a failure is reported, never stops the merge."""

    def markdown(self) -> str:
        state = (f"passed by waiver ({self.waived})" if self.waived else "passed" if self.passed
                 else "FAILED" if self.blocking else "WARNING (does not block)")
        lines = [f"**{self.name}: {state}**: {self.summary}"]
        keys = sorted(set(self.observed) | set(self.expected))
        if keys:
            lines += ["", "| | observed | expected |", "|---|---|---|"]
            lines += [f"| {k} | {self.observed.get(k, '')} | {self.expected.get(k, '')} |" for k in keys]
        return "\n".join(lines)
