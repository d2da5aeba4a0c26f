"""One day's verdict in a replay of the snapshot's checks."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass
class DayVerdict:
    day: dt.date
    rows: int
    failed: dict[str, str] = field(default_factory=dict)  # check name -> its summary
    quarantined: int = 0
    waived: dict[str, str] = field(default_factory=dict)  # check name -> the waiver's reason
    warned: dict[str, str] = field(default_factory=dict)  # severity-warn check name -> its summary
    absent: str | None = None
    """Why the source could not give the day (then nothing was judged), or None."""

    @property
    def passed(self) -> bool:
        """No blocking check failed (an absent day fails none: it was never judged)."""
        return not self.failed

    def as_dict(self) -> dict:
        return {"day": self.day.isoformat(), "rows": self.rows, "passed": self.passed, "absent": self.absent,
                "quarantined": self.quarantined, "failed": self.failed, "warned": self.warned, "waived": self.waived}
