"""The bad-input corpus against a low-volume source: the airport_day example (three rows a day),
its derived rows written as one Parquet file per day. A check of the day (schema, nulls, ranges,
keys, volume, freshness) stops a corrupted day on the day itself; drift pools two weeks at this
volume, so a feed that keeps sending shifted values or flipped labels is stopped within the window
(docs/data-validation.md). Sample-size awareness must not blind any of them."""

import datetime as dt

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ml_assets.ingest.sources import ROWS, read_day
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import ModelSpec, load_spec
from ml_assets.validation.replay import replay

START, FIRST = dt.date(2013, 4, 1), dt.date(2013, 6, 10)
i = pl.int_range(pl.len())


def _set(column: str, value, rows: int = 1):
    return lambda f: f.with_columns(pl.when(i < rows).then(value).otherwise(pl.col(column)).alias(column))


def _binary_origin(path):
    table = pq.read_table(path)
    origin = [b"\xff\xfe" + v.encode() for v in table.column("origin").to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("origin"), "origin", pa.array(origin, pa.binary())), path)


# One day each, from FIRST on: kind -> (change, the check that must fail (None: the source), words).
DAILY = {
    "missing column": (lambda f: f.drop("departures"), "schema", "column 'departures' is missing"),
    "extra column": (lambda f: f.with_columns(pl.lit(1).alias("gate")), "schema", "column 'gate' is not in the schema"),
    "wrong dtype": (lambda f: f.with_columns(pl.col("departures").cast(pl.Float64)), "schema",
                    "column 'departures' is not Int64"),
    "all-null column": (lambda f: f.with_columns(pl.lit(None, pl.Int64).alias("departures")), "nulls",
                        "departures: 3 rows null"),
    "null explosion": (_set("late_share", None, 2), "nulls", "late_share: 2 rows null"),
    "out-of-range values": (_set("late_share", 1.7), "ranges_and_categories", "late_share: 1 row above 1"),
    "unknown category": (_set("origin", pl.lit("ZZZ")), "ranges_and_categories", "outside the allowed categories ('ZZZ')"),
    "duplicate keys": (lambda f: pl.concat([f, f.head(1)]), "duplicate_keys", "2 rows share a key"),
    "empty partition": (lambda f: f.head(0), "volume", "the partition is empty"),
    "volume drop": (lambda f: f.head(1), "volume", "1 row, fewer than volume.min_rows (3)"),
    "rows dated on another day": (_set("day", pl.lit(dt.date(2013, 1, 9))), "freshness", "1 of 3 rows"),
    "single absurd outlier": (_set("departures", 1_000_000), "ranges_and_categories",
                              "departures: 1 row above 2000 (highest 1000000)"),
    "truncated parquet": ("truncate", None, "cannot read"),
    "non-UTF-8 text": ("binary_origin", "schema", "column 'origin' is not String"),
}
# Every day of two weeks from FIRST on, as a broken feed keeps doing.
PERSISTENT = {
    "mean shift of 3 sd": (lambda f: f.with_columns(pl.col("departures") + 150), "departures: KS"),
    "flipped labels": (lambda f: f.with_columns((1 - pl.col("late_share")).alias("late_share")), "label"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The example's derived rows as a team would export them: one Parquet file per day."""
    root = tmp_path_factory.mktemp("airport_day")
    bundled = load_spec(BUNDLED_MODELS_DIR / "airport_day.yaml")
    day = START
    while day < FIRST + dt.timedelta(days=len(DAILY) + 14):
        read_day(bundled, day).tables[ROWS].write_parquet(root / f"{day}.parquet")
        day += dt.timedelta(days=1)
    data = bundled.model_dump(mode="json", by_alias=True)
    data["source"] = {"kind": "files", "rows": {"path": str(root / "{date}.parquet")}}
    data["partitioning"]["start"] = START.isoformat()
    return ModelSpec.model_validate(data), root


def _corrupt(root, day: dt.date, change) -> None:
    path = root / f"{day}.parquet"
    if change == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif change == "binary_origin":
        _binary_origin(path)
    else:
        change(pl.read_parquet(path)).write_parquet(path)


@pytest.fixture
def restored(files):
    spec, root = files
    originals = {p: p.read_bytes() for p in root.glob("*.parquet")}
    yield spec, root
    for path, data in originals.items():
        path.write_bytes(data)


def test_the_clean_days_pass(files):
    spec, _ = files
    verdicts = list(replay(spec, FIRST, FIRST + dt.timedelta(days=len(DAILY) + 13)))
    assert [v.day for v in verdicts if not v.passed or v.absent] == []


def test_each_kind_of_bad_day_is_stopped_on_the_day_by_its_check(restored):
    spec, root = restored
    days = {FIRST + dt.timedelta(days=k): kind for k, kind in enumerate(DAILY)}
    for day, kind in days.items():
        _corrupt(root, day, DAILY[kind][0])
    verdicts = {v.day: v for v in replay(spec, FIRST, max(days))}
    for day, kind in days.items():
        _, check, words = DAILY[kind]
        verdict = verdicts[day]
        if check is None:
            assert verdict.absent and words in verdict.absent, (kind, verdict)
            continue
        assert set(verdict.failed) == {check}, (kind, verdict.failed)
        assert words in verdict.failed[check], (kind, verdict.failed[check])


@pytest.mark.parametrize("kind", list(PERSISTENT))
def test_a_feed_that_stays_broken_is_stopped_within_the_pooled_window(restored, kind):
    spec, root = restored
    change, words = PERSISTENT[kind]
    window = [FIRST + dt.timedelta(days=k) for k in range(spec.validation.drift.current_days)]
    for day in window:
        _corrupt(root, day, change)
    verdicts = list(replay(spec, FIRST, window[-1]))
    stopped = [v for v in verdicts if "drift" in v.failed and words in v.failed["drift"]]
    assert stopped, [v.failed for v in verdicts]
    assert all(set(v.failed) <= {"drift"} for v in verdicts)
