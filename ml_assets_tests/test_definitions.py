import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from ml_assets.definitions import build_definitions
from ml_assets.instance import LOCAL_INSTANCE
from ml_assets.pipeline.graph import DAILY_STAGES as STAGES
from ml_assets.settings import load_settings
from ml_assets.spec import SpecError
from ml_assets_tests.helpers import cli_env, write_spec


def _defs(models_dir=None) -> dg.Definitions:
    env = {"ML_ASSETS_HOME": "/tmp/unused-home"}
    if models_dir is not None:
        env["ML_ASSETS_MODELS_DIR"] = str(models_dir)
    return build_definitions(load_settings(env))


def test_bundled_model_becomes_a_daily_partitioned_group():
    defs = _defs()
    graph = defs.resolve_asset_graph()
    keys = {dg.AssetKey(["flights_delay", stage]) for stage in STAGES}
    assert keys <= set(graph.get_all_asset_keys())
    for key in keys:
        node = graph.get(key)
        assert node.group_name == "flights_delay"
        assert node.code_version
        assert node.kinds
        assert node.description
        partitions = node.partitions_def
        assert isinstance(partitions, dg.DailyPartitionsDefinition)
        assert partitions.timezone == "America/New_York"
        assert partitions.get_first_partition_key() == "2013-01-01"
        assert partitions.get_last_partition_key() == "2013-12-31"
    assert graph.get(dg.AssetKey(["flights_delay", "trained_checkpoint"])).kinds == {"pytorch"}
    checks = {c.name for c in graph.get(dg.AssetKey(["flights_delay", "validated_snapshot"])).check_keys}
    assert checks == {"schema", "nulls", "ranges_and_categories", "duplicate_keys", "volume", "freshness", "drift"}
    schedule = defs.resolve_schedule_def("flights_delay_daily_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert defs.resolve_job_def("flights_delay_daily").partitions_def is not None


def test_lineage_edges_follow_the_data_flow():
    graph = _defs().resolve_asset_graph()

    def parents(stage: str) -> set[str]:
        return {k.path[-1] for k in graph.get(dg.AssetKey(["flights_delay", stage])).parent_keys}

    assert parents("validated_snapshot") == {"raw_data"}
    assert parents("features") == {"validated_snapshot"}
    assert parents("trained_checkpoint") == {"features", "hyperparameters"}
    assert parents("evaluation_report") == {"trained_checkpoint", "features"}
    assert parents("registered_model") == {"trained_checkpoint", "evaluation_report"}


def test_second_spec_makes_a_second_independent_group(tmp_path, spec_dict):
    write_spec(tmp_path, spec_dict)
    spec_dict.update(name="flights_delay_minutes")
    spec_dict["target"] = {"name": "delay_minutes", "expression": "dep_delay", "task": "regression"}
    spec_dict["evaluation"] = {"metrics": ["rmse", "mae", "r2"], "slice_columns": ["carrier"]}
    spec_dict["promotion"] = {"primary_metric": "rmse", "mode": "approval_required"}
    write_spec(tmp_path, spec_dict)
    defs = _defs(tmp_path)
    graph = defs.resolve_asset_graph()
    groups = {graph.get(k).group_name for k in graph.get_all_asset_keys()}
    # production_model (and predictions, which it feeds) sit in their own group: "materialize the
    # group for a day" never promotes or scores.
    assert groups == {"flights_delay", "flights_delay_minutes", "flights_delay_production",
                      "flights_delay_minutes_production", "flights_delay_tuning", "flights_delay_minutes_tuning"}
    second = [k for k in graph.get_all_asset_keys() if k.path[0] == "flights_delay_minutes"]
    assert len(second) == len(STAGES) + 4  # + production_model, hyperparameters, predictions, model_monitor
    for key in second:
        assert all(p.path[0] == "flights_delay_minutes" for p in graph.get(key).parent_keys)
    # The promotion sensor runs by default only where the spec asks for automatic promotion.
    status = {name: defs.resolve_sensor_def(f"{name}_promotion_sensor").default_status
              for name in ("flights_delay", "flights_delay_minutes")}
    assert status == {"flights_delay": dg.DefaultSensorStatus.RUNNING,
                      "flights_delay_minutes": dg.DefaultSensorStatus.STOPPED}


def test_editing_the_feature_section_changes_features_code_version_only_there(tmp_path, spec_dict):
    write_spec(tmp_path / "a", spec_dict)
    spec_dict["features"]["numeric"].remove("minute")
    write_spec(tmp_path / "b", spec_dict)
    a, b = (_defs(tmp_path / d).resolve_asset_graph() for d in ("a", "b"))

    def version(graph, stage):
        return graph.get(dg.AssetKey(["flights_delay", stage])).code_version

    assert version(a, "features") != version(b, "features")
    assert version(a, "trained_checkpoint") != version(b, "trained_checkpoint")
    assert version(a, "raw_data") == version(b, "raw_data")
    assert version(a, "validated_snapshot") == version(b, "validated_snapshot")


def test_broken_spec_fails_definitions_loading_with_the_field(tmp_path, spec_dict):
    spec_dict["training"]["window_days"] = 1
    path = write_spec(tmp_path, spec_dict)
    with pytest.raises(SpecError, match=rf"{path}: training.window_days: Input should be greater than or equal to 3"):
        _defs(tmp_path)


def test_dagster_cli_validates_definitions(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "ml_assets"],
        capture_output=True, text=True, timeout=300, env=cli_env(ML_ASSETS_HOME=str(tmp_path), DAGSTER_HOME=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Validation successful for code location ml_assets" in proc.stderr + proc.stdout


def test_dagster_cli_reports_a_broken_spec(tmp_path, spec_dict):
    spec_dict["target"]["expression"] = "no_such_column > 1"
    write_spec(tmp_path / "models", spec_dict)
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "ml_assets"],
        capture_output=True, text=True, timeout=300,
        env=cli_env(ML_ASSETS_HOME=str(tmp_path), DAGSTER_HOME=str(tmp_path), ML_ASSETS_MODELS_DIR=str(tmp_path / "models")),
    )
    assert proc.returncode != 0
    assert f"{tmp_path / 'models' / 'flights_delay.yaml'}: target.expression: ['no_such_column'] not among" in proc.stderr + proc.stdout


