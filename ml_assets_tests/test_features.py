import copy
import datetime as dt
import json

import numpy as np
import polars as pl
import pytest

from ml_assets.features.build import (
    TIMESTAMP,
    FeatureError,
    build_features,
    build_lazy,
    feature_columns,
)
from ml_assets.features.state import (
    OOV,
    cardinalities,
    fit_state,
    stable_hash,
    state_bytes,
    transform,
    transform_lazy,
)
from ml_assets.ingest.sources import local_day, read_day
from ml_assets.spec import ModelSpec, load_spec
from ml_assets_tests.helpers import BUNDLED_SPEC

DAY = dt.date(2013, 7, 4)


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def tables(spec) -> dict[str, pl.DataFrame]:
    return read_day(spec, DAY).tables


@pytest.fixture(scope="module")
def history(spec) -> pl.DataFrame:
    return pl.concat([read_day(spec, DAY - dt.timedelta(days=k)).tables["rows"] for k in range(1, 8)])


def _fit(spec, frame):
    return fit_state(frame, spec.features, spec.target.name, spec.target.task)


def test_features_hold_declared_columns_and_target_only(spec, tables, history):
    built = build_features(spec, tables, history)
    assert built.frame.columns == [TIMESTAMP, *feature_columns(spec), "delayed"]
    for leaky in ("dep_delay", "dep_time", "arr_delay", "arr_time", "air_time"):
        assert leaky not in built.frame.columns
    cancelled = tables["rows"]["dep_delay"].null_count()
    assert built.rows_without_target == cancelled
    assert built.frame.height == built.rows_in - cancelled
    expected = (tables["rows"].drop_nulls("dep_delay")["dep_delay"] >= 15).cast(pl.Float32)
    assert built.frame["delayed"].to_list() == expected.to_list()  # the rows keep their order


