"""Per-check settings in the spec: ``severity: warn`` reports a failure without stopping the merge,
``enabled: false`` leaves a check out; bad settings are refused when the spec loads.

Runs the real raw_data and validated_snapshot assets on a temporary Dagster instance.
"""

import copy
import datetime as dt
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from ml_assets.ingest.assets import build_raw_data
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.resources import DagsterLinksResource, LocalVersionStoreResource
from ml_assets.spec import ModelSpec, SpecError, parse_spec
from ml_assets.validation.assets import build_validated_snapshot
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import flights_files, spec_data

DAY = dt.date(2013, 6, 19)
REPO = "flights-delay"
i = pl.int_range(pl.len())


def test_a_warning_is_reported_and_main_still_advances(tmp_path, bundled_spec_dict):
    data = spec_data(bundled_spec_dict, validation=dict(checks={"ranges_and_categories": {"severity": "warn"}, "freshness": {"enabled": False}}, quarantine={"max_fraction": 0.01}))
    data["source"] = flights_files(tmp_path / "data", [DAY])
    spec = ModelSpec.model_validate(data)
    path = tmp_path / "data" / "flights" / f"{DAY}.parquet"
    # Five hours out of range (a warning) and 60 rows dated another day (the check is off).
    pl.read_parquet(path).with_columns(
        pl.when(i < 5).then(31).otherwise(pl.col("hour")).alias("hour"),
        pl.when(i < 60).then(pl.lit("2013-06-23T14:00:00Z")).otherwise(pl.col("time_hour")).alias("time_hour"),
    ).write_parquet(path)
    snapshot = build_validated_snapshot(spec)
    declared = {s.name: s for s in snapshot.check_specs}
    assert "freshness" not in declared and not declared["ranges_and_categories"].blocking
    assert declared["drift"].blocking and "never blocks" in declared["ranges_and_categories"].description
    (tmp_path / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster"))
    result = dg.materialize([build_raw_data(spec), snapshot], partition_key=DAY.isoformat(), instance=instance,
                            resources={"version_store": LocalVersionStoreResource(root=str(tmp_path / "versions")),
                                       "links": DagsterLinksResource()})

    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert "freshness" not in evaluations and len(evaluations) == 6
    ranges = evaluations["ranges_and_categories"]
    assert not ranges.passed and ranges.severity == dg.AssetCheckSeverity.WARN
    assert "hour: 5 rows above 23 (highest 31)" in ranges.description
    assert ranges.metadata["quarantined_rows"].value == 0  # quarantine acts on blocking failures only
    assert all(e.passed for name, e in evaluations.items() if name != "ranges_and_categories")
    store = LocalVersionStore(tmp_path / "versions")
    merge = store.get_commit(REPO, store.branch_head(REPO, "main"))
    assert merge.metadata["partition"] == DAY.isoformat()
    assert merge.metadata["warnings"].startswith("ranges_and_categories: hour: 5 rows above 23")
    assert "ranges_and_categories" not in merge.metadata["checks_passed"]
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any("check ranges_and_categories (severity warn) failed, published anyway" in m for m in logs)


def test_a_disabled_check_is_neither_run_nor_loaded(bundled_spec_dict):
    target = "no_such_package.checks:anything"
    data = spec_data(bundled_spec_dict, validation=dict(checks={"custom_anything": {"enabled": False}, "drift": {"enabled": False}}, custom_checks=[target]))
    spec = ModelSpec.model_validate(data)
    snapshot = build_validated_snapshot(spec)  # a custom check that cannot be imported is not loaded while off
    assert {s.name for s in snapshot.check_specs} == {"schema", "nulls", "ranges_and_categories", "duplicate_keys",
                                                       "volume", "freshness"}
    assert "Checks disabled by the spec: drift, custom_anything." in snapshot.descriptions_by_key[
        ModelGraph(spec).key(Stage.VALIDATED_SNAPSHOT)]

    from ml_assets.ingest.sources import read_day
    from ml_assets.validation.run import run_checks

    outcomes = run_checks(spec, read_day(spec, DAY).tables["rows"], DAY, {})
    assert [o.name for o in outcomes] == [s.name for s in snapshot.check_specs]


def test_check_settings_change_the_snapshot_code_version(bundled_spec_dict):
    key = ModelGraph(ModelSpec.model_validate(bundled_spec_dict)).key(Stage.VALIDATED_SNAPSHOT)
    versions = {build_validated_snapshot(ModelSpec.model_validate(spec_data(bundled_spec_dict, validation=dict(checks=checks))))
                .code_versions_by_key[key] for checks in ({}, {"drift": {"severity": "warn"}},
                                                          {"drift": {"enabled": False}})}
    assert len(versions) == 3


@pytest.mark.parametrize(("change", "words"), [
    (lambda v: v.update(checks={"nul": {"severity": "warn"}}), "validation: checks: unknown check(s) ['nul']"),
    (lambda v: v.update(checks={"drift": {"severity": "loud"}}), "validation.checks.drift.severity: Input should be"),
    (lambda v: v["drift"].update(current_days=30), "validation.drift: current_days (30) is larger than "
                                                   "reference_days (14)"),
    (lambda v: v["drift"].update(min_reference_days=20), "validation.drift: min_reference_days (20) is larger"),
    (lambda v: v["drift"].update(significance=0.7), "validation.drift.significance: Input should be less than 0.5"),
    (lambda v: v["volume"].update(min_rows=-1), "validation.volume.min_rows: Input should be greater than or equal"),
])
def test_settings_that_cannot_work_are_refused_with_file_field_and_reason(bundled_spec_dict, change, words):
    data = copy.deepcopy(bundled_spec_dict)
    data["validation"].setdefault("drift", {})
    change(data["validation"])
    path = Path("models/flights_delay.yaml")
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(data), path)
    assert f"{path}: {words}" in str(info.value)
