"""Each model a Dagster component: the real `dg` CLI lists, checks and scaffolds models.

Every `dg` call loads the code location (seconds each), so the calls are few: the checkout's
bundled models once each for `dg list defs` and `dg check defs`, and one temporary standard dg
project (create-dagster's layout: its own definitions.py loading its defs folder; the adoption test
makes one with create-dagster itself) shared by the scaffolding tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml
from jsonschema import Draft202012Validator

from ml_assets.components import ModelComponent, render_skeleton
from ml_assets.model_files import (
    COMPONENT_TYPE,
    load_component_spec,
    load_model_spec,
    load_model_specs,
)
from ml_assets.pipeline.graph import DAILY_STAGES as STAGES
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import SpecError, load_spec
from ml_assets.spec_schema import COMPONENT_SCHEMA, PACKAGED, SPEC_SCHEMA, stale
from ml_assets_tests.helpers import VENV_BIN, cli_env

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p.stem for p in BUNDLED_MODELS_DIR.glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema="
# A standard dg project, as create-dagster makes one (the package at the root instead of under src/,
# so that it imports from the working directory without an install).
PROJECT_TOML = """\
[project]
name = "my-models"
version = "0"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "my_models"
"""
DEFINITIONS = """\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
"""
OWN_ASSET = """\
import dagster as dg


@dg.asset
def orders_summary() -> None:
    \"\"\"The project's own asset, beside its models.\"\"\"
"""


def run_dg(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    env = cli_env(VIRTUAL_ENV=str(VENV_BIN.parent), ML_ASSETS_ENV="local", COLUMNS="200", NO_COLOR="1",
                  DO_NOT_TRACK="1")
    env.pop("DAGSTER_HOME", None)  # an ephemeral instance: nothing here writes runs
    env.pop("ML_ASSETS_MODELS_DIR", None)
    env.pop("ML_ASSETS_HOME", None)
    if home is not None:
        env["ML_ASSETS_HOME"] = str(home)
    return subprocess.run([str(VENV_BIN / "dg"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def asset_keys(listing: subprocess.CompletedProcess) -> set[str]:
    assert listing.returncode == 0, listing.stderr
    return {asset["asset_key"] for asset in json.loads(listing.stdout)["assets"]}


def new_project(root: Path, package_name: str = "my_models") -> Path:
    """A standard project at ``root``; returns its defs folder. Tests that import the project in
    their own process give each project its package name: Python keeps the first one imported."""
    package = root / package_name
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_TOML.replace('"my_models"', f'"{package_name}"'))
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "defs" / "__init__.py").write_text("")
    return package / "defs"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A standard dg project with an asset of its own and one scaffolded model."""
    root = tmp_path_factory.mktemp("project")
    defs = new_project(root)
    (defs / "own.py").write_text(OWN_ASSET)
    scaffolded = run_dg("scaffold", "defs", COMPONENT_TYPE, "arrivals", cwd=root)
    assert scaffolded.returncode == 0, scaffolded.stdout + scaffolded.stderr
    return root


def test_dg_lists_every_bundled_models_assets(tmp_path):
    keys = asset_keys(run_dg("list", "defs", "--json", cwd=REPO, home=tmp_path))
    assert {f"{model}/{stage}" for model in BUNDLED for stage in STAGES} <= keys


