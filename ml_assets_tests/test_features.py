import datetime as dt
import json

import numpy as np
import polars as pl
import pytest

from ml_assets.features.build import TIMESTAMP, FeatureError, build_features, feature_columns
from ml_assets.features.state import OOV, fit_state, state_bytes, transform
from ml_assets.sources import read_day
from ml_assets.spec import ModelSpec, load_spec
from ml_assets_tests.conftest import BUNDLED_SPEC


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def tables(spec) -> dict[str, pl.DataFrame]:
    return read_day(spec, dt.date(2013, 7, 4)).tables


def test_features_hold_declared_columns_and_target_only(spec, tables):
    built = build_features(spec, tables)
    assert built.frame.columns == [TIMESTAMP, *feature_columns(spec), "delayed"]
    assert "dep_delay" not in built.frame.columns and "arr_delay" not in built.frame.columns
    cancelled = tables["rows"]["dep_delay"].null_count()
    assert built.rows_without_target == cancelled
    assert built.frame.height == built.rows_in - cancelled
    expected = (tables["rows"].drop_nulls("dep_delay")["dep_delay"] >= 15).cast(pl.Float32)
    assert built.frame["delayed"].to_list() == expected.to_list()


def test_joins_never_multiply_rows(spec, tables):
    duplicated = dict(tables)
    duplicated["weather"] = pl.concat([tables["weather"], tables["weather"].with_columns(pl.col("temp") + 100)])
    built = build_features(spec, duplicated)
    assert built.rows_in == tables["rows"].height
    assert built.frame["temp"].max() < 150  # the first record per key wins


def test_join_weather_matches_origin_and_hour(spec, tables):
    built = build_features(spec, tables)
    row = built.frame.row(0, named=True)
    first = tables["rows"].row(0, named=True)
    expected = tables["weather"].filter(
        (pl.col("origin") == first["origin"]) & (pl.col("time_hour") == first["time_hour"]))["temp"][0]
    assert row["temp"] == pytest.approx(expected)


def test_missing_dimension_column_is_named(spec, tables):
    broken = {**tables, "planes": tables["planes"].drop("seats")}
    with pytest.raises(FeatureError, match=r"features.joins\[1\]: dimension 'planes' has no columns \['seats'\]"):
        build_features(spec, broken)


def test_transform_standardizes_and_maps_unknown_categories(spec, tables):
    frame = build_features(spec, tables).frame
    state = fit_state(frame, spec.features.numeric, spec.features.categorical, "delayed", spec.target.task)
    encoded = transform(frame, state)
    assert np.allclose(encoded.numeric.mean(axis=0), 0, atol=1e-3)
    assert (encoded.categorical > OOV).all()
    unseen = frame.head(2).with_columns(pl.lit("XX").alias("carrier"), pl.lit(None, pl.Float64).alias("distance"))
    again = transform(unseen, state)
    assert (again.categorical[:, 0] == OOV).all()
    assert (again.numeric[:, spec.features.numeric.index("distance")] == 0).all()  # the training mean


def test_state_survives_json_and_gives_identical_outputs(spec, tables):
    frame = build_features(spec, tables).frame
    state = fit_state(frame, spec.features.numeric, spec.features.categorical, "delayed", spec.target.task)
    reloaded = json.loads(state_bytes(state))
    a, b = transform(frame, state), transform(frame, reloaded)
    assert np.array_equal(a.numeric, b.numeric) and np.array_equal(a.categorical, b.categorical)


def test_transform_without_target_serves_inference(spec, tables):
    frame = build_features(spec, tables).frame
    state = fit_state(frame, spec.features.numeric, spec.features.categorical, "delayed", spec.target.task)
    assert transform(frame.drop("delayed"), state).target is None
    with pytest.raises(ValueError, match="lack the feature columns"):
        transform(frame.drop("carrier"), state)
