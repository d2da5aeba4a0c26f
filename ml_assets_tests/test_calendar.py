import datetime as dt

import pytest

from ml_assets.calendar import CalendarError, holiday_near, supported
from ml_assets.spec import HolidaySpec


def test_holiday_near_finds_the_nearest_within_the_window():
    assert holiday_near(dt.date(2013, 7, 4), "US") == (dt.date(2013, 7, 4), "Independence Day")
    assert holiday_near(dt.date(2013, 12, 24), "US", window_days=1) == (dt.date(2013, 12, 25), "Christmas Day")
    assert holiday_near(dt.date(2013, 12, 24), "US") is None
    assert holiday_near(dt.date(2013, 12, 31), "US", window_days=1) == (dt.date(2014, 1, 1), "New Year's Day")
    assert holiday_near(dt.date(2013, 3, 15), "US", window_days=3) is None


def test_unknown_calendars_are_refused_with_the_name():
    supported("US", "NY")
    with pytest.raises(CalendarError, match="country 'XX'"):
        supported("XX")
    with pytest.raises(CalendarError, match="subdivision 'ZZ' of US"):
        supported("US", "ZZ")
    with pytest.raises(ValueError, match="no holiday calendar for country 'Narnia'"):
        HolidaySpec(country="Narnia")
