"""``ml-assets status [MODEL]``: for every declared model (or one), its champion's version and age,
the last training decision, the last refusal, the days since the last full training and the compute
of the last 7 partitions (ml_assets.promotion.freshness). Reads only."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ml_assets.cli_project import refuse
from ml_assets.names import InvalidName
from ml_assets.settings import load_settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser("status", help="each model's champion and its age, the last decision and refusal, the "
                            "days since a full training, the compute of the last 7 days (reads only)")
    status.add_argument("model", nargs="?", help="one model (default: every declared model)")
    status.add_argument("--format", choices=("table", "json"), default="table")


def status(model: str | None, fmt: str, client_of, store_of) -> int:
    """Print each model's freshness; 2 (naming the known models) for an unknown or bad name.
    ``client_of``/``store_of``: the MLflow client and the version store for the settings (as the
    other commands make them)."""
    from ml_assets.model_files import declared_models
    from ml_assets.spec import SpecError

    settings = load_settings()
    try:
        specs = declared_models(settings, model)
    except (InvalidName, SpecError) as exc:
        return refuse("status", str(exc))
    from ml_assets.promotion.freshness import freshness, render
    from ml_assets.usage.collect import open_instance

    instance = open_instance(Path(os.environ.get("DAGSTER_HOME") or settings.dagster_home))
    if instance is None:
        print("[]" if fmt == "json" else "no Dagster instance here yet: nothing has run")
        return 0
    client, store = client_of(settings), store_of(settings)
    try:
        found = [freshness(instance, client, store, s.name) for s in specs]
    finally:
        instance.dispose()
    if fmt == "json":
        print(json.dumps([f.to_dict() for f in found], indent=1))
    else:
        print("\n".join(line for f in found for line in render(f)))
    return 0
