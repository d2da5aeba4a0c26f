"""`ml-assets usage` end to end: a tiny model trained, tuned, promoted and scored by its real jobs in
a temporary home, then the real command, whose numbers must be the records' and which writes nothing."""

import datetime as dt
import json
import re
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.definitions import build_definitions
from ml_assets.instance import LOCAL_INSTANCE
from ml_assets.model_files import load_declared_specs
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.promotion import moves as promotion
from ml_assets.records.read import latest
from ml_assets.scoring.record import PredictionsRecord
from ml_assets.settings import load_settings
from ml_assets.spec import ModelSpec
from ml_assets.training.record import CheckpointRecord
from ml_assets.tuning.record import TunedRecord
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import VENV_BIN, cli_env, small_training, spec_data, write_spec

pytestmark = [pytest.mark.e2e, pytest.mark.torchrun]

DAY = dt.date(2013, 4, 10)
TEAM = "growth"
SECONDS = ("cpu_rank_seconds", "gpu_rank_seconds", "wall_seconds")


@pytest.fixture(scope="module")
def spent(tmp_path_factory) -> ModelSpec:
    """A home where flights_delay (team growth) trained once, ran a study of two trials and scored a day."""
    root = tmp_path_factory.mktemp("usage_e2e")
    data = small_training(spec_data(team=TEAM), window_days=3, epochs=1)
    data["tuning"] = {"trials": 2, "max_epochs": 1, "startup_trials": 1,
                      "space": {"learning_rate": {"low": 0.001, "high": 0.03, "log": True}}}
    write_spec(root / "models", data)
    (root / "home" / "dagster").mkdir(parents=True)
    (root / "home" / "dagster" / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ML_ASSETS_HOME", str(root / "home"))
        env.setenv("DAGSTER_HOME", str(root / "home" / "dagster"))
        env.setenv("ML_ASSETS_MODELS_DIR", str(root / "models"))
        env.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        settings = load_settings()
        defs, instance = build_definitions(settings), dg.DagsterInstance.get()
        [spec] = load_declared_specs(settings)
        graph = ModelGraph(spec)
        daily = defs.resolve_job_def(graph.daily_job)
        ingest = [graph.key(s) for s in (Stage.RAW_DATA, Stage.VALIDATED_SNAPSHOT, Stage.FEATURES)]
        for back in (3, 2, 1):
            day = (DAY - dt.timedelta(days=back)).isoformat()
            assert daily.execute_in_process(partition_key=day, instance=instance, asset_selection=ingest).success
        assert daily.execute_in_process(partition_key=DAY.isoformat(), instance=instance).success
        assert defs.resolve_job_def(graph.tune_job).execute_in_process(instance=instance).success
        client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
        store = LocalVersionStore(settings.version_store_root, objects_url=settings.objects_url)
        promotion.execute(client, store, spec, promotion.Request(spec.name, "promote", "1", "to score", "pytest"))
        score = defs.resolve_job_def(graph.score_job)
        assert score.execute_in_process(partition_key=DAY.isoformat(), instance=instance).success
        yield spec


def _usage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "ml-assets"), "usage", *args], capture_output=True, text=True,
                          timeout=300, env=cli_env())


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_the_command_reports_what_the_records_say_and_writes_nothing(spent):
    home = load_settings().home
    before = _files(home)
    as_json, as_table = _usage("--format", "json"), _usage()
    assert as_json.returncode == 0 and as_table.returncode == 0, as_json.stderr[-3000:] + as_table.stderr[-3000:]
    assert _files(home) == before

    document = json.loads(as_json.stdout)
    graph, instance = ModelGraph(spent), dg.DagsterInstance.get()
    [trained] = instance.fetch_materializations(graph.key(Stage.TRAINED_CHECKPOINT), limit=10).records
    result = CheckpointRecord.from_metadata(trained.asset_materialization.metadata).result
    study = latest(instance, graph.key(Stage.HYPERPARAMETERS), None, TunedRecord)
    [scored] = instance.fetch_materializations(graph.key(Stage.PREDICTIONS), limit=10).records
    stats = instance.get_run_stats(scored.run_id)
    items = {(i["work"], i["ref"]): i for i in document["items"]}
    assert {i["team"] for i in items.values()} == {TEAM} and {i["model"] for i in items.values()} == {spent.name}
    training = items["training", trained.run_id]
    assert [training[k] for k in SECONDS] == [getattr(result, k) for k in SECONDS]
    assert result.wall_seconds > 0 and result.cpu_rank_seconds == pytest.approx(
        result.world_size * result.wall_seconds, abs=0.002)
    for trial in study.spent():
        assert [items["trial", f"{study.study_name}#{trial.number}"][k] for k in SECONDS] == [
            getattr(trial.compute, k) for k in SECONDS]
    scoring = items["scoring", scored.run_id]
    assert scoring["wall_seconds"] == scoring["cpu_rank_seconds"] == round(stats.end_time - stats.start_time, 3)
    assert len(items) == 1 + len(study.spent()) + 1 == document["total"]["count"]
    [team] = document["teams"]
    assert team["team"] == TEAM and team["total"]["wall_seconds"] == pytest.approx(
        sum(i["wall_seconds"] for i in items.values()), abs=1e-3)

    rows = {tuple(re.split(r"\s{2,}", line)[:4]) for line in as_table.stdout.split("\n\n")[0].splitlines()}
    assert {(TEAM, spent.name, "training", "1"), (TEAM, spent.name, "trial", str(len(study.spent()))),
            (TEAM, spent.name, "scoring", "1"), (TEAM, "(all models)", "total", str(len(items)))} <= rows


