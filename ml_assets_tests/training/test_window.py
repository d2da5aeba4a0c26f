import datetime as dt

import polars as pl
import pytest

from ml_assets.spec import SpecError, load_spec, parse_spec
from ml_assets.training.window import (
    TooFewRows,
    WindowError,
    check_rows,
    training_window,
    without_missing,
)
from ml_assets_tests.helpers import BUNDLED_SPEC, model_spec, write_spec

DAY = dt.date(2013, 3, 15)


def test_window_trains_before_the_day_and_never_on_it():
    spec = load_spec(BUNDLED_SPEC)
    win = training_window(spec, DAY)
    width, val, tests = spec.training.window_days, spec.training.validation_days, spec.evaluation.test_days
    assert len(win.train_days) == width - val and len(win.val_days) == val
    assert win.train_days[0] == DAY - dt.timedelta(days=width + tests - 1)
    assert win.val_days[-1] == DAY - dt.timedelta(days=tests)
    assert win.test_days == tuple(DAY - dt.timedelta(days=k) for k in range(tests - 1, -1, -1))
    assert DAY not in win.fit_days and not set(win.val_days) & set(win.train_days)


def test_several_validation_and_test_days_never_overlap(spec_dict):
    spec = model_spec(spec_dict, training=dict(window_days=10, validation_days=3), evaluation={"test_days": 4})
    win = training_window(spec, DAY)
    assert win.test_days == tuple(DAY - dt.timedelta(days=k) for k in (3, 2, 1, 0))
    assert win.val_days == tuple(DAY - dt.timedelta(days=k) for k in (6, 5, 4))
    assert len(win.train_days) == 7 and win.train_days[-1] == DAY - dt.timedelta(days=7)
    assert "validate 2013-03-09..2013-03-11 (3 days), test 2013-03-12..2013-03-15 (4 days)" in win.describe()


def test_window_before_history_names_first_trainable_day(spec_dict):
    spec = model_spec(spec_dict, training=dict(window_days=14), evaluation={"test_days": 1})
    with pytest.raises(WindowError, match="the first trainable partition is 2013-01-15"):
        training_window(spec, dt.date(2013, 1, 5))
    assert training_window(spec, dt.date(2013, 1, 15)).train_days[0] == dt.date(2013, 1, 1)
    spec = model_spec(spec_dict, training=dict(window_days=14), evaluation={"test_days": 3})
    with pytest.raises(WindowError, match="the first trainable partition is 2013-01-17"):
        training_window(spec, dt.date(2013, 1, 16))


def test_missing_days_fail_by_default_naming_each_day_and_why(spec_dict):
    spec = model_spec(spec_dict, training=dict(window_days=5, warm_start=None))  # 2 training days: no fine-tune fits
    win = training_window(spec, DAY)
    gone = {DAY - dt.timedelta(days=3)}
    with pytest.raises(WindowError, match=r"2013-03-12: stopped by its checks.*training.missing_days: skip"):
        without_missing(spec, win, "fit", lambda d: d not in gone, lambda d: "stopped by its checks")


def test_skip_trains_on_the_rest_and_lists_the_skipped_days(spec_dict):
    spec = model_spec(spec_dict, training=dict(window_days=6, validation_days=2, missing_days="skip", max_missing_days=2))
    win = training_window(spec, DAY)
    gone = {win.train_days[1], win.val_days[0]}
    kept = without_missing(spec, win, "fit", lambda d: d not in gone, lambda d: "never ingested")
    assert set(kept.train_days) == set(win.train_days) - gone and kept.val_days == win.val_days[1:]
    assert kept.skipped_json() == {d.isoformat(): "never ingested" for d in sorted(gone)}
    with pytest.raises(WindowError, match="more than training.max_missing_days \\(2\\)"):
        without_missing(spec, win, "fit", lambda d: d not in {*gone, win.train_days[0]}, lambda d: "x")
    with pytest.raises(WindowError, match="no validation day is left.*raise training.validation_days"):
        without_missing(spec, win, "fit", lambda d: d not in set(win.val_days), lambda d: "x")


def test_too_few_or_one_class_rows_name_the_counts_and_the_field(spec_dict):
    spec = load_spec(BUNDLED_SPEC)
    days = (DAY,)
    with pytest.raises(TooFewRows, match=r"hold 3 rows, fewer than evaluation.min_test_rows \(30\); raise "
                                         r"evaluation.test_days \(now 1\)"):
        check_rows(spec, pl.DataFrame({"delayed": [0.0, 1.0, 0.0]}), "test days", days,
                   "evaluation.min_test_rows", 30, "evaluation.test_days", 1)
    with pytest.raises(TooFewRows, match=r"all of one class \(delayed = 0.0\).*raise training.validation_days"):
        check_rows(spec, pl.DataFrame({"delayed": [0.0] * 40}), "validation days", days,
                   "training.min_validation_rows", 30, "training.validation_days", 1)
    check_rows(spec, pl.DataFrame({"delayed": [0.0, 1.0] * 20}), "test days", days, "m", 30, "t", 1)


@pytest.mark.parametrize(("change", "message"), [
    ({"training": {"validation_days": 21}}, "training.validation_days: 21 leaves no training day"),
    ({"training": {"missing_days": "skip"}}, "training.max_missing_days: 0 skips nothing"),
    ({"training": {"max_missing_days": 2}}, "training.max_missing_days applies with missing_days: skip"),
    ({"training": {"missing_days": "skip", "max_missing_days": 18}}, "could leave no training day of the 18"),
    ({"evaluation": {"test_days": 350}}, "evaluation.test_days: 21 window days and 350 test days need 371 days"),
    ({"partitioning": {"timestamp_column": "hour"}}, "'hour' has dtype int64, which cannot date a row"),
])
def test_windows_that_cannot_work_are_refused_when_the_spec_loads(tmp_path, spec_dict, change, message):
    for section, values in change.items():
        spec_dict[section].update(values)
    path = write_spec(tmp_path, spec_dict)
    with pytest.raises(SpecError, match=f"{path.name}: .*{message}"):
        parse_spec(path.read_text(), path)
