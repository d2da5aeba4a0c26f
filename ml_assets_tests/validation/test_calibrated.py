"""Calibrated drift limits (``ml-assets calibrate``): fitted on a real series' own history, written
beside the spec, refused when they no longer fit it, and used by the snapshot's drift check and the
fast replay alike. The series: Seattle's daily weather (vega_datasets), one row a day.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ml_assets.ingest.sources import ROWS, read_day, read_range
from ml_assets.settings import load_settings
from ml_assets.spec import SpecError, load_spec
from ml_assets.spec.loading import without_calibration
from ml_assets.validation.calibrated import outcome
from ml_assets.validation.check_results import check_metadata
from ml_assets.validation.command import run_calibrate
from ml_assets.validation.names import DRIFT
from ml_assets.validation.replay import replay
from ml_assets.validation.run import gather_history, judge

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "daily_series"
START, END = "2012-01-01", "2013-12-31"


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(EXAMPLES / "seattle_rain.yaml", folder)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(folder))
    monkeypatch.setenv("ML_ASSETS_HOME", str(tmp_path / "home"))
    return folder


def test_calibrate_writes_a_versioned_calibration_beside_the_spec_and_the_spec_reads_it(models, capsys):
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 0
    out = capsys.readouterr().out
    written = models / "seattle_rain.calibration.json"
    cal = load_spec(models / "seattle_rain.yaml").validation.calibration
    assert cal is not None and cal.version == json.loads(written.read_text())["version"] == cal.content_hash()
    assert (cal.start, cal.end, cal.target_rate, cal.days) == (dt.date(2012, 1, 1), dt.date(2013, 12, 31), 0.01, 731)
    assert cal.in_sample_rate <= cal.target_rate / 2
    # Per column: the limit, the variability it came from, and the history days it still blocks.
    assert "temp_max" in out and "natural variability" in out and "history days blocked" in out
    assert f"written to {written}" in out.splitlines()[-1]
    assert run_calibrate("seattle_rain", None, None, 0.01, True) == 0
    assert cal.version[:12] in capsys.readouterr().out
    assert not load_settings().version_store_root.exists()  # replayed in memory: no store, no main


@pytest.mark.parametrize("rate", [0.0, 0.25, -0.01])
def test_a_target_rate_outside_its_range_is_refused_and_nothing_is_written(models, capsys, rate):
    assert run_calibrate("seattle_rain", START, END, rate, False) == 2
    assert "outside (0, 0.2]" in capsys.readouterr().err
    assert not (models / "seattle_rain.calibration.json").exists()


def test_too_few_days_says_how_many_it_has_and_needs_and_writes_nothing(models, capsys):
    assert run_calibrate("seattle_rain", "2012-01-01", "2012-04-30", 0.01, False) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "gives 121 day(s)" in err and "needs at least" in err and "Nothing was written" in err
    assert not (models / "seattle_rain.calibration.json").exists()


def test_a_range_with_gaps_says_what_it_has_and_writes_nothing(models, tmp_path, capsys):
    source = pl.read_csv(load_spec(models / "seattle_rain.yaml").source.rows.path)
    holed = source.filter(~pl.col("date").is_in([f"2013/03/{d:02d}" for d in range(10, 16)]))
    holed.write_csv(tmp_path / "weather.csv")
    spec = (models / "seattle_rain.yaml").read_text().replace(
        "package://vega_datasets/_data/seattle-weather.csv", str(tmp_path / "weather.csv"))
    (models / "seattle_rain.yaml").write_text(spec)
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 2
    err = capsys.readouterr().err
    assert "has gaps: 725 of its 731 days have rows" in err and "2013-03-10" in err and "longest gap 6 days" in err
    assert not (models / "seattle_rain.calibration.json").exists()


def test_a_calibration_for_another_schema_is_refused_at_load_naming_the_columns(models, capsys):
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 0
    spec = models / "seattle_rain.yaml"
    original = spec.read_text()
    spec.write_text(original.replace("wind: {dtype: float64, min: 0, max: 40}", "wind: {dtype: int64, min: 0}")
                    .replace("    weather: {dtype: string, after_event: true}\n", ""))
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert "made for another schema" in str(err.value)
    assert "weather (removed)" in str(err.value) and "wind (float64 -> int64)" in str(err.value)
    # calibrate again reads the spec without the old calibration: here the spec no longer fits the source
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "every day of the range fails the row checks" in err and "schema" in err and "Nothing was written" in err
    spec.write_text(original.replace("    weather: {dtype: string, after_event: true}\n", "    weather: {dtype: string}\n"))
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 0  # and replaces the old calibration
    assert load_spec(spec).validation.calibration.schema_ == {c: col.dtype for c, col in
                                                              load_spec(spec).data_schema.columns.items()}


def test_a_calibration_edited_by_hand_is_refused(models):
    assert run_calibrate("seattle_rain", START, END, 0.01, False) == 0
    written = models / "seattle_rain.calibration.json"
    data = json.loads(written.read_text())
    data["tests"][0]["limit"] = 1e9
    written.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="does not match its content"):
        load_spec(models / "seattle_rain.yaml")


@pytest.fixture(scope="module")
def seattle():
    return load_spec(EXAMPLES / "seattle_rain.yaml")


def test_the_fast_replay_judges_each_day_as_the_snapshot_does(seattle):
    """The snapshot's path (each day's history gathered from what passed, the drift check on its own) and
    the replay vectorized over days give the same verdicts, a stuck sensor's blocked days included."""
    first, last = dt.date(2014, 3, 1), dt.date(2014, 5, 15)
    rows = read_range(seattle, dt.date(2013, 8, 1), last).rows
    stuck = rows.with_columns(pl.when(pl.col("__day") >= dt.date(2014, 4, 10)).then(12.5)
                              .otherwise(pl.col("temp_min")).alias("temp_min"))
    by_day = {k[0]: f for k, f in stuck.partition_by("__day", as_dict=True, include_key=False).items()}
    fast = list(replay(seattle, first, last, rows=stuck))
    slow = list(replay(seattle, first, last, read=lambda spec, day: by_day[day]))
    assert [(v.day, v.passed, sorted(v.failed)) for v in fast] == [(v.day, v.passed, sorted(v.failed)) for v in slow]
    assert all(v.passed for v in fast if dt.date(2014, 3, 20) <= v.day < dt.date(2014, 4, 10))
    runs = [v for v in fast if not v.passed and "temp_min: run: the same value" in v.failed[DRIFT]]
    # Its run of equal values on main passes the history's longest within a week (a day blocked for
    # another reason is not on main, and its value does not count)...
    assert dt.date(2014, 4, 10) <= runs[0].day <= dt.date(2014, 4, 16)
    assert [v.day for v in runs] == [v.day for v in fast if v.day >= runs[0].day]  # and stays blocked


