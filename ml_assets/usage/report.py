"""Adding up what was spent, per team, model and kind of work, and the trainings per decision (full,
fine_tune, skip); the table and the JSON document ``ml-assets usage`` prints (its fields:
docs/operations.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ml_assets.usage.record import DECISIONS, WORK, Spent

FORMAT_VERSION = 1
"""The JSON document's ``version``: it changes only when a field changes meaning or goes away."""
SECONDS = ("cpu_rank_seconds", "gpu_rank_seconds", "wall_seconds")
BY_DECISION = "training_by_decision"
"""The JSON field of a model's, a team's and everyone's trainings split by decision."""


@dataclass
class Totals:
    """What some pieces of work held, added up; ``unmeasured`` of them are counted without seconds.
    ``samples_processed``: None while none of them measured it (trials and scoring runs never do)."""

    count: int = 0
    unmeasured: int = 0
    cpu_rank_seconds: float = 0.0
    gpu_rank_seconds: float = 0.0
    wall_seconds: float = 0.0
    samples_processed: int | None = None

    def add(self, item: Spent) -> None:
        self.count += 1
        if item.samples_processed is not None:
            self.samples_processed = (self.samples_processed or 0) + item.samples_processed
        if item.wall_seconds is None:
            self.unmeasured += 1
            return
        for name in SECONDS:
            setattr(self, name, getattr(self, name) + (getattr(item, name) or 0.0))

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "unmeasured": self.unmeasured,
                **{name: round(getattr(self, name), 3) for name in SECONDS},
                "samples_processed": self.samples_processed}


def _split() -> dict[str, Totals]:
    return {d: Totals() for d in DECISIONS}


def summarize(items: Sequence[Spent], since: dt.date | None = None, team: str | None = None,
              model: str | None = None) -> dict[str, Any]:
    """The JSON document: per team, per model, per kind of work (the trainings also per decision),
    with totals, then every item."""
    teams: dict[str, dict[str, dict[str, Totals]]] = {}
    splits: dict[tuple[str, str], dict[str, Totals]] = {}
    team_totals: dict[str, Totals] = {}
    total, total_split = Totals(), _split()
    for item in items:
        kinds = teams.setdefault(item.team, {}).setdefault(item.model, {w: Totals() for w in (*WORK, "total")})
        for totals in (kinds[item.work], kinds["total"], team_totals.setdefault(item.team, Totals()), total):
            totals.add(item)
        if item.work == "training":
            for split in (splits.setdefault((item.team, item.model), _split()),
                          splits.setdefault((item.team, ""), _split()), total_split):
                split[item.decision or "full"].add(item)
    return {
        "version": FORMAT_VERSION,
        "since": since.isoformat() if since else None, "team": team, "model": model,
        "teams": [{"team": name, "total": team_totals[name].as_dict(),
                   BY_DECISION: _as_dicts(splits.get((name, ""))),
                   "models": [{"model": m, **{w: t.as_dict() for w, t in kinds.items()},
                               BY_DECISION: _as_dicts(splits.get((name, m)))}
                              for m, kinds in sorted(models.items())]}
                  for name, models in sorted(teams.items())],
        "total": total.as_dict(), BY_DECISION: _as_dicts(total_split),
        "items": [item.as_dict() for item in sorted(items, key=lambda i: (i.team, i.model, i.finished, i.ref))],
    }


def _as_dicts(split: dict[str, Totals] | None) -> dict[str, dict[str, Any]]:
    return {d: t.as_dict() for d, t in (split or _split()).items()}


HEADER = ("TEAM", "MODEL", "WORK", "COUNT", "CPU RANK-S", "GPU RANK-S", "WALL S", "SAMPLES")


def render(document: dict[str, Any]) -> str:
    """The document as a table: a row per team, model and kind of work done (the trainings then per
    decision), a total per team, and notes on what the rows leave out."""
    rows: list[tuple[str, ...]] = []
    for team in document["teams"]:
        for entry in team["models"]:
            for work in (w for w in WORK if entry[w]["count"]):
                rows.append(_row(team["team"], entry["model"], work, entry[work]))
                if work == "training":
                    rows += [_row(team["team"], entry["model"], f"training: {d}", t)
                             for d, t in entry[BY_DECISION].items() if t["count"]]
        rows.append(_row(team["team"], "(all models)", "total", team["total"]))
    if len(document["teams"]) > 1:
        rows.append(_row("(all teams)", "", "total", document["total"]))
    since = f" finished since {document['since']} 00:00 UTC" if document["since"] else ""
    if not document["teams"]:
        return f"no trainings, tuning trials or scoring runs{since} are recorded here\n"
    widths = [max(len(r[i]) for r in (HEADER, *rows)) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in (HEADER, *rows)]
    return "\n".join([*lines, "", *_notes(document, since)]) + "\n"


def _notes(document: dict[str, Any], since: str) -> list[str]:
    notes = [f"counted: the trainings, tuning trials and scoring runs{since}; RANK-S: the seconds each process "
             "(rank) held a CPU or a GPU, added up",
             "training: full, fine_tune, skip: the trainings by their decision (training.warm_start; recorded "
             "before decisions: full); a skipped partition trained nothing and spent nothing; SAMPLES: the "
             "training rows they stepped through, over ranks and epochs"]
    unmeasured = document["total"]["unmeasured"]
    if unmeasured:
        notes.append(f"{unmeasured} counted without seconds: recorded before seconds were measured, a trial whose "
                     "worker died, or a run not finished yet")
    no_samples = sum(i["work"] == "training" and i["samples_processed"] is None for i in document["items"])
    if no_samples:
        notes.append(f"{no_samples} training(s) counted without samples: recorded before samples were measured")
    return notes


def _row(team: str, model: str, work: str, totals: dict[str, Any]) -> tuple[str, ...]:
    samples = totals["samples_processed"]
    return (team, model, work, str(totals["count"]), *(f"{totals[name]:,.1f}" for name in SECONDS),
            "-" if samples is None else f"{samples:,}")
