"""The bad-input corpus: 16 kinds of bad data, each injected into a real partition of the bundled
data, must fail the intended check (and only that), say why, and leave main untouched. The same
partition unmodified passes.

Runs the real raw_data and validated_snapshot assets in-process on a temporary Dagster instance,
after 28 clean days (4 weeks of same-weekday history, 14 reference days for drift).
"""

import datetime as dt

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ml_assets.ingest.assets import build_raw_data
from ml_assets.resources import DagsterLinksResource, LocalVersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.validation.assets import build_validated_snapshot
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import flights_files

DAY = dt.date(2013, 6, 5)  # a Wednesday with nothing special about it
REPO = "flights-delay"
i = pl.int_range(pl.len())


def _set(column: str, value, rows: int) -> callable:
    return lambda f: f.with_columns(pl.when(i < rows).then(value).otherwise(pl.col(column)).alias(column))


def _binary_dest(path):
    table = pq.read_table(path)
    dest = [b"\xff\xfeJFK" if k == 0 else v.encode() for k, v in enumerate(table.column("dest").to_pylist())]
    pq.write_table(table.set_column(table.schema.get_field_index("dest"), "dest", pa.array(dest, pa.binary())), path)


# kind -> (how the day's file is changed, the check that must fail (None: ingestion), words in the message)
CORPUS = {
    "missing column": (lambda f: f.drop("minute"), "schema", "column 'minute' is missing"),
    "extra column": (lambda f: f.with_columns(pl.lit(1).alias("gate")), "schema", "column 'gate' is not in the schema"),
    "wrong dtype": (lambda f: f.with_columns(pl.col("distance").cast(pl.Float64)), "schema", "column 'distance' is not Int64"),
    "all-null column": (lambda f: f.with_columns(pl.lit(None, pl.String).alias("tailnum")), "nulls",
                        "tailnum: 100.0% null"),
    "null explosion": (_set("dep_time", None, 700), "nulls", "dep_time: "),
    "out-of-range values": (_set("hour", 31, 5), "ranges_and_categories", "hour: 5 rows above 23 (highest 31)"),
    "unknown category": (_set("carrier", pl.lit("ZZ"), 5), "ranges_and_categories",
                         "carrier: 5 rows outside the allowed categories ('ZZ')"),
    "duplicate keys": (lambda f: pl.concat([f, f.head(10)]), "duplicate_keys", "20 rows share a key"),
    "empty partition": (lambda f: f.head(0), "volume", "the partition is empty"),
    "50% volume drop": (lambda f: f.sample(fraction=0.5, seed=1), "volume", "beyond ±20%"),
    "rows dated on another day": (
        lambda f: f.with_columns(pl.when(i < 60).then(pl.lit("2013-06-09T14:00:00Z")).otherwise(pl.col("time_hour"))
                                 .alias("time_hour")), "freshness", "60 of"),
    "mean shift of 3 sd": (lambda f: f.with_columns(pl.col("distance") + 2200), "drift", "distance: KS"),
    "flipped labels": (lambda f: f.with_columns(pl.when(pl.col("dep_delay") >= 15).then(0).otherwise(30)
                                                .cast(pl.Int64).alias("dep_delay")), "drift", "label relationship"),
    "truncated parquet": ("truncate", None, "cannot read"),
    "non-UTF-8 text": ("binary_dest", "schema", "column 'dest' is not String"),
    "single absurd outlier": (_set("distance", 1_000_000, 1), "ranges_and_categories", "distance: 1 row above 10000 (highest 1000000)"),
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory, bundled_spec_dict):
    root = tmp_path_factory.mktemp("corpus")
    days = [DAY - dt.timedelta(days=n) for n in range(28, -1, -1)]
    spec = ModelSpec.model_validate({**bundled_spec_dict, "source": flights_files(root / "data", days)})
    assets = [build_raw_data(spec), build_validated_snapshot(spec)]
    resources = {"version_store": LocalVersionStoreResource(root=str(root / "versions")), "links": DagsterLinksResource()}
    (root / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(root / "dagster"))
    for day in days[:-1]:
        result = dg.materialize(assets, partition_key=day.isoformat(), instance=instance, resources=resources)
        assert result.success
    path = root / "data" / "flights" / f"{DAY}.parquet"
    return {"spec": spec, "assets": assets, "resources": resources, "instance": instance, "path": path,
            "original": path.read_bytes(), "store": LocalVersionStore(root / "versions")}


def _run(h):
    return dg.materialize(h["assets"], partition_key=DAY.isoformat(), instance=h["instance"],
                          resources=h["resources"], raise_on_error=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(CORPUS))
def test_bad_input_fails_the_intended_check_and_leaves_main_untouched(harness, kind):
    change, check, words = CORPUS[kind]
    path, store = harness["path"], harness["store"]
    main_before = store.branch_head(REPO, "main")
    if change == "truncate":
        path.write_bytes(harness["original"][: len(harness["original"]) // 2])
    elif change == "binary_dest":
        path.write_bytes(harness["original"])
        _binary_dest(path)
    else:
        change(pl.read_parquet(harness["original"])).write_parquet(path)
    try:
        result = _run(harness)
    finally:
        path.write_bytes(harness["original"])
    assert not result.success
    failed = {e.check_name for e in result.get_asset_check_evaluations() if not e.passed}
    message = " ".join(str(e.event_specific_data.error.message) for e in result.get_step_failure_events())
    if check is None:
        assert failed == set() and "raw_data" in " ".join(e.step_key for e in result.get_step_failure_events())
    else:
        assert failed == {check}, f"{kind}: failed {failed}, expected only {check}: {message}"
        assert f"model flights_delay, partition {DAY}" in message and f"check {check}:" in message
    assert words in message, message
    assert store.branch_head(REPO, "main") == main_before


def test_the_same_partition_unmodified_passes(harness):
    result = _run(harness)
    assert result.success
    assert all(e.passed for e in result.get_asset_check_evaluations())
    assert len(result.get_asset_check_evaluations()) == 7