def test_each_materialization_shows_its_runs_seconds_as_numbers_the_ui_plots(spent):
    graph, instance = ModelGraph(spent), dg.DagsterInstance.get()
    for stage in (Stage.TRAINED_CHECKPOINT, Stage.HYPERPARAMETERS, Stage.PREDICTIONS):
        [event] = instance.fetch_materializations(graph.key(stage), limit=1).records
        shown = event.asset_materialization.metadata
        assert all(isinstance(shown[k], dg.FloatMetadataValue) for k in SECONDS), stage
        assert shown["wall_seconds"].value > 0
    study = latest(instance, graph.key(Stage.HYPERPARAMETERS), None, TunedRecord)
    assert study.trials_run == len(study.spent()) == 2  # the study's first run ran every trial
    assert study.wall_seconds == pytest.approx(sum(t.compute.wall_seconds for t in study.spent()), abs=1e-3)
    scored = latest(instance, graph.key(Stage.PREDICTIONS), DAY.isoformat(), PredictionsRecord)
    assert scored.cpu_rank_seconds == scored.wall_seconds and scored.gpu_rank_seconds == 0.0


@pytest.mark.parametrize(("args", "says"), [
    (["--team", "nobody"], f"no team 'nobody' is known here; known teams: {TEAM}"),
    (["--model", "nothing_here"], "no model 'nothing_here' is declared here; known models: flights_delay"),
    (["--since", "last week"], "--since 'last week' is not a day: give it as YYYY-MM-DD (UTC)"),
])
def test_a_bad_query_exits_2_saying_what_is_known(spent, capsys, args, says):
    assert _in_process("usage", *args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines()[-1].startswith(f"ml-assets usage: {says}")


def test_since_counts_what_finished_from_that_day_on(spent, capsys):
    assert _in_process("usage", "--format", "json") == 0
    finished = sorted(dt.datetime.fromisoformat(i["finished"]).date() for i in json.loads(capsys.readouterr().out)["items"])
    counts = {}
    for day in (finished[0], finished[-1] + dt.timedelta(days=1)):
        assert _in_process("usage", "--since", day.isoformat(), "--format", "json") == 0
        counts[day] = json.loads(capsys.readouterr().out)["total"]["count"]
    assert list(counts.values()) == [len(finished), 0]


def _in_process(*args: str) -> int:
    """``ml-assets`` in this process (the subprocess's imports saved): its exit status."""
    from ml_assets import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    return int(exited.value.code or 0)