def test_unsupported_environment_is_refused():
    with pytest.raises(ValueError, match=r"ML_ASSETS_ENV='kubernetes' is not supported; expected one of \['local', 'production', 'k8s'\]"):
        load_settings({"ML_ASSETS_ENV": "kubernetes"})



def test_runs_carry_the_team_and_priority_and_a_team_the_deployment_does_not_serve_is_refused(tmp_path, spec_dict):
    write_spec(tmp_path / "models", {**spec_dict, "team": "fraud", "priority": "high"})
    env = {"ML_ASSETS_HOME": str(tmp_path), "ML_ASSETS_MODELS_DIR": str(tmp_path / "models")}
    defs = build_definitions(load_settings({**env, "ML_ASSETS_TEAMS": "fraud,search"}))
    daily = defs.resolve_job_def("flights_delay_daily")
    assert daily.tags["ml_assets/team"] == daily.tags["ml_assets/training_team"] == "fraud"
    assert daily.tags["dagster/priority"] == "10"
    for job in ("flights_delay_ingest", "flights_delay_promote", "flights_delay_tune"):
        assert defs.resolve_job_def(job).tags["ml_assets/team"] == "fraud"
    with pytest.raises(SpecError, match="team: 'fraud' is not a team of this deployment; ML_ASSETS_TEAMS allows "
                                        "search, ranking"):
        build_definitions(load_settings({**env, "ML_ASSETS_TEAMS": "search,ranking"}))
    with pytest.raises(Exception, match="ML_ASSETS_TEAMS: team name 'Search' is invalid"):
        load_settings({**env, "ML_ASSETS_TEAMS": "Search"})


def test_the_daily_schedules_request_the_day_that_just_ended_in_the_models_timezone():
    import datetime as dt
    import zoneinfo

    defs = _defs()
    repository = defs.get_repository_def()
    new_york = zoneinfo.ZoneInfo("America/New_York")
    for name, hour, tags in (("flights_delay_daily_schedule", 2, {"ml_assets/retrain": "schedule"}),
                             ("flights_delay_score_schedule", 1, {})):
        schedule = defs.resolve_schedule_def(name)
        assert schedule.cron_schedule == f"0 {hour} * * *" and schedule.execution_timezone == "America/New_York"
        assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
        tick = dt.datetime(2013, 3, 5, hour, tzinfo=new_york)
        with dg.build_schedule_context(scheduled_execution_time=tick, repository_def=repository) as context:
            request = schedule.evaluate_tick(context).run_requests[0]
        assert request.partition_key == "2013-03-04"
        assert {k: request.tags[k] for k in tags} == tags
        first = dt.datetime(2013, 1, 1, hour, tzinfo=new_york)
        with dg.build_schedule_context(scheduled_execution_time=first, repository_def=repository) as ctx:
            assert schedule.evaluate_tick(ctx).run_requests == []  # the first day is not over yet


def test_the_checkouts_instance_config_is_the_packaged_one():
    """`make demo` copies the top-level dagster.yaml; a wheel's user gets the packaged one
    (`ml-assets instance`): both must configure the same instance."""
    top = Path(__file__).resolve().parents[1] / "dagster.yaml"
    assert top.read_text() == LOCAL_INSTANCE.read_text()