def test_time_parts_are_local_and_flag_holidays(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    assert set(frame["local_day_of_week"].unique()) == {"4"}  # Thursday, in New York
    assert set(frame["local_month"].unique()) == {"7"}
    assert set(frame["local_holiday"].unique()) == {"1"}  # Independence Day
    ordinary = read_day(spec, dt.date(2013, 7, 10)).tables
    assert set(build_features(spec, ordinary).frame["local_holiday"].unique()) == {"0"}


def test_exact_joins_never_multiply_rows(spec, tables, history):
    duplicated = dict(tables)
    duplicated["planes"] = pl.concat([tables["planes"], tables["planes"].with_columns(pl.col("seats") + 1000)])
    built = build_features(spec, duplicated, history)
    assert built.rows_in == tables["rows"].height
    assert built.frame["seats"].max() < 1000  # the first record per key wins


def test_asof_join_takes_the_latest_weather_at_or_before_the_scheduled_hour(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    rows = tables["rows"].drop_nulls("dep_delay")
    weather = tables["weather"]
    for i in (0, 100, 400):
        row = rows.row(i, named=True)
        exact = weather.filter((pl.col("origin") == row["origin"]) & (pl.col("time_hour") == row["time_hour"]))
        assert frame["temp"][i] == pytest.approx(exact["temp"][0])


def _synthetic(rows: pl.DataFrame, weather: pl.DataFrame) -> dict[str, pl.LazyFrame]:
    """Rows with every raw column the bundled spec declares, and the dimensions to join them with."""
    raw = rows.with_columns(
        *[pl.lit(None, pl.Int64).alias(c) for c in ("dep_delay", "dep_time", "arr_time", "arr_delay", "air_time")],
        pl.lit("B6").alias("carrier"), pl.lit("N1").alias("tailnum"), pl.lit("LAX").alias("dest"),
        pl.lit(1).alias("hour"), pl.lit(0).alias("minute"), pl.lit(2475).alias("distance"))
    weather = weather.with_columns(pl.lit(5.0).alias("wind_speed"), pl.lit(0.0).alias("precip"), pl.lit(10.0).alias("visib"))
    planes = pl.DataFrame(schema={"tailnum": pl.String, "year": pl.Int64, "seats": pl.Int64})
    return {"rows": raw.lazy(), "weather": weather.lazy(), "planes": planes.lazy()}


def test_asof_join_never_reads_a_later_record(spec):
    """One origin with readings every 2 hours: each row gets the reading at or before its hour, within
    the 3-hour tolerance, never the next one."""
    rows = pl.DataFrame({"time_hour": [f"2013-07-10T{h:02d}:00:00Z" for h in range(14, 24)], "origin": "JFK"})
    weather = pl.DataFrame({"time_hour": [f"2013-07-10T{h:02d}:00:00Z" for h in range(10, 24, 2)],
                            "origin": "JFK", "temp": [float(h) for h in range(10, 24, 2)]})
    t = _synthetic(rows, weather)
    joined = build_lazy(spec, t.pop("rows"), t).collect()
    hours = [int(x[11:13]) for x in rows["time_hour"]]
    assert joined["temp"].to_list() == [float(h - h % 2) for h in hours]  # 15 h gets 14 h, never 16 h
    t = _synthetic(rows.head(1), weather.filter(pl.col("time_hour") < "2013-07-10T11:00:00Z"))
    again = build_lazy(spec, t.pop("rows"), t).collect()  # 14 h: the 10 h reading is 4 h old, over 3 h
    assert again["temp"].to_list() == [None]
    other = _synthetic(rows.head(1), weather.with_columns(pl.lit("EWR").alias("origin")))
    assert build_lazy(spec, other.pop("rows"), other).collect()["temp"].to_list() == [None]  # by origin
    # Rows sharing (origin, hour) pairs, out of time order, one without an origin: each keeps its
    # place and gets its own pair's reading (the join runs on the distinct pairs); no origin, no reading.
    mixed = pl.concat([rows.reverse(), rows, pl.DataFrame({"time_hour": ["2013-07-10T15:00:00Z"], "origin": [None]},
                                                          schema=rows.schema)])
    t = _synthetic(mixed, weather)
    got = build_lazy(spec, t.pop("rows"), t).collect()
    assert got["temp"].to_list() == [float(h - h % 2) for h in [*reversed(hours), *hours]] + [None]


def test_rolling_reads_only_the_days_strictly_before(spec, tables, history):
    base = build_features(spec, tables, history).frame
    # The same carrier's rate over the 7 days before, computed by hand.
    past = history.drop_nulls("dep_delay")
    for carrier in ("B6", "UA"):
        expected = float((past.filter(pl.col("carrier") == carrier)["dep_delay"] >= 15).mean())
        got = base.filter(pl.col("carrier") == carrier)["carrier_delay_rate_7d"].unique().to_list()
        assert got == [pytest.approx(expected)]
    # Changing the day's own outcomes, or adding later days, changes nothing; changing a past day does.
    flipped = {**tables, "rows": tables["rows"].with_columns(pl.col("dep_delay") + 100)}
    assert build_features(spec, flipped, history).frame["carrier_delay_rate_7d"].equals(base["carrier_delay_rate_7d"])
    later = pl.concat([history, read_day(spec, DAY + dt.timedelta(days=1)).tables["rows"]])
    assert build_features(spec, tables, later).frame["carrier_delay_rate_7d"].equals(base["carrier_delay_rate_7d"])
    older = history.with_columns(pl.col("dep_delay") + 100)
    assert not build_features(spec, tables, older).frame["carrier_delay_rate_7d"].equals(base["carrier_delay_rate_7d"])
    # The eighth day back is outside the window.
    eighth = pl.concat([history, read_day(spec, DAY - dt.timedelta(days=8)).tables["rows"].with_columns(
        pl.lit(999, pl.Int64).alias("dep_delay"))])
    assert build_features(spec, tables, eighth).frame["carrier_delay_rate_7d"].equals(base["carrier_delay_rate_7d"])


def test_many_days_at_once_equal_day_by_day(spec):
    """The same code builds one day (the asset, with earlier days as history) or a window at once."""
    days = [dt.date(2013, 7, 1) + dt.timedelta(days=k) for k in range(10)]
    per_day = {d: read_day(spec, d).tables for d in days}
    batch = build_features(spec, {**per_day[days[0]], "rows": pl.concat([per_day[d]["rows"] for d in days]),
                                  "weather": pl.concat([per_day[d]["weather"] for d in days])}).frame
    local = batch.with_columns(local_day(TIMESTAMP, pl.String, spec.partitioning.timezone).alias("d"))
    for i in (0, 3, 7, 9):
        history = pl.concat([per_day[d]["rows"] for d in days[:i]]) if i else None
        one = build_features(spec, per_day[days[i]], history).frame
        assert local.filter(pl.col("d") == days[i]).drop("d").equals(one)


def test_missing_dimension_column_is_named(spec, tables, history):
    broken = {**tables, "planes": tables["planes"].drop("seats")}
    with pytest.raises(FeatureError, match=r"features.joins\[1\]: dimension 'planes' has no columns \['seats'\]"):
        build_features(spec, broken, history)


def test_transforms_standardize_log_clip_bucketize_and_hash(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    state = _fit(spec, frame)
    numeric = {s["name"]: s for s in state["numeric"]}
    categorical = {c["name"]: c for c in state["categorical"]}
    assert numeric["distance"]["steps"] == [{"log1p": True}]
    assert numeric["distance"]["mean"] == pytest.approx(float(np.log1p(frame["distance"]).mean()))
    assert numeric["wind_speed"]["steps"] == [{"clip": [0.0, 60.0]}]
    assert categorical["plane_year"]["encoding"] == "buckets" and len(categorical["plane_year"]["edges"]) == 7
    assert categorical["tailnum"] == {"name": "tailnum", "encoding": "hash", "buckets": 512}
    encoded = transform(frame, state)
    assert encoded.numeric.shape == (frame.height, len(state["numeric"]))
    assert np.allclose(encoded.numeric.mean(axis=0), 0, atol=0.05)
    cols = [c["name"] for c in state["categorical"]]
    assert encoded.categorical.shape == (frame.height, len(cols))
    assert (encoded.categorical < np.array(cardinalities(state))).all()
    tail = encoded.categorical[:, cols.index("tailnum")]
    expected = [stable_hash(t, 512) if t is not None else OOV for t in frame["tailnum"].to_list()]
    assert tail.tolist() == expected
    years = encoded.categorical[:, cols.index("plane_year")]
    assert set(np.unique(years)) <= set(range(0, 9)) and len(np.unique(years)) >= 6


def test_vocabulary_min_frequency_and_unknown_values(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    state = _fit(spec, frame)
    dest = next(c for c in state["categorical"] if c["name"] == "dest")
    counts = frame["dest"].value_counts()
    assert dest["vocabulary"] == sorted(counts.filter(pl.col("count") >= 20)["dest"].to_list())
    unseen = frame.head(2).with_columns(pl.lit("XX").alias("carrier"), pl.lit(None, pl.Float64).alias("distance"),
                                        pl.lit(-5.0).alias("precip"))
    again = transform(unseen, state)
    cols = [c["name"] for c in state["categorical"]]
    assert (again.categorical[:, cols.index("carrier")] == OOV).all()
    names = [s["name"] for s in state["numeric"]]
    assert (again.numeric[:, names.index("distance")] == 0).all()  # missing: the training mean
    assert (again.numeric[:, names.index("precip")] == 0).all()  # log1p of a value below -1: missing


def test_state_survives_json_and_the_lazy_transform_matches(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    state = _fit(spec, frame)
    reloaded = json.loads(state_bytes(state))
    a, b = transform(frame, state), transform(frame, reloaded)
    assert np.array_equal(a.numeric, b.numeric) and np.array_equal(a.categorical, b.categorical)
    lazy = transform_lazy(frame.lazy(), reloaded).collect(engine="streaming")
    assert np.array_equal(lazy.select([s["name"] for s in state["numeric"]]).to_numpy().astype(np.float32), a.numeric)
    assert np.array_equal(lazy.select([c["name"] for c in state["categorical"]]).to_numpy(), a.categorical)
    streamed = _fit(spec, frame.lazy())  # a LazyFrame is fitted on the streaming engine
    assert streamed["categorical"] == state["categorical"]
    for a, b in zip(streamed["numeric"], state["numeric"], strict=True):  # sums in another order
        assert a == {**b, "mean": pytest.approx(b["mean"], rel=1e-12), "std": pytest.approx(b["std"], rel=1e-12)}


def test_transform_without_target_serves_inference(spec, tables, history):
    frame = build_features(spec, tables, history).frame
    state = _fit(spec, frame)
    assert transform(frame.drop("delayed"), state).target is None
    with pytest.raises(ValueError, match="lack the feature columns"):
        transform(frame.drop("carrier"), state)


# -- leakage guards --------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "words"), [
    (lambda f: f["numeric"].append("dep_delay"), "'dep_delay' (an input of the target)"),
    (lambda f: f["numeric"].append("air_time"), "'air_time' (known only after the event)"),
    (lambda f: f["categorical"].append("arr_time"), "'arr_time' (known only after the event)"),
    (lambda f: f["joins"][1].update(keys=["dep_time"]), "joining on 'dep_time'"),
    (lambda f: f["rolling"][0].update(by=["arr_delay"]), "grouping by 'arr_delay'"),
    (lambda f: f["time"].update(column="dep_time"), "time parts of 'dep_time'"),
])
def test_the_target_and_the_future_never_enter_features(spec, change, words):
    data = spec.model_dump(by_alias=True, mode="json")
    change(data["features"])
    with pytest.raises(ValueError) as info:
        ModelSpec.model_validate(data)
    assert words in str(info.value) and "leak" in str(info.value)


def test_custom_transforms_never_see_the_target_or_after_event_columns(spec, tables, history, monkeypatch):
    seen = {}

    def spy(frame: pl.LazyFrame) -> pl.LazyFrame:
        seen["columns"] = frame.collect_schema().names()
        return frame.with_columns((pl.col("distance") / 100).alias("distance_hundreds"))

    import ml_assets_tests.test_features as me

    monkeypatch.setattr(me, "spy_transform", spy, raising=False)
    data = copy.deepcopy(spec.model_dump(by_alias=True, mode="json"))
    data["features"]["custom"] = [{"function": "ml_assets_tests.test_features:spy_transform",
                                   "columns": ["distance_hundreds"]}]
    data["features"]["numeric"].append({"name": "distance_hundreds"})
    custom = ModelSpec.model_validate(data)
    frame = build_features(custom, tables, history).frame
    assert frame["distance_hundreds"].to_list() == pytest.approx((frame["distance"] / 100).to_list())
    hidden = {"dep_delay", "dep_time", "arr_time", "arr_delay", "air_time"}
    assert not hidden & set(seen["columns"])
    assert "carrier_delay_rate_7d" in seen["columns"]  # built from past days only, so it may be seen


def test_a_custom_transform_that_drops_its_columns_is_named(spec, tables, history, monkeypatch):
    import ml_assets_tests.test_features as me

    monkeypatch.setattr(me, "bad_transform", lambda f: f, raising=False)
    data = spec.model_dump(by_alias=True, mode="json")
    data["features"]["custom"] = [{"function": "ml_assets_tests.test_features:bad_transform", "columns": ["x"]}]
    with pytest.raises(FeatureError, match=r"bad_transform did not add its declared columns \['x'\]"):
        build_features(ModelSpec.model_validate(data), tables, history)


def test_a_window_out_of_core_equals_the_in_memory_path(spec, tmp_path):
    """``featurize_out_of_core`` (Parquet in, streaming engine, Parquet out) gives the rows, state and
    model inputs the in-memory path gives."""
    from polars.testing import assert_frame_equal

    from ml_assets.features.window import featurize_out_of_core
    from ml_assets.ingest.sources import _bundled_table

    days = [dt.date(2013, 7, 1) + dt.timedelta(days=k) for k in range(9)]
    rows = pl.concat([read_day(spec, d).tables["rows"] for d in days])
    for i, part in enumerate(rows.iter_slices(2000)):  # several files, as a window of days would be
        part.write_parquet(tmp_path / f"rows-{i:03d}.parquet")
    dims = {}
    for name in ("weather", "planes"):
        _bundled_table(name)[0].write_parquet(tmp_path / f"{name}.parquet")
        dims[name] = tmp_path / f"{name}.parquet"
    out = featurize_out_of_core(spec, str(tmp_path / "rows-*.parquet"), dims, tmp_path / "out")
    in_memory = build_features(spec, {"rows": rows, "weather": _bundled_table("weather")[0],
                                      "planes": _bundled_table("planes")[0]}).frame
    assert_frame_equal(pl.read_parquet(out.built), in_memory)
    state = _fit(spec, in_memory)
    assert out.state["categorical"] == state["categorical"]
    assert json.loads((tmp_path / "out" / "feature_state.json").read_text()) == out.state
    encoded = transform(in_memory, state)
    streamed = pl.read_parquet(out.encoded)
    assert np.allclose(streamed.select([s["name"] for s in state["numeric"]]).to_numpy(), encoded.numeric, atol=1e-6)
    assert np.array_equal(streamed.select([c["name"] for c in state["categorical"]]).to_numpy(), encoded.categorical)


def test_the_features_code_version_follows_the_feature_section_and_the_transform_code(spec, tmp_path, monkeypatch):
    import dagster as dg

    from ml_assets.features.assets import build_features_asset

    key = dg.AssetKey([spec.name, "features"])

    def version(data: dict) -> str:
        return build_features_asset(ModelSpec.model_validate(data)).code_versions_by_key[key]

    data = spec.model_dump(by_alias=True, mode="json")
    base = version(data)
    assert version({**data, "training": {**data["training"], "epochs": 99}}) == base  # not a feature matter
    edited = copy.deepcopy(data)
    edited["features"]["numeric"][2]["transforms"] = ["standardize"]  # distance without log1p
    assert version(edited) != base
    # A custom transform's source is part of it: editing the function changes the version.
    module = tmp_path / "my_transforms.py"
    module.write_text("import polars as pl\n\ndef route(f):\n    return f.with_columns(pl.concat_str('origin', 'dest').alias('route'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    custom = copy.deepcopy(data)
    custom["features"]["custom"] = [{"function": "my_transforms:route", "columns": ["route"]}]
    custom["features"]["categorical"].append({"name": "route"})
    first = version(custom)
    module.write_text("import polars as pl\n\ndef route(f):\n    return f.with_columns(pl.concat_str('dest', 'origin').alias('route'))\n")
    assert version(custom) != first != base
