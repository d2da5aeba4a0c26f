"""The replay over days of a files source where one day's file is missing: that day is absent (a gap in
the history, as on main), and the replay goes on; `ml-assets replay-checks` says so."""

import copy
import datetime as dt

import pytest

from ml_assets.spec import ModelSpec
from ml_assets.validation.command import replay_checks
from ml_assets.validation.replay import replay
from ml_assets_tests.helpers import flights_files, write_spec

FIRST = dt.date(2013, 6, 1)
DAYS = [FIRST + dt.timedelta(days=n) for n in range(10)]
MISSING = dt.date(2013, 6, 6)


@pytest.fixture(scope="module")
def spec_data(tmp_path_factory, bundled_spec_dict) -> dict:
    root = tmp_path_factory.mktemp("replay")
    data = copy.deepcopy(bundled_spec_dict)
    data["source"] = flights_files(root / "data", DAYS)
    data["partitioning"]["start"] = FIRST.isoformat()
    (root / "data" / "flights" / f"{MISSING}.parquet").unlink()
    return data


def test_a_missing_day_is_reported_absent_and_the_replay_goes_on(spec_data):
    verdicts = list(replay(ModelSpec.model_validate(spec_data), FIRST, DAYS[-1]))
    assert [v.day for v in verdicts] == DAYS
    absent = {v.day: v.absent for v in verdicts if v.absent}
    assert list(absent) == [MISSING] and "no parquet files match" in absent[MISSING]
    assert all(v.passed and v.rows > 700 for v in verdicts if v.day != MISSING)
    assert next(v for v in verdicts if v.day == MISSING).as_dict()["absent"] == absent[MISSING]


def test_the_cli_prints_the_gap_and_counts_judged_days(spec_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(write_spec(tmp_path / "models", spec_data).parent))
    assert replay_checks("flights_delay", FIRST.isoformat(), DAYS[-1].isoformat(), False, False) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"gap  {MISSING}  absent: source.rows: no parquet files match") for line in out)
    assert out[-1] == "0 of 9 days fail (0.0%); 1 day(s) absent from the source, not judged"


def test_the_cli_refuses_a_source_with_no_readable_day(spec_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(write_spec(tmp_path / "models", spec_data).parent))
    assert replay_checks("flights_delay", MISSING.isoformat(), MISSING.isoformat(), False, False) == 2
    assert "no day could be read from the source: source.rows: no parquet files match" in capsys.readouterr().err
