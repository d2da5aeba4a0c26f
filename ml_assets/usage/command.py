"""``ml-assets usage``: its arguments, its input checked before anything is read, then what was spent,
collected and printed. ml_assets.cli adds the parser and calls ``usage``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from pathlib import Path

from ml_assets.cli_project import refuse
from ml_assets.names import InvalidName, check_model_name, check_team_name
from ml_assets.settings import load_settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    spent = sub.add_parser("usage", help="what each team spent: its trainings (split by decision: full, fine_tune, "
                           "skip), tuning trials and scoring runs, with their CPU and GPU rank-seconds, wall time and "
                           "training samples, from the records (reads only)")
    spent.add_argument("--team", help="one team (default: every team)")
    spent.add_argument("--model", help="one model (default: every declared model)")
    spent.add_argument("--since", metavar="DAY", help="only what finished on or after DAY (YYYY-MM-DD, from 00:00 UTC)")
    spent.add_argument("--format", choices=("table", "json"), default="table")


class UsageError(ValueError):
    """A query this home cannot answer as asked: the message names what it knows."""


def parse_since(value: str | None) -> dt.date | None:
    """``--since``: a day, YYYY-MM-DD, taken as its start in UTC."""
    if value is None:
        return None
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        day = None
    if day is None or day.isoformat() != value:
        raise UsageError(f"--since {value!r} is not a day: give it as YYYY-MM-DD (UTC), e.g. 2013-02-01")
    return day


def usage(team: str | None, model: str | None, since: str | None, fmt: str) -> int:
    """Print what each team spent; 2 (naming what is known) for an unknown team or model or a bad day."""
    from ml_assets.model_files import load_declared_specs, select_specs
    from ml_assets.spec import SpecError

    settings = load_settings()
    try:
        day = parse_since(since)
        if team is not None:
            check_team_name(team)
        if model is not None:
            check_model_name(model)
        declared = load_declared_specs(settings)
        specs = select_specs(declared, model)
    except (UsageError, InvalidName, SpecError) as exc:
        return refuse("usage", str(exc))
    # Dagster only now: a bad query is refused at once.
    from ml_assets.usage.collect import collect, open_instance
    from ml_assets.usage.report import render, summarize

    instance = open_instance(Path(os.environ.get("DAGSTER_HOME") or settings.dagster_home))
    start = dt.datetime.combine(day, dt.time(), dt.UTC) if day else None
    try:
        items = collect(instance, specs, start) if instance is not None else []
    finally:
        if instance is not None:
            instance.dispose()
    if team is not None:
        known = sorted({*settings.teams, *(s.team for s in declared), *(i.team for i in items)})
        if team not in known:
            return refuse("usage", f"no team {team!r} is known here; known teams: {', '.join(known)}")
        items = [i for i in items if i.team == team]
    document = summarize(items, day, team, model)
    print(json.dumps(document, indent=1) + "\n" if fmt == "json" else render(document), end="")
    return 0
