"""Waivers: the spec accepts named checks failing on a named day, with a reason; nothing else changes.

Runs the real raw_data and validated_snapshot assets on a temporary Dagster instance.
"""

import datetime as dt

import dagster as dg
import polars as pl
import pytest

from ml_assets.ingest.assets import build_raw_data
from ml_assets.resources import DagsterLinksResource, LocalVersionStoreResource
from ml_assets.validation.assets import build_validated_snapshot
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import flights_files, model_spec, whole

DAY = dt.date(2013, 6, 12)
REPO = "flights-delay"
REASON = "labels flipped on purpose by this test"


def _flip(frame: pl.DataFrame) -> pl.DataFrame:
    delay = pl.col("dep_delay")
    return frame.with_columns(pl.when(delay.is_null()).then(None).when(delay >= 15).then(0).otherwise(30)
                              .cast(pl.Int64).alias("dep_delay"))


@pytest.mark.slow
def test_a_waived_check_passes_with_warn_severity_and_the_reason_reaches_main(tmp_path, bundled_spec_dict):
    days = [DAY - dt.timedelta(days=n) for n in range(8, -1, -1)]
    source = flights_files(tmp_path / "data", days)
    spec = model_spec(bundled_spec_dict, source=whole(source), validation={"waivers": [{"day": DAY.isoformat(), "checks": ["drift"], "reason": REASON}]})
    assets = [build_raw_data(spec), build_validated_snapshot(spec)]
    resources = {"version_store": LocalVersionStoreResource(root=str(tmp_path / "versions")),
                 "links": DagsterLinksResource()}
    (tmp_path / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster"))
    for day in days[:-1]:
        assert dg.materialize(assets, partition_key=day.isoformat(), instance=instance, resources=resources).success
    store = LocalVersionStore(tmp_path / "versions")
    path = tmp_path / "data" / "flights" / f"{DAY}.parquet"
    flipped = _flip(pl.read_parquet(path))

    # A failure the waiver does not name still blocks: nulls on top of the flipped labels.
    main_before = store.branch_head(REPO, "main")
    flipped.with_columns(pl.lit(None, pl.Int64).alias("dep_time")).write_parquet(path)
    blocked = dg.materialize(assets, partition_key=DAY.isoformat(), instance=instance, resources=resources,
                             raise_on_error=False)
    assert not blocked.success
    evaluations = {e.check_name: e for e in blocked.get_asset_check_evaluations()}
    assert not evaluations["nulls"].passed and evaluations["nulls"].severity == dg.AssetCheckSeverity.ERROR
    assert evaluations["drift"].severity == dg.AssetCheckSeverity.WARN
    assert store.branch_head(REPO, "main") == main_before

    # The waived failure alone: published, shown as a WARN failure with the reason beside the findings.
    flipped.write_parquet(path)
    result = dg.materialize(assets, partition_key=DAY.isoformat(), instance=instance, resources=resources)
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    drift = evaluations["drift"]
    assert not drift.passed and drift.severity == dg.AssetCheckSeverity.WARN
    assert drift.metadata["waived"].value == REASON
    assert "label relationship" in drift.description and drift.description.startswith(f"waived ({REASON})")
    assert all(e.passed for name, e in evaluations.items() if name != "drift")
    merge = store.get_commit(REPO, store.branch_head(REPO, "main"))
    assert merge.metadata["partition"] == DAY.isoformat()
    assert merge.metadata["waived"] == f"drift: {REASON}"


@pytest.mark.parametrize(("waivers", "words"), [
    ([{"day": "2013-06-12", "checks": ["nul"], "reason": REASON}], "unknown check(s) ['nul']"),
    ([{"day": "2013-06-12", "checks": ["drift"], "reason": REASON}] * 2, "2013-06-12 is waived twice"),
    ([{"day": "2013-06-12", "checks": ["drift"], "reason": "why"}], "at least 10 characters"),
    ([{"day": "2013-06-12", "checks": [], "reason": REASON}], "at least 1 item"),
])
def test_bad_waivers_are_refused_by_the_spec(bundled_spec_dict, waivers, words):
    with pytest.raises(ValueError, match=None) as info:
        model_spec(bundled_spec_dict, source=whole(bundled_spec_dict["source"]), validation={"waivers": waivers})
    assert words in str(info.value)


def test_waivers_do_not_change_the_snapshot_code_version(bundled_spec_dict):
    from ml_assets.pipeline.graph import ModelGraph, Stage

    plain = model_spec(bundled_spec_dict, source=whole(bundled_spec_dict["source"]), validation={"waivers": []})
    waived = model_spec(bundled_spec_dict, source=whole(bundled_spec_dict["source"]), validation={"waivers": [{"day": "2013-06-12", "checks": ["drift"], "reason": REASON}]})
    key = ModelGraph(plain).key(Stage.VALIDATED_SNAPSHOT)
    versions = [build_validated_snapshot(s).code_versions_by_key[key] for s in (plain, waived)]
    assert versions[0] == versions[1]