def test_dg_checks_the_bundled_models(tmp_path):
    checked = run_dg("check", "defs", cwd=REPO, home=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All component YAML validated successfully." in checked.stdout
    assert "All definitions loaded successfully." in checked.stdout


def test_scaffolded_model_checks_in_a_standard_project_beside_its_own_assets(project):
    defs_yaml = project / "my_models" / "defs" / "arrivals" / "defs.yaml"
    assert load_component_spec(defs_yaml).name == "arrivals"
    # The model brings its resources and its jobs' executor: no code of the project's, no variable.
    checked = run_dg("check", "defs", cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    keys = asset_keys(run_dg("list", "defs", "--json", cwd=project))
    assert {f"arrivals/{stage}" for stage in STAGES} | {"orders_summary"} <= keys
    assert not any(key.startswith(tuple(f"{b}/" for b in BUNDLED)) for key in keys), "the bundled models stay out"


def test_dg_check_defs_reports_a_broken_spec_in_the_specs_own_words(tmp_path):
    defs = new_project(tmp_path)
    broken = defs / "late_flights" / "defs.yaml"
    broken.parent.mkdir()
    broken.write_text(render_skeleton("late_flights", broken.parent).replace(
        "  evaluation:", "  training: {epochs: 0}\n  evaluation:"))
    with pytest.raises(SpecError) as raised:
        load_component_spec(broken)
    assert "training.epochs: Input should be greater than 0" in str(raised.value)
    checked = run_dg("check", "defs", cwd=tmp_path, home=tmp_path / "home")
    assert checked.returncode == 1
    assert str(raised.value) in checked.stdout + checked.stderr
    assert not (tmp_path / "home").exists(), "nothing is written for a spec that does not load"


def test_dg_check_yaml_reports_a_broken_component_file(tmp_path):
    defs = new_project(tmp_path)
    broken = defs / "late_flights" / "defs.yaml"
    broken.parent.mkdir()
    broken.write_text(render_skeleton("late_flights", broken.parent).replace("\nattributes:", "\nattribute:"))
    checked = run_dg("check", "yaml", cwd=tmp_path, home=tmp_path / "home")
    assert checked.returncode == 1
    assert f"{broken}:" in checked.stdout and "attribute" in checked.stdout


# The rest runs no dg: the two file forms, the loader and the published schemas.

def test_both_forms_word_a_broken_spec_alike(tmp_path, spec_dict):
    spec_dict["training"]["epochs"] = 0
    plain = tmp_path / "flights_delay.yaml"
    plain.write_text(yaml.safe_dump(spec_dict, sort_keys=False))
    component = tmp_path / "component" / "flights_delay" / "defs.yaml"
    component.parent.mkdir(parents=True)
    component.write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": spec_dict}, sort_keys=False))
    with pytest.raises(SpecError) as from_plain:
        load_spec(plain)
    with pytest.raises(SpecError) as from_component:
        load_component_spec(component)
    assert str(from_component.value) == str(from_plain.value).replace(str(plain), str(component))


def test_component_file_names_its_model_by_folder_and_holds_only_a_model(tmp_path, spec_dict):
    path = tmp_path / "other_name" / "defs.yaml"
    path.parent.mkdir()
    for document, message in [
        ({"type": COMPONENT_TYPE, "attributes": spec_dict}, "name: 'flights_delay' must match the folder name"),
        ({"type": "dagster.DefsFolderComponent", "attributes": spec_dict}, f"type: expected {COMPONENT_TYPE}"),
        ({"type": COMPONENT_TYPE, "attributes": spec_dict, "post_processing": {}}, "post_processing: a model's"),
        ({"type": COMPONENT_TYPE}, "attributes: expected a mapping of spec fields"),
    ]:
        path.write_text(yaml.safe_dump(document))
        with pytest.raises(SpecError, match=message):
            load_component_spec(path)


def test_models_directory_loads_both_forms_and_refuses_a_name_twice(tmp_path, spec_dict):
    shutil.copy(BUNDLED_MODELS_DIR / "airport_day.yaml", tmp_path)
    component = tmp_path / "team" / "flights_delay" / "defs.yaml"  # folders may group models
    component.parent.mkdir(parents=True)
    component.write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": spec_dict}))
    assert [s.name for s in load_model_specs(tmp_path)] == ["airport_day", "flights_delay"]
    assert load_model_spec(tmp_path, "flights_delay").name == "flights_delay"
    (tmp_path / "flights_delay.yaml").write_text(yaml.safe_dump(spec_dict))
    with pytest.raises(SpecError, match="'flights_delay' is also declared by"):
        load_model_specs(tmp_path)


def test_dagster_loads_a_component_file_through_the_spec(tmp_path, monkeypatch):
    good, bad = tmp_path / "arrivals" / "defs.yaml", tmp_path / "late" / "defs.yaml"
    for path in (good, bad):
        path.parent.mkdir()
        path.write_text(render_skeleton(path.parent.name, path.parent))
    bad.write_text(bad.read_text().replace("  evaluation:", "  training: {epochs: 0}\n  evaluation:"))
    monkeypatch.chdir(good.parent)  # dagster's stand-alone loading roots its tree at the working directory
    (model,) = ModelComponent.from_yaml_path(good).components
    assert model.spec.name == "arrivals"
    # The model brings the platform's resources with it, so its definitions resolve on their own.
    built = dg.build_defs_for_component(model)
    assert {f"arrivals/{stage}" for stage in STAGES} <= {k.to_user_string() for a in built.assets for k in a.keys}
    assert {"tracking", "version_store", "links", "launcher"} <= set(built.resources)
    assert built.resolve_job_def("arrivals_daily").executor_def is dg.in_process_executor
    monkeypatch.chdir(bad.parent)
    with pytest.raises(Exception) as raised:
        ModelComponent.from_yaml_path(bad)
    assert isinstance(raised.value.__cause__, SpecError)
    assert f"{bad}: training.epochs: Input should be greater than 0" in str(raised.value.__cause__)


def test_published_schemas_are_current():
    assert stale() == [], "run: python -m ml_assets.spec_schema"


def _as_an_editor_reads(value: object) -> object:
    # YAML 1.2 (editors, dg) reads 2013-01-01 as text; PyYAML as a date.
    if isinstance(value, dict):
        return {k: _as_an_editor_reads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_an_editor_reads(v) for v in value]
    return value.isoformat() if isinstance(value, dt.date) else value


def test_bundled_specs_and_the_skeleton_point_at_a_schema_that_accepts_them(tmp_path):
    spec_schema = Draft202012Validator(json.loads((PACKAGED / SPEC_SCHEMA).read_text()))
    for path in sorted(BUNDLED_MODELS_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith(MODELINE)
        assert (path.parent / first.removeprefix(MODELINE)).resolve() == (PACKAGED / SPEC_SCHEMA).resolve()
        assert list(spec_schema.iter_errors(_as_an_editor_reads(yaml.safe_load(path.read_text())))) == []
    target = tmp_path / "arrivals"
    text = render_skeleton("arrivals", target, REPO)
    first = text.splitlines()[0]
    assert (target / first.removeprefix(MODELINE)).resolve() == (PACKAGED / COMPONENT_SCHEMA).resolve()
    component_schema = Draft202012Validator(json.loads((PACKAGED / COMPONENT_SCHEMA).read_text()))
    assert list(component_schema.iter_errors(_as_an_editor_reads(yaml.safe_load(text)))) == []
    assert not os.path.isabs(first.removeprefix(MODELINE))


def _files_model(spec_dict: dict, rows_path: str) -> dict:
    data = {**spec_dict, "name": "late"}
    data["source"] = {"kind": "files", "rows": {"path": rows_path, "format": "csv"}}
    data["features"] = {**spec_dict["features"], "joins": [], "rolling": []}
    data["features"]["numeric"] = ["hour", "minute"]
    data["validation"] = {}
    return data


def test_a_model_declared_twice_in_a_project_names_both_files(tmp_path, spec_dict, monkeypatch):
    first, second = tmp_path / "team_a" / "late" / "defs.yaml", tmp_path / "team_b" / "late" / "defs.yaml"
    for path in (first, second):
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": _files_model(spec_dict, "/data/{date}.csv")}))
    monkeypatch.chdir(tmp_path)  # the stand-alone loader's defs folder
    with pytest.raises(Exception) as raised:
        ModelComponent.from_yaml_path(first)
    assert f"{first}: name: model 'late' is also declared by {second}" in str(raised.value.__cause__)


def test_dg_templates_render_alike_for_dg_and_the_cli(tmp_path, spec_dict, monkeypatch):
    defs = new_project(tmp_path, "templates_project")
    data = _files_model(spec_dict, "{{ context.project_root }}/data/{date}.csv")
    data["description"] = "2013"  # a number-like string stays a string (dg's native rendering would not)
    path = defs / "late" / "defs.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": data}))
    from_cli = load_component_spec(path)
    assert from_cli.source.rows.path == f"{tmp_path.resolve()}/data/{{date}}.csv"
    assert from_cli.description == "2013"
    monkeypatch.syspath_prepend(str(tmp_path))  # the project's package, as an install would make it importable
    from dagster.components.core.component_tree import ComponentTree

    from_dg = ComponentTree.for_project(path).load_component(path.parent, ModelComponent)
    assert from_dg.spec == from_cli


