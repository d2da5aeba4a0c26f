"""``ml-assets replay-checks`` and ``ml-assets calibrate``: the snapshot's checks over a source's past
days, in memory, and the limits fitted on them.

    ml-assets calibrate MODEL --start D --end D [--target-rate 0.01]    fit and write the calibration
    ml-assets calibrate MODEL --show                                     print the calibration in use
    ml-assets replay-checks MODEL --start D --end D [--json] [--ignore-waivers]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ml_assets.names import InvalidName, check_model_name
from ml_assets.settings import load_settings

if TYPE_CHECKING:
    from ml_assets.spec.calibration import Calibration

# polars, pandera and scipy load when a command runs, not with every ml-assets command.


def add_parsers(sub: argparse._SubParsersAction) -> None:
    replay_ = sub.add_parser("replay-checks", help="run the snapshot's checks over a range of source days, in memory")
    replay_.add_argument("model")
    replay_.add_argument("--start", required=True, help="first day (YYYY-MM-DD)")
    replay_.add_argument("--end", required=True, help="last day (YYYY-MM-DD)")
    replay_.add_argument("--json", action="store_true", help="print every day's verdict as JSON")
    replay_.add_argument("--ignore-waivers", action="store_true", help="judge as if the spec waived nothing")
    cal = sub.add_parser("calibrate", help="fit the drift limits on the source's own history (the first step for a "
                         "new source)")
    cal.add_argument("model")
    cal.add_argument("--start", help="first day of the history (YYYY-MM-DD)")
    cal.add_argument("--end", help="last day of the history (YYYY-MM-DD)")
    cal.add_argument("--target-rate", type=float, default=0.01,
                     help="the share of ordinary days the checks may block, in (0, 0.2] (default 0.01)")
    cal.add_argument("--show", action="store_true", help="print the calibration in use; fit nothing")


def dispatch(args: argparse.Namespace) -> int | None:
    if args.command == "replay-checks":
        return replay_checks(args.model, args.start, args.end, args.json, args.ignore_waivers)
    if args.command == "calibrate":
        return run_calibrate(args.model, args.start, args.end, args.target_rate, args.show)
    return None


def _fail(command: str, message: str, code: int = 2) -> int:
    print(f"ml-assets {command}: {message}", file=sys.stderr)
    return code


def run_calibrate(model: str, start: str | None, end: str | None, target_rate: float, show: bool) -> int:
    """Exit 0 with the calibration written beside the spec, 2 when it cannot be made (nothing written)."""
    from ml_assets.ingest import sources
    from ml_assets.ingest.sources import SourceError, read_range
    from ml_assets.model_files import declared_spec_path, load_declared_spec
    from ml_assets.spec import SpecError
    from ml_assets.spec.loading import calibration_path, without_calibration
    from ml_assets.validation.calibrate import CalibrationError, calibrate, check_range
    from ml_assets.validation.label_drift import DAY
    from ml_assets.validation.report import calibration_report

    settings = load_settings()
    sources.use_cache(settings.home / "cache")
    try:
        name = check_model_name(model)
        if show:
            spec = load_declared_spec(settings, name)
            if spec.validation.calibration is None:
                return _fail("calibrate", f"model {name} has no calibration: run ml-assets calibrate {name} --start "
                             "D --end D", 1)
            print(calibration_report(spec.validation.calibration, calibration_path(declared_spec_path(settings, name))))
            return 0
        if not (start and end):
            raise ValueError("--start and --end are required (the history to calibrate on), or --show")
        with without_calibration():
            spec = load_declared_spec(settings, name)
        path = calibration_path(declared_spec_path(settings, name))
        first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
        if last < first:
            raise ValueError(f"--end {last} is before --start {first}")
        check_range(spec, first, last, {first + dt.timedelta(days=i) for i in range((last - first).days + 1)},
                    target_rate)  # the target rate and the range's length, before anything is read
        print(f"reading {spec.name}'s source from {first} to {last} ...", flush=True)
        read = read_range(spec, first, last)
        rows = read.rows
        given = set(rows[DAY].unique().to_list()) - set(read.absent) if rows.height else set()
        missing = check_range(spec, first, last, given, target_rate)
        rows = _without_broken_days(spec, rows)
        began = time.monotonic()
        cal = calibrate(spec, rows, first, last, missing, target_rate, say=lambda line: print(line, flush=True))
        type(spec).model_validate({**spec.model_dump(by_alias=True),
                                   "validation": {**spec.validation.model_dump(by_alias=True), "calibration": cal}})
    except (SpecError, InvalidName, ValueError, SourceError, CalibrationError) as exc:
        return _fail("calibrate", str(exc))
    _write(path, cal)
    print(calibration_report(cal, path))
    print(f"calibrated in {time.monotonic() - began:.1f} s; written to {path} (version {cal.version[:12]}); the drift "
          f"check now judges {spec.name} with these limits")
    return 0


def _without_broken_days(spec, rows):
    """The history less the days whose rows fail the row checks: the snapshot would keep them from main."""
    import polars as pl

    from ml_assets.validation.calibrate import CalibrationError
    from ml_assets.validation.fast_replay import valid_days
    from ml_assets.validation.label_drift import DAY
    from ml_assets.validation.schema_checks import schema_checks

    by_day = {k[0]: f for k, f in rows.partition_by(DAY, as_dict=True, include_key=False).items()} if rows.height else {}
    valid = valid_days(spec, by_day)
    failed = {d: [o for o in schema_checks(spec.data_schema, by_day[d]).values() if not o.passed]
              for d in sorted(set(by_day) - valid)}
    broken = [d for d, outcomes in failed.items() if outcomes]
    if broken and len(broken) == len(by_day):
        first = broken[0]
        raise CalibrationError(f"{spec.name}: every day of the range fails the row checks, so none would reach main "
                               f"({first}: {'; '.join(f'{o.name}: {o.summary}' for o in failed[first])}): the spec "
                               "does not fit the source. Nothing was written.")
    if broken:
        shown = ", ".join(str(d) for d in broken[:5]) + (" ..." if len(broken) > 5 else "")
        print(f"{len(broken)} day(s) fail the row checks and are left out of the history, as the snapshot would keep "
              f"them from main: {shown}", flush=True)
    return rows.filter(~pl.col(DAY).is_in(broken)) if broken else rows


def _write(path: Path, cal: Calibration) -> None:
    """Atomically: a reader sees the old calibration or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cal.model_dump(mode="json", by_alias=True), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def replay_checks(model: str, start: str, end: str, as_json: bool, ignore_waivers: bool) -> int:
    """Exit 0 when every day passes, 1 when some fail, 2 on a bad model or date."""
    from ml_assets.ingest import sources
    from ml_assets.ingest.sources import SourceError
    from ml_assets.model_files import load_declared_spec
    from ml_assets.spec import SpecError
    from ml_assets.validation.replay import replay

    settings = load_settings()
    sources.use_cache(settings.home / "cache")
    try:
        spec = load_declared_spec(settings, check_model_name(model))
        first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
        if last < first:
            raise ValueError(f"--end {last} is before --start {first}")
    except (SpecError, InvalidName, ValueError) as exc:
        return _fail("replay-checks", str(exc))
    verdicts, began, said = [], time.monotonic(), time.monotonic()
    total = (last - first).days + 1
    try:
        for verdict in replay(spec, first, last, ignore_waivers=ignore_waivers):
            verdicts.append(verdict)
            if not as_json:
                _print_day(verdict)
            if time.monotonic() - said >= 5 or len(verdicts) == total:
                said = time.monotonic()
                blocked = sum(not v.passed for v in verdicts)
                print(f"... {len(verdicts)} of {total} days replayed ({len(verdicts) / max(said - began, 1e-9):.0f} "
                      f"days/s), {blocked} blocked so far", file=sys.stderr, flush=True)
    except SourceError as exc:
        return _fail("replay-checks", str(exc))
    judged = [v for v in verdicts if not v.absent]
    if verdicts and not judged:  # not a gap: the source itself cannot be read (a path or table is wrong)
        return _fail("replay-checks", f"no day could be read from the source: {verdicts[0].absent}")
    failed = [v for v in judged if not v.passed]
    if as_json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=2))
    else:
        absent = len(verdicts) - len(judged)
        print(f"{len(failed)} of {len(judged)} days fail ({len(failed) / max(len(judged), 1):.1%})"
              + (f"; {absent} day(s) absent from the source, not judged" if absent else ""))
    return 1 if failed else 0


def _print_day(verdict) -> None:
    if verdict.absent:
        print(f"gap  {verdict.day}  absent: {verdict.absent}", flush=True)
        return
    state = "ok  " if verdict.passed else "FAIL"
    extra = f", {verdict.quarantined} quarantined" if verdict.quarantined else ""
    extra += "".join(f"; {name} failed, waived: {why}" for name, why in verdict.waived.items())
    print(f"{state} {verdict.day} {verdict.rows:>7} rows{extra}", flush=True)
    for name, summary in verdict.failed.items():
        print(f"       {name}: {summary}", flush=True)
    for name, summary in verdict.warned.items():
        print(f"       {name} (warn): {summary}", flush=True)
