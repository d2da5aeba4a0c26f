"""Each model a Dagster component: the real `dg` CLI lists, checks and scaffolds models.

Every `dg` call loads the code location (seconds each), so the calls are few: the checkout's
bundled models once each for `dg list defs` and `dg check defs`, and one temporary dg project (a
models directory of one's own, docs/components.md) shared by the scaffolding tests.
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
from ml_assets.defs.common import STAGES
from ml_assets.model_files import (
    COMPONENT_TYPE,
    load_component_spec,
    load_model_spec,
    load_model_specs,
)
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import SpecError, load_spec
from ml_assets.spec_schema import COMPONENT_SCHEMA, REPO, SPEC_SCHEMA, stale
from ml_assets_tests.conftest import VENV_BIN, cli_env

pytestmark = pytest.mark.e2e

BUNDLED = sorted(p.stem for p in BUNDLED_MODELS_DIR.glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema="
# A dg project around a models directory: what docs/components.md tells a user to write.
PROJECT_TOML = """\
[project]
name = "my-models"
version = "0"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "models"
defs_module = "models"
code_location_target_module = "ml_assets"
code_location_name = "ml_assets"
registry_modules = ["ml_assets.components"]
"""


def run_dg(*args: str, cwd: Path, models_dir: Path | None = None, home: Path) -> subprocess.CompletedProcess:
    env = cli_env(VIRTUAL_ENV=str(VENV_BIN.parent), ML_ASSETS_ENV="local", ML_ASSETS_HOME=str(home),
                  COLUMNS="200", NO_COLOR="1", DO_NOT_TRACK="1")
    env.pop("DAGSTER_HOME", None)  # an ephemeral instance: nothing here writes runs
    env.pop("ML_ASSETS_MODELS_DIR", None)
    if models_dir is not None:
        env["ML_ASSETS_MODELS_DIR"] = str(models_dir)
    return subprocess.run([str(VENV_BIN / "dg"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def asset_keys(listing: subprocess.CompletedProcess) -> set[str]:
    assert listing.returncode == 0, listing.stderr
    return {asset["asset_key"] for asset in json.loads(listing.stdout)["assets"]}


def new_project(root: Path) -> Path:
    (root / "models").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_TOML)
    return root / "models"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A dg project with one plain spec and one scaffolded model."""
    root = tmp_path_factory.mktemp("project")
    models = new_project(root)
    shutil.copy(BUNDLED_MODELS_DIR / "airport_day.yaml", models)
    scaffolded = run_dg("scaffold", "defs", COMPONENT_TYPE, "arrivals", cwd=root, models_dir=models,
                        home=root / "home")
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


def test_scaffolded_model_loads_and_builds_its_assets(project):
    defs_yaml = project / "models" / "arrivals" / "defs.yaml"
    assert defs_yaml.read_text().startswith(MODELINE)
    assert load_component_spec(defs_yaml).name == "arrivals"
    checked = run_dg("check", "defs", cwd=project, models_dir=project / "models", home=project / "home")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listing = run_dg("list", "defs", "--json", cwd=project, models_dir=project / "models", home=project / "home")
    keys = asset_keys(listing)
    assert {f"{model}/{stage}" for model in ("arrivals", "airport_day") for stage in STAGES} <= keys


def test_dg_check_defs_reports_a_broken_spec_in_the_specs_own_words(tmp_path):
    models = new_project(tmp_path)
    broken = models / "late_flights" / "defs.yaml"
    broken.parent.mkdir()
    broken.write_text(render_skeleton("late_flights", broken.parent).replace(
        "  evaluation:", "  training: {epochs: 0}\n  evaluation:"))
    with pytest.raises(SpecError) as raised:
        load_component_spec(broken)
    assert "training.epochs: Input should be greater than 0" in str(raised.value)
    checked = run_dg("check", "defs", cwd=tmp_path, models_dir=models, home=tmp_path / "home")
    assert checked.returncode == 1
    assert str(raised.value) in checked.stdout + checked.stderr


def test_dg_check_yaml_reports_a_broken_component_file(tmp_path):
    models = new_project(tmp_path)
    broken = models / "late_flights" / "defs.yaml"
    broken.parent.mkdir()
    broken.write_text(render_skeleton("late_flights", broken.parent).replace("\nattributes:", "\nattribute:"))
    checked = run_dg("check", "yaml", cwd=tmp_path, models_dir=models, home=tmp_path / "home")
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
    # The resources come with the code location (ml_assets.definitions), not with each model.
    built = dg.build_defs_for_component(model)
    assert {f"arrivals/{stage}" for stage in STAGES} <= {k.to_user_string() for a in built.assets for k in a.keys}
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
    spec_schema = Draft202012Validator(json.loads((REPO / SPEC_SCHEMA).read_text()))
    for path in sorted(BUNDLED_MODELS_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith(MODELINE)
        assert (path.parent / first.removeprefix(MODELINE)).resolve() == (REPO / SPEC_SCHEMA).resolve()
        assert list(spec_schema.iter_errors(_as_an_editor_reads(yaml.safe_load(path.read_text())))) == []
    target = tmp_path / "arrivals"
    text = render_skeleton("arrivals", target, REPO)
    first = text.splitlines()[0]
    assert (target / first.removeprefix(MODELINE)).resolve() == (REPO / COMPONENT_SCHEMA).resolve()
    component_schema = Draft202012Validator(json.loads((REPO / COMPONENT_SCHEMA).read_text()))
    assert list(component_schema.iter_errors(_as_an_editor_reads(yaml.safe_load(text)))) == []
    assert not os.path.isabs(first.removeprefix(MODELINE))
