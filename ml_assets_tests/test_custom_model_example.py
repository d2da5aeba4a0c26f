"""A model the platform did not write, end to end: the FT-Transformer example (examples/ft_transformer),
judged against the built-in model's champion (its rival) by the same gate, through the real
`dagster asset materialize` CLI to a registered MLflow version whose code travels
with it (a fresh process without the example on its path loads and serves it), and `ml-assets
reproduce` rebuilds its weights bit for bit, or names the changed file when the code moved on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from ml_assets.definitions import build_definitions
from ml_assets.registry.record import VersionTags
from ml_assets.settings import BUNDLED_MODELS_DIR, load_settings
from ml_assets.spec import load_spec
from ml_assets_tests.helpers import cli_env
from ml_assets_tests.test_examples import run_example

pytestmark = pytest.mark.e2e
EXAMPLE = BUNDLED_MODELS_DIR.parents[1] / "examples" / "ft_transformer"
NAME = "flights_delay_ft"
RIVAL = "flights_delay"


def cut_down(spec: dict) -> dict:
    """A spec made cheap: a 3-day window, 2 epochs, one process, and a gate that reports rather than
    requires (this tests the platform's path; `make demo` shows the models' quality)."""
    spec["training"].update(window_days=3, validation_days=1, epochs=2, early_stopping={"patience": 0},
                            processes_per_node=1)
    spec["training"].pop("warm_start", None)  # a 3-day window is shorter than its fine-tunes' days
    spec["promotion"].update(beat_baseline=False, min_improvement=-1.0, floors={})
    if "tuning" in spec:
        spec["tuning"].update(trials=2, max_epochs=1, startup_trials=2, pruner={"kind": "none"})
    return spec


@pytest.fixture
def models(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's spec and the built-in model it names as its rival, both cut down; the example's
    code copied so that the test can change it."""
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE / "ft_transformer", code / "ft_transformer")
    spec = cut_down(yaml.safe_load((EXAMPLE / f"{NAME}.yaml").read_text()))
    spec["model"]["code_path"] = str(code)
    assert spec["promotion"]["rival"] == RIVAL
    out = tmp_path / "models"
    out.mkdir()
    (out / f"{NAME}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    rival = cut_down(yaml.safe_load((BUNDLED_MODELS_DIR / f"{RIVAL}.yaml").read_text()))
    (out / f"{RIVAL}.yaml").write_text(yaml.safe_dump(rival, sort_keys=False))
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(out))
    return out


def reproduce(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ml_assets.cli", "reproduce", NAME, "--version", "1", *extra],
                          capture_output=True, text=True, timeout=600, env=cli_env())


def test_an_own_model_trains_registers_serves_without_its_package_and_reproduces(models, tmp_path):
    # The built-in model first, made champion: the example's gate compares it on the same rows.
    run_example(RIVAL, models)
    promoted = subprocess.run([sys.executable, "-m", "ml_assets.cli", "promote", RIVAL, "1", "--reason", "the rival"],
                              capture_output=True, text=True, timeout=300, env=cli_env())
    assert promoted.returncode == 0, promoted.stderr[-3000:]

    report, version, day = run_example(NAME, models)
    tags = VersionTags.from_tags(version.tags)
    assert tags.model_factory == "ft_transformer.model:build" and len(tags.model_code_sha256) == 64
    assert f"vs rival {RIVAL} v1 " in report["gate_reason"]

    # A fresh process in which the example's package cannot be imported: the registered model
    # brings its code (MLflow code_paths) and predicts the day's feature rows.
    features = dg.DagsterInstance.get().fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey([NAME, "features"]), asset_partitions=[day.isoformat()]),
        limit=1).records[0].asset_materialization.metadata
    rows = tmp_path / "rows.parquet"
    pl.read_parquet(features["uri"].value).drop("delayed").head(64).write_parquet(rows)
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        import mlflow, polars as pl
        assert importlib.util.find_spec("ft_transformer") is None, "the example is importable here"
        mlflow.set_tracking_uri({load_settings().mlflow_tracking_uri!r})
        model = mlflow.pyfunc.load_model("models:/{NAME}/{version.version}")
        out = model.predict(pl.read_parquet({str(rows)!r}).to_pandas())
        print(json.dumps([float(x) for x in out]))
    """)
    served = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env=cli_env())
    assert served.returncode == 0, served.stderr[-3000:]
    probabilities = json.loads(served.stdout.strip().splitlines()[-1])
    assert len(probabilities) == 64 and all(0 < p < 1 for p in probabilities)

    done = reproduce()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"reproduced bit for bit; weights sha256 {tags.checkpoint_sha256}" in done.stdout

    # The factory's own hyperparameters (the spec's params.* space) are searched by the
    # hyperparameters asset, as the built-in model's are.
    tune = build_definitions(load_settings()).resolve_job_def(f"{NAME}_tune")
    tuned = tune.execute_in_process(instance=dg.DagsterInstance.get())
    assert tuned.success
    [study] = tuned.asset_materializations_for_node(f"{NAME}__hyperparameters")
    assert study.metadata["trials_completed"].value == 2
    best = study.metadata["best_params"].value
    assert {"params.d_token", "params.n_blocks", "params.attention_dropout", "learning_rate"} <= set(best)
    assert best["params.d_token"] in (16, 32, 64) and isinstance(best["params.n_blocks"], int)

    # The factory's code changed after training: reproducing names the file, and the copy
    # registered with the version still rebuilds the same weights.
    model_file = Path(load_spec(models / f"{NAME}.yaml").model.code_path) / "ft_transformer" / "model.py"
    model_file.write_text(model_file.read_text() + "\n# a later edit\n")
    changed = reproduce()
    assert changed.returncode == 1
    assert "ft_transformer/model.py" in changed.stderr and "changed since it was pinned" in changed.stderr
    registered = reproduce("--registered-code")
    assert registered.returncode == 0, registered.stderr[-3000:]
    assert tags.checkpoint_sha256 in registered.stdout