def test_the_alerts_component_watches_the_projects_models_in_production(tmp_path, spec_dict, monkeypatch):
    from dagster.components.core.component_tree import ComponentTree

    from ml_assets.components import AlertsComponent

    defs = new_project(tmp_path, "alerts_project")
    model = defs / "late" / "defs.yaml"
    model.parent.mkdir()
    model.write_text(yaml.safe_dump({"type": COMPONENT_TYPE, "attributes": _files_model(spec_dict, "/x/{date}.csv")}))
    (defs / "alerts").mkdir()
    (defs / "alerts" / "defs.yaml").write_text("type: ml_assets.components.AlertsComponent\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in {"ML_ASSETS_ENV": "production", "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
                        "ML_ASSETS_ARTIFACTS_URL": "s3://b/a", "ML_ASSETS_CHECKPOINTS_URL": "s3://b/c"}.items():
        monkeypatch.setenv(name, value)
    tree = ComponentTree.for_project(defs)
    alerts = tree.load_component(defs / "alerts", AlertsComponent)
    built = dg.build_defs_for_component(alerts)
    sensors = {s.name: s for s in built.sensors}
    assert set(sensors) == {"run_failure_alerts", "lifecycle_notifications"}
    assert "of late to $ML_ASSETS_ALERT_WEBHOOK_URL" in sensors["lifecycle_notifications"].description
    whole = tree.build_defs()  # with the model: the same resources, merged
    assert {"run_failure_alerts", "late_promotion_sensor"} <= {s.name for s in whole.sensors}
    monkeypatch.setenv("ML_ASSETS_ENV", "local")
    assert dg.build_defs_for_component(alerts).sensors == []
