"""Seasonal columns: a real daily weather series replayed with the one-row-a-day recipe of
docs/bring-your-own-data.md. Its temperatures follow the season, which the weeks just before a
window never show; judged against the same weeks of earlier years, a season passes and a break
(a sensor that reads 6 degrees high) still fails.

The series: Seattle's daily weather, 2012-2015 (1,461 days, one row a day), as the vega_datasets
package on PyPI ships it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from pathlib import Path

import polars as pl
import pytest
import yaml

from ml_assets.ingest.sources import ROWS, read_day
from ml_assets.spec import SpecError, load_spec
from ml_assets.validation.drift import drift_check
from ml_assets.validation.replay import replay

pytestmark = pytest.mark.slow

BREAK = dt.date(2015, 6, 1)


def seattle_weather() -> Path:
    found = importlib.util.find_spec("vega_datasets")
    assert found is not None and found.submodule_search_locations, "pip install vega_datasets (a dev dependency)"
    return Path(next(iter(found.submodule_search_locations))) / "_data" / "seattle-weather.csv"


def recipe(seasonal: dict | None = None) -> dict:
    """docs/bring-your-own-data.md's one row a day, on the series."""
    drift = {"current_days": 35, "reference_days": 140, "min_reference_days": 28}
    return {
        "name": "seattle_rain", "description": "Will it rain in Seattle today?", "owner": "weather",
        "source": {"kind": "files", "rows": {"path": str(seattle_weather()), "format": "csv"}},
        "schema": {"keys": ["date"], "columns": {
            "date": {"dtype": "string"}, "precipitation": {"dtype": "float64", "min": 0, "after_event": True},
            "temp_max": {"dtype": "float64", "min": -30, "max": 50}, "temp_min": {"dtype": "float64", "min": -30, "max": 50},
            "wind": {"dtype": "float64", "min": 0, "max": 40}, "weather": {"dtype": "string", "after_event": True}}},
        "partitioning": {"start": "2012-01-01", "end": "2015-12-31", "timezone": "UTC", "timestamp_column": "date",
                         "timestamp_format": "%Y/%m/%d"},
        "target": {"name": "rain", "expression": "precipitation > 0", "task": "binary_classification"},
        "features": {"numeric": ["temp_max", "temp_min", "wind"]},
        "validation": {"volume": {"min_rows": 1}, "drift": {**drift, **({"seasonal": seasonal} if seasonal else {})}},
        "model": {"hidden_sizes": [16]},
        "training": {"window_days": 150, "validation_days": 30, "min_validation_rows": 30, "batch_size": 16},
        "evaluation": {"metrics": ["roc_auc", "log_loss"], "test_days": 30, "min_test_rows": 30},
        "promotion": {"primary_metric": "roc_auc"},
    }


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "seattle_rain.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_season_passes_and_a_break_fails_on_a_real_daily_series(tmp_path):
    spec = load_spec(write(tmp_path, recipe({"columns": ["temp_max", "temp_min", "wind"]})))

    def read(s, day: dt.date) -> pl.DataFrame:
        rows = read_day(s, day).tables[ROWS]
        if day < BREAK:
            return rows
        return rows.with_columns(pl.col("temp_max") + 6.0, pl.col("temp_min") + 6.0)  # a sensor reading high

    verdicts = list(replay(spec, dt.date(2012, 1, 1), dt.date(2015, 12, 31), read=read))
    clean = [v for v in verdicts if v.day < BREAK]
    flagged = [v for v in clean if not v.passed]
    assert len(clean) == 1247 and len(flagged) / len(clean) <= 0.03, [(v.day, v.failed) for v in flagged]
    first = next(v for v in verdicts if v.day >= BREAK and not v.passed)
    # The window pools 35 days of one row: the broken days must outweigh the sound ones in it.
    assert (first.day - BREAK).days <= 21 and "temp_" in first.failed["drift"], first.failed


def test_without_a_year_on_main_a_seasonal_column_is_not_judged_and_says_why(tmp_path):
    spec = load_spec(write(tmp_path, recipe({"columns": ["temp_max", "temp_min"]})))
    day = dt.date(2012, 6, 1)
    rows = {d: read_day(spec, d).tables[ROWS] for d in (day - dt.timedelta(days=n) for n in range(175))}
    dated = {d: f.with_columns(pl.lit(d).alias("__day")) for d, f in rows.items()}
    start = day - dt.timedelta(days=34)
    reference = pl.concat([f for d, f in dated.items() if d < start])
    earlier = pl.concat([f for d, f in dated.items() if start <= d < day])
    outcome = drift_check(spec, rows[day], reference, earlier, day, seasonal=None)
    for column in ("temp_max", "temp_min"):
        why = outcome.observed["not judged"][column]
        assert why.startswith("seasonal: no earlier period (2011-04-16..2011-06-17, 2010-04-17..") and "28 days on main yet" in why
    assert "wind ks" in outcome.observed  # the other columns are judged against the weeks before


def test_seasonal_columns_are_drift_columns_and_the_period_spans_the_window(tmp_path):
    with pytest.raises(SpecError, match=r"validation.drift.seasonal.columns: \['weather'\] are not drift columns"):
        load_spec(write(tmp_path, recipe({"columns": ["weather"]})))
    with pytest.raises(SpecError, match=r"seasonal.period_days \(7\) is shorter than the current window"):
        load_spec(write(tmp_path, recipe({"columns": ["wind"], "period_days": 7})))
