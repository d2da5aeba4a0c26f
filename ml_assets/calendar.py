"""Public holidays, for checks and features that must expect them (the `holidays` package's calendars)."""

from __future__ import annotations

import datetime as dt
import functools

import holidays
from holidays.registry import EntityLoader


class CalendarError(ValueError):
    pass


@functools.cache  # the same few calendars, checked for every spec that loads
def supported(country: str, subdivision: str | None = None) -> None:
    """Raise CalendarError unless ``holidays`` has a calendar for the country (and subdivision)."""
    # The registry's codes, not ``list_supported_countries()``: that imports every country's module
    # (~0.3 s of each code location's load) to list subdivisions only one country's are needed of.
    if country not in EntityLoader.get_country_codes(include_aliases=True):
        raise CalendarError(f"no holiday calendar for country {country!r} (ISO 3166-1 alpha-2 codes, e.g. 'US', 'DE')")
    if subdivision is not None and subdivision not in getattr(holidays, country).subdivisions:
        raise CalendarError(f"no holiday calendar for subdivision {subdivision!r} of {country}")


@functools.cache
def _year(country: str, subdivision: str | None, year: int) -> dict[dt.date, str]:
    return dict(holidays.country_holidays(country, subdiv=subdivision, years=year).items())


def holiday_near(day: dt.date, country: str, subdivision: str | None = None, window_days: int = 0
                 ) -> tuple[dt.date, str] | None:
    """The nearest public holiday within ``window_days`` of ``day`` (the day itself first), or None."""
    for offset in sorted(range(-window_days, window_days + 1), key=abs):
        near = day + dt.timedelta(days=offset)
        if (name := _year(country, subdivision, near.year).get(near)) is not None:
            return near, name
    return None
