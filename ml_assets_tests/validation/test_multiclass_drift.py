"""A multiclass label's drift, class by class (each judged as "that class or not" with the binary
label's calibrated rules), on the bundled flight_outcome example."""

import datetime as dt

import polars as pl

from ml_assets.ingest.sources import ROWS, read_day
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.validation.replay import replay

DAY = dt.date(2013, 3, 6)


def test_a_class_that_vanishes_or_labels_permuted_fail_the_drift_check():
    spec = load_spec(BUNDLED_MODELS_DIR / "flight_outcome.yaml")
    changes = {
        DAY: ("class late rate", lambda delay: pl.when(delay.is_between(15, 59)).then(0).otherwise(delay)),
        # Late and on time swapped: the very late class vanishes with them.
        DAY + dt.timedelta(days=2): ("class very_late rate", lambda delay: pl.when(delay >= 15).then(0).otherwise(45)),
    }

    def read(s, day):
        rows = read_day(s, day).tables[ROWS]
        if day in changes:
            delay = pl.col("dep_delay")
            rows = rows.with_columns(pl.when(delay.is_null()).then(None).otherwise(changes[day][1](delay))
                                     .cast(pl.Int64).alias("dep_delay"))
        return rows

    verdicts = {v.day: v for v in replay(spec, DAY - dt.timedelta(days=1), DAY + dt.timedelta(days=2), read=read)}
    assert verdicts[DAY - dt.timedelta(days=1)].passed and verdicts[DAY + dt.timedelta(days=1)].passed
    for day, (words, _) in changes.items():
        assert set(verdicts[day].failed) == {"drift"}, verdicts[day].failed
        assert words in verdicts[day].failed["drift"], verdicts[day].failed["drift"]
