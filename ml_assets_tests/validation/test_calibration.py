"""Real-data calibration: the snapshot's checks over every day of the bundled 2013 data, for each
bundled model (many rows a day, multiclass, three rows a day).

At most 3% of days may fail, and the days that do are exactly the ones docs/data-validation.md lists
(and the spec waives, each with its reason). The same year with labels flipped on every
seventh day: each of those days fails the drift check on its label, and no other day fails.
"""

import datetime as dt
import re
from pathlib import Path

import polars as pl
import pytest

from ml_assets.ingest.sources import ROWS, read_day
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.validation.replay import replay
from ml_assets_tests.helpers import BUNDLED_SPEC

pytestmark = pytest.mark.slow

START, END = dt.date(2013, 1, 1), dt.date(2013, 12, 31)
DOC = Path(__file__).resolve().parents[2] / "docs" / "data-validation.md"


@pytest.fixture(scope="module")
def spec():
    return load_spec(BUNDLED_SPEC)


def documented_days(model: str) -> dict[dt.date, list[str]]:
    """The model's calibration table in docs/data-validation.md: | day | checks | ... | under its heading."""
    text = DOC.read_text()
    section = text[text.index("## Calibration on the real data"):]
    section = section[section.index(f"### `{model}`"):]
    if "\n### " in section[4:]:
        section = section[:section.index("\n### ", 4)]
    rows = re.findall(r"^\| (2013-\d\d-\d\d) \| ([^|]+) \|", section, flags=re.M)
    return {dt.date.fromisoformat(day): sorted(c.strip(" `") for c in checks.split(",")) for day, checks in rows}


@pytest.mark.parametrize("model", ["flights_delay", "flight_outcome", "airport_day"])
def test_every_day_of_2013_at_most_three_percent_fail_and_the_docs_list_them(model):
    spec = load_spec(BUNDLED_MODELS_DIR / f"{model}.yaml")
    verdicts = list(replay(spec, START, END, ignore_waivers=True))
    assert len(verdicts) == 365 and not [v for v in verdicts if v.absent]
    failing = {v.day: sorted(v.failed) for v in verdicts if not v.passed}
    assert len(failing) <= 0.03 * len(verdicts), failing
    assert failing == documented_days(model), "docs/data-validation.md must list exactly the failing days and checks"
    # Each is waived with its reason; a waiver may name a check that fails only once another is waived.
    waivers = {w.day: set(w.checks) for w in spec.validation.waivers}
    assert set(waivers) == set(failing) and all(set(c) <= waivers[d] for d, c in failing.items())
    if any(set(c) != waivers[d] for d, c in failing.items()):  # (otherwise the replay above says it all)
        assert all(v.passed for v in replay(spec, START, END)), "with its waivers, every day of 2013 publishes"


def test_flipped_labels_on_every_seventh_day_are_caught_and_nothing_else_fails(spec):
    waived = {w.day for w in spec.validation.waivers}
    flipped_days = {START + dt.timedelta(days=d) for d in range(20, 365, 7)} - waived

    def read(s, day):
        rows = read_day(s, day).tables[ROWS]
        if day in flipped_days:
            delay = pl.col("dep_delay")
            rows = rows.with_columns(pl.when(delay.is_null()).then(None).when(delay >= 15).then(0).otherwise(30)
                                     .cast(pl.Int64).alias("dep_delay"))
        return rows

    verdicts = {v.day: v for v in replay(spec, START, END, read=read)}  # with the spec's waivers
    caught = {d for d in flipped_days if "drift" in verdicts[d].failed
              and any(s in verdicts[d].failed["drift"] for s in ("label relationship", "label rate"))}
    missed = sorted(flipped_days - caught)
    assert len(caught) >= 0.95 * len(flipped_days), f"missed flipped labels on {missed}"
    assert {d: v.failed for d, v in verdicts.items() if d in flipped_days and set(v.failed) - {"drift"}} == {}
    wrongly = {d: v.failed for d, v in verdicts.items() if d not in flipped_days and not v.passed}
    assert wrongly == {}
    assert {d for d, v in verdicts.items() if v.waived} <= waived
    print(f"flipped labels caught on {len(caught)} of {len(flipped_days)} days; missed: {missed}")
