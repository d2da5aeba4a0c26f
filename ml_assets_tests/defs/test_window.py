import datetime as dt

import pytest

from ml_assets.defs.training.window import WindowError, training_window
from ml_assets.spec import load_spec
from ml_assets_tests.conftest import BUNDLED_SPEC


def test_window_trains_before_the_day_and_never_on_it():
    spec = load_spec(BUNDLED_SPEC)
    day = dt.date(2013, 3, 15)
    win = training_window(spec, day)
    assert len(win.train_days) == spec.training.window_days - 1
    assert win.train_days[0] == day - dt.timedelta(days=spec.training.window_days)
    assert win.val_day == day - dt.timedelta(days=1)
    assert win.test_day == day
    assert day not in win.train_days and win.val_day not in win.train_days


def test_window_before_history_names_first_trainable_day():
    spec = load_spec(BUNDLED_SPEC)
    with pytest.raises(WindowError, match="the first trainable partition is 2013-01-15"):
        training_window(spec, dt.date(2013, 1, 5))
