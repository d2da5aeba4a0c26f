"""``ml-assets verify [MODEL] [--repair] [--json]``: prove each declared model's stores whole (or one
model's), and with ``--repair`` rebuild what was lost from its sources and records, then check again.

Exit status: 0 whole (after a repair: whole again), 1 problems remain (each printed with what depends
on it; the last line says what to do), 2 a bad model name."""

from __future__ import annotations

import argparse
import json
import sys

from ml_assets.cli_project import refuse
from ml_assets.names import InvalidName
from ml_assets.settings import load_settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    verify = sub.add_parser("verify", help="check that every object of main's history, every registered version "
                            "and every alias is whole; --repair rebuilds what was lost")
    verify.add_argument("model", nargs="?", help="one model (default: every declared model)")
    verify.add_argument("--repair", action="store_true", help="re-ingest the days and retrain the versions whose "
                        "bytes were lost (written back only when bit for bit the same); moves no alias")
    verify.add_argument("--json", action="store_true", help="print the reports as JSON")


def verify(model: str | None, repair: bool, as_json: bool, client_of, store_of) -> int:
    from ml_assets.model_files import declared_models
    from ml_assets.spec import SpecError
    from ml_assets.verification.check import check

    settings = load_settings()
    try:
        specs = declared_models(settings, model)
    except (InvalidName, SpecError) as exc:
        return refuse("verify", str(exc))
    client, store = client_of(settings), store_of(settings)
    reports, repairs = [], {}
    for spec in specs:
        report = check(client, store, spec.name)
        if repair and not report.whole:
            from ml_assets.verification.repair import repair as rebuild

            print(_render(report), flush=True)
            repairs[spec.name] = rebuild(settings, spec, client, store, report, settings.home / "repair")
            report = check(client, store, spec.name)
        reports.append(report)
    if as_json:
        print(json.dumps([{**r.as_dict(), "repaired": repairs.get(r.model)} for r in reports], indent=1))
    for report in reports:
        if not as_json:
            for line in repairs.get(report.model, []):
                print(f"repair: {line}")
            print(_render(report), file=sys.stdout if report.whole else sys.stderr)
    broken = [r for r in reports if not r.whole]
    if broken:
        advice = ("what remains could not be rebuilt bit for bit (see above)" if repair else
                  "`ml-assets verify --repair` rebuilds what its sources and records can")
        print(f"ml-assets verify: {sum(len(r.findings) for r in broken)} problem(s) in "
              f"{', '.join(r.model for r in broken)}: {advice}", file=sys.stderr)
        return 1
    return 0


def _render(report) -> str:
    lines = [report.summary()]
    lines += [f"  PROBLEM {f.line()}" for f in report.findings]
    lines += [f"  note: {f.line()} (a source is not the platform's to keep: a rebuild from it cannot be bit for bit)"
              for f in report.notes]
    return "\n".join(lines)