def test_a_blocked_day_names_the_column_its_limit_and_what_it_was_compared_with(seattle):
    """The check result Dagster shows for a day whose maximum temperature reads in Fahrenheit and stays
    within the range check (a winter day)."""
    day = dt.date(2014, 1, 20)
    published = {d: read_day(seattle, d).tables[ROWS] for d in (day - dt.timedelta(days=n) for n in range(1, 120))}
    rows = read_day(seattle, day).tables[ROWS].with_columns(pl.col("temp_max") * 1.8 + 32 - 20)
    verdict = judge(seattle, rows, day, *gather_history(seattle, day, published.get))
    drift = next(o for o in verdict.outcomes if o.name == DRIFT)
    assert not drift.passed
    first = drift.summary.split("; ")[0]  # the test furthest past its limit comes first
    assert first.startswith("temp_max: mean") and "limit" in first and "2012-01-01..2013-12-31" in first
    # what it was compared with: its recent days on main, or the other columns as they related
    assert "the median of the days on main 2013-" in first or "as related on" in first
    metadata = check_metadata(drift, "repo", "branch", "commit")
    assert "temp_max: mean" in metadata["summary"].value and metadata["failures"] >= 1
    assert seattle.validation.calibration.version[:12] in drift.observed["calibration"]


def test_the_snapshot_asset_shows_the_calibrated_limits_per_column(seattle):
    """The UI's asset page: the calibration's version, and a table of its limits per column and test."""
    from ml_assets.validation.assets import build_validated_snapshot

    cal = seattle.validation.calibration
    spec = next(iter(build_validated_snapshot(seattle).specs))
    assert cal.version[:12] in str(spec.metadata["calibration"])
    table = spec.metadata["calibrated_limits"]
    assert len(table.records) == len(cal.tests)
    by_test = {(r.data["column"], r.data["measure"], r.data["test"], r.data["window"]): r.data for r in table.records}
    test = next(t for t in cal.tests if t.signal == "temp_max:mean" and t.kind == "deviation" and t.window == 1)
    row = by_test[("temp_max", "mean", "deviation", 1)]
    assert row["limit"] == test.limit and row["blocked_days"] == len(test.blocked)
    assert f"daily sd {cal.signals['temp_max:mean'].scale:.4g}" in row["natural"]
    with without_calibration():
        uncalibrated = load_spec(EXAMPLES / "seattle_rain.yaml")
    assert "calibrated_limits" not in next(iter(build_validated_snapshot(uncalibrated).specs)).metadata


