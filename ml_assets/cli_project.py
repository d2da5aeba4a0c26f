"""The ``ml-assets`` commands that set up and feed a project: where everything lives (``paths``), the
editors' schemas (``schema``), the Dagster instance's configuration (``instance``) and a window of
days ingested (``backfill``). ml_assets.cli parses the command line and calls these."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from ml_assets.settings import load_settings


def add_parsers(sub: argparse._SubParsersAction) -> None:
    fill = sub.add_parser("backfill", help="ingest, validate and featurize a window of days (one run per day, "
                          "in this process); days already published are skipped")
    fill.add_argument("model")
    fill.add_argument("--start", required=True, help="first day (YYYY-MM-DD)")
    fill.add_argument("--end", required=True, help="last day (YYYY-MM-DD)")
    fill.add_argument("--force", action="store_true", help="run the days already published again")
    sub.add_parser("paths", help="print where the local home keeps everything")
    sch = sub.add_parser("schema", help="write the spec's JSON schemas (for editors) to a folder")
    sch.add_argument("--output", help="the folder (default: schema/ in the project, else here)")
    ins = sub.add_parser("instance", help="write the package's Dagster instance configuration to $DAGSTER_HOME")
    ins.add_argument("--production", action="store_true", help="the production instance (PostgreSQL, run queue)")
    ins.add_argument("--force", action="store_true", help="replace an existing dagster.yaml")


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "backfill":
        return backfill(args.model, args.start, args.end, args.force)
    if args.command == "schema":
        return schema(args.output)
    if args.command == "instance":
        return instance(args.production, args.force)
    return paths()


def refuse(command: str, message: str) -> int:
    """Say why a command cannot run (exit status 2: a bad model name, version or input)."""
    print(f"ml-assets {command}: {message}", file=sys.stderr)
    return 2


def paths() -> int:
    settings = load_settings()
    from ml_assets.settings import public_url

    print(f"{'environment':20} {settings.environment}")
    print(f"{'project':20} {settings.project.root if settings.project else '(none: not inside a Dagster project)'}")
    print(f"{'home':20} {settings.home}")
    print(f"{'dagster_home':20} {os.environ.get('DAGSTER_HOME') or settings.dagster_home}"
          + ("" if os.environ.get("DAGSTER_HOME") else "  (used by ml-assets; export DAGSTER_HOME for dg and dagster)"))
    for name in ("version_store_root", "artifacts_location", "checkpoints_location"):
        print(f"{name:20} {getattr(settings, name)}")
    if settings.objects_url:
        print(f"{'objects_url':20} {settings.objects_url}")
    print(f"{'mlflow_tracking_uri':20} {public_url(settings.mlflow_tracking_uri)}")
    return 0


def backfill(model: str, start: str, end: str, force: bool) -> int:
    from ml_assets import runs
    from ml_assets.model_files import load_declared_spec
    from ml_assets.names import InvalidName, check_model_name
    from ml_assets.spec import SpecError

    settings = load_settings()
    try:
        spec = load_declared_spec(settings, check_model_name(model))
        return runs.backfill(settings, spec, dt.date.fromisoformat(start), dt.date.fromisoformat(end), force)
    except (SpecError, InvalidName, ValueError) as exc:
        return refuse("backfill", str(exc))


def schema(output: str | None) -> int:
    from ml_assets.spec_schema import write

    settings = load_settings()
    base = settings.project.root if settings.project else Path.cwd()
    for path in write(Path(output) if output else base / "schema"):
        print(f"wrote {path}")
    print("Point a spec at it with its first line, e.g. `# yaml-language-server: $schema=<relative path>/"
          "model-component.schema.json` (docs/components.md)")
    return 0


def instance(production: bool, force: bool) -> int:
    """Write the package's Dagster instance configuration to $DAGSTER_HOME/dagster.yaml."""
    from ml_assets.instance import LOCAL_INSTANCE, PRODUCTION_INSTANCE

    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return refuse("instance", "DAGSTER_HOME is not set: export it first (the folder Dagster keeps its runs in)")
    target = Path(home) / "dagster.yaml"
    if target.exists() and not force:
        return refuse("instance", f"{target} exists: --force replaces it")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((PRODUCTION_INSTANCE if production else LOCAL_INSTANCE).read_bytes())
    print(f"wrote {target}" + ("; next: dagster instance migrate (docs/deployment.md)" if production else ""))
    return 0


