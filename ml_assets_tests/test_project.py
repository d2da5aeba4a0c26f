"""A team's Dagster project: where ml_assets finds it, its models, its .env and its home; relative
paths in a spec; the URIs `ml-assets paths` prints."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy
import yaml

from ml_assets.ingest.sources import SourceError, read_day
from ml_assets.model_files import NO_MODELS, load_declared_spec, load_declared_specs
from ml_assets.project import find_project, project_at
from ml_assets.settings import BUNDLED_MODELS_DIR, load_settings, public_url
from ml_assets.spec import SpecError, load_spec
from ml_assets_tests.test_components import COMPONENT_TYPE, new_project

REPO = Path(__file__).resolve().parents[1]


def _model(spec_dict: dict, name: str, rows_path: str) -> dict:
    data = {**spec_dict, "name": name, "validation": {}}
    data["source"] = {"kind": "files", "rows": {"path": rows_path, "format": "csv"}}
    data["features"] = {**spec_dict["features"], "joins": [], "rolling": [], "numeric": ["hour", "minute"]}
    return data


def _component(defs: Path, folder: str, document: dict) -> Path:
    path = defs / folder / "defs.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_project_is_found_from_any_folder_inside_it_with_its_defs_folder(tmp_path):
    defs = new_project(tmp_path)
    (defs / "deeper").mkdir()
    found = find_project(defs / "deeper")
    assert found is not None and found.root == tmp_path and found.defs_dir == defs
    assert not found.is_this_checkout
    assert project_at(REPO).is_this_checkout and project_at(REPO).defs_dir == BUNDLED_MODELS_DIR
    # Installed, the folder above the package is site-packages, where create-dagster's template puts
    # the project's own pyproject.toml: that is not this checkout.
    assert not replace(project_at(REPO), name="flights_project").is_this_checkout
    assert find_project(tmp_path.parent) is None or find_project(tmp_path.parent).root != tmp_path


def test_settings_of_a_project_anchor_the_home_and_read_its_env_file_under_the_environment(tmp_path, monkeypatch):
    new_project(tmp_path)
    (tmp_path / ".env").write_text("ML_ASSETS_HOME=state\nML_ASSETS_EXECUTOR=multiprocess\n")
    elsewhere = tmp_path.parent
    monkeypatch.chdir(elsewhere)  # the home follows the project, not the working directory
    for name in ("ML_ASSETS_HOME", "ML_ASSETS_EXECUTOR", "ML_ASSETS_MODELS_DIR", "ML_ASSETS_ENV"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(project_root=tmp_path)
    assert settings.home == tmp_path / "state" and settings.executor == "multiprocess"
    assert settings.models_dirs == () and settings.project.root == tmp_path
    monkeypatch.setenv("ML_ASSETS_EXECUTOR", "in_process")  # the process's environment wins over .env
    assert load_settings(project_root=tmp_path).executor == "in_process"
    (tmp_path / ".env").unlink()
    assert load_settings(project_root=tmp_path).home == tmp_path / ".ml_assets"


def test_a_projects_models_are_its_model_components_only(tmp_path, spec_dict, monkeypatch):
    defs = new_project(tmp_path)
    monkeypatch.delenv("ML_ASSETS_MODELS_DIR", raising=False)
    with pytest.raises(SpecError, match="no models are declared here"):
        load_declared_specs(load_settings(project_root=tmp_path))
    _component(defs, "late", {"type": COMPONENT_TYPE, "attributes": _model(spec_dict, "late", "/x/{date}.csv")})
    _component(defs, "warehouse", {"type": "dagster_dbt.DbtProjectComponent", "attributes": {"project": "x"}})
    settings = load_settings(project_root=tmp_path)
    assert [spec.name for spec in load_declared_specs(settings)] == ["late"]  # never the bundled ones
    assert load_declared_spec(settings, "late").name == "late"
    with pytest.raises(SpecError, match=r"no model 'flights_delay' is declared in this project \(declared: late\)"):
        load_declared_spec(settings, "flights_delay")
    _component(defs / "team_b", "late", {"type": COMPONENT_TYPE, "attributes": _model(spec_dict, "late", "/y/{date}.csv")})
    with pytest.raises(SpecError, match="model 'late' is also declared by"):
        load_declared_specs(settings)


def test_outside_any_project_and_without_a_models_directory_no_model_loads(tmp_path, monkeypatch):
    settings = replace(load_settings(project_root=tmp_path), project=None, models_dirs=())
    with pytest.raises(SpecError) as raised:
        load_declared_specs(settings)
    assert str(raised.value) == NO_MODELS
    assert load_settings(project_root=REPO).models_dirs == (BUNDLED_MODELS_DIR,)  # this checkout: the demo's


def test_relative_source_paths_resolve_against_the_spec_file_and_say_so_when_missing(tmp_path, spec_dict):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "late.yaml").write_text(yaml.safe_dump(_model(spec_dict, "late", "../data/rows/{date}.csv")))
    (tmp_path / "data" / "rows").mkdir(parents=True)
    spec = load_spec(folder / "late.yaml")
    assert spec.source.rows.path == f"{tmp_path}/data/rows/{{date}}.csv"
    absolute = _model(spec_dict, "late", "s3://bucket/rows/{date}.csv")
    (folder / "late.yaml").write_text(yaml.safe_dump(absolute))
    assert load_spec(folder / "late.yaml").source.rows.path == "s3://bucket/rows/{date}.csv"
    (folder / "late.yaml").write_text(yaml.safe_dump(_model(spec_dict, "late", "missing/{date}.csv")))
    with pytest.raises(SourceError) as raised:
        read_day(load_spec(folder / "late.yaml"), dt.date(2013, 1, 2))
    message = str(raised.value)
    assert f"'{folder}/missing/2013-01-02.csv'" in message
    assert f"the spec's 'missing/{{date}}.csv', resolved against {folder}, the spec file's folder" in message
    assert f"the folder '{folder}/missing' does not exist" in message


def test_the_mlflow_uri_printed_is_one_sqlalchemy_opens(tmp_path):
    settings = load_settings(environ={"ML_ASSETS_HOME": str(tmp_path / "home")}, project_root=tmp_path)
    uri = public_url(settings.mlflow_tracking_uri)
    assert uri == f"sqlite:///{tmp_path}/home/mlflow/mlflow.db"
    assert sqlalchemy.engine.make_url(uri).database == f"{tmp_path}/home/mlflow/mlflow.db"
    assert public_url("http://user:secret@mlflow:5000/x") == "http://mlflow:5000/x"