def test_a_day_without_enough_history_is_not_judged_and_says_so(seattle):
    cal = seattle.validation.calibration
    result = outcome(cal, dt.date(2014, 1, 1), np.full(len(cal.tests), np.nan))
    assert result.passed and result.summary.startswith("not judged")


@pytest.mark.parametrize("name, first, column", [
    ("seattle_rain", dt.date(2014, 6, 1), "temp_min"),
    ("melbourne_hot", dt.date(1987, 6, 1), "Min_Temp"),
    ("peyton_views", dt.date(2014, 9, 1), "y"),
])
def test_each_example_series_replays_held_out_days_quietly_and_blocks_a_stuck_column(name, first, column):
    """Each example's calibration was fitted on the series' first years; these days come after them."""
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    last = first + dt.timedelta(days=59)
    rows = read_range(spec, first - dt.timedelta(days=120), last).rows
    clean = [v for v in replay(spec, first, last, rows=rows) if not v.absent]
    assert sum(not v.passed for v in clean) <= 1
    break_day = first + dt.timedelta(days=30)
    value = rows.filter(pl.col("__day") == break_day)[column].item()
    stuck = rows.with_columns(pl.when(pl.col("__day") >= break_day).then(value).otherwise(pl.col(column)).alias(column))
    blocked = [v.day for v in replay(spec, break_day, last, rows=stuck) if column in v.failed.get(DRIFT, "")]
    # within the history's own longest runs of equal values (Seattle's temperatures repeat, rounded from °F)
    assert blocked and blocked[0] <= break_day + dt.timedelta(days=6)


@pytest.mark.parametrize("path, problem", [
    ("package://vega_datasets/../../etc/passwd", "lies outside the package"),
    ("package://no_such_package_here/data.csv", "is not installed"),
    ("package://vega-datasets/x.csv", "expected package://<package>/<file inside it>"),
    ("package://vega_datasets", "expected package://<package>/<file inside it>"),
])
def test_a_package_source_path_is_checked_before_anything_is_read(tmp_path, path, problem):
    text = (EXAMPLES / "seattle_rain.yaml").read_text().replace(
        "package://vega_datasets/_data/seattle-weather.csv", path)
    (tmp_path / "seattle_rain.yaml").write_text(text)
    with pytest.raises(SpecError, match="source path") as err:
        load_spec(tmp_path / "seattle_rain.yaml")
    assert problem in str(err.value)


def test_a_waiver_accepts_a_blocked_day_of_a_calibrated_spec(seattle):
    first, last = dt.date(2014, 4, 1), dt.date(2014, 4, 30)
    rows = read_range(seattle, dt.date(2013, 8, 1), last).rows
    broken = rows.with_columns(pl.when(pl.col("__day") == dt.date(2014, 4, 20)).then(pl.col("temp_max") + 12)
                               .otherwise(pl.col("temp_max")).alias("temp_max"))
    blocked = [v.day for v in replay(seattle, first, last, rows=broken) if not v.passed]
    assert dt.date(2014, 4, 20) in blocked
    data = seattle.model_dump(by_alias=True)
    data["validation"]["waivers"] = [{"day": "2014-04-20", "checks": ["drift"], "reason": "a heat record, checked by hand"}]
    waived = type(seattle).model_validate(data)
    day = next(v for v in replay(waived, first, last, rows=broken) if v.day == dt.date(2014, 4, 20))
    assert day.passed and day.waived == {"drift": "a heat record, checked by hand"}
