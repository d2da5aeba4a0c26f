"""The Dagster project a command runs in: its root, its defs folder, its ``.env``, its models.

A project is what ``create-dagster project`` makes: a ``pyproject.toml`` with ``[tool.dg]
directory_type = "project"`` whose ``[tool.dg.project]`` names the root module and, optionally, the
defs module (default ``<root_module>.defs``). Its models are the ``defs.yaml`` files under the defs
folder whose ``type`` is ``ml_assets.components.ModelComponent``; the other components in that folder
are the project's own business. No dagster import here: the CLI and the settings read projects too.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

PYPROJECT = "pyproject.toml"
ENV_FILE = ".env"
COMPONENT_TYPE = "ml_assets.components.ModelComponent"
COMPONENT_FILES = ("defs.yaml", "defs.yml")


class ProjectError(ValueError):
    """A project's pyproject.toml cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class DgProject:
    root: Path
    """The folder of the project's pyproject.toml."""
    defs_dir: Path
    """The folder of the defs module, where dg finds component files."""
    name: str = ""
    """The distribution the pyproject.toml declares (``[project] name``)."""

    @property
    def is_this_checkout(self) -> bool:
        """This repository's own checkout, whose defs folder is the bundled models directory. (Not
        merely the folder above the package: installed, that is site-packages, where a project's
        wheel may have put its own pyproject.toml, as create-dagster's template does.)"""
        return self.name == "ml-assets" and self.root == Path(__file__).resolve().parents[1]

    def env_file(self) -> dict[str, str]:
        """The variables of the project's ``.env`` (what ``dg dev`` gives its code servers)."""
        return read_env_file(self.root / ENV_FILE)


def read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    from dotenv import dotenv_values  # python-dotenv: a dependency of dagster's own

    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def _module_dir(root: Path, module: str) -> Path:
    """Where ``module`` lies in the project: under ``src/`` (create-dagster's layout) or the root."""
    relative = Path(*module.split("."))
    for base in (root / "src", root):
        if (base / relative).is_dir():
            return base / relative
    return root / "src" / relative


@functools.cache
def project_at(root: Path) -> DgProject | None:
    """The dg project whose pyproject.toml is in ``root``, or None when it declares none."""
    path = root / PYPROJECT
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError(f"{path}: not valid TOML: {exc}") from None
    dg = data.get("tool", {}).get("dg", {})
    if dg.get("directory_type") != "project":
        return None
    settings = dg.get("project", {})
    root_module = settings.get("root_module")
    if not isinstance(root_module, str) or not root_module:
        raise ProjectError(f"{path}: [tool.dg.project] root_module: a dg project names its root module")
    defs_module = settings.get("defs_module") or f"{root_module}.defs"
    name = data.get("project", {}).get("name", "")
    return DgProject(root=root, defs_dir=_module_dir(root, defs_module), name=name if isinstance(name, str) else "")


def find_project(start: Path | None = None) -> DgProject | None:
    """The dg project holding ``start`` (default: the working directory), found as git finds a repository."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        found = project_at(folder)
        if found is not None:
            return found
    return None


def component_type(path: Path) -> object:
    """The ``type`` a component file declares (None when it is not a mapping or cannot be parsed:
    then it is not recognisably this library's, and dg reports it)."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None
    return data.get("type") if isinstance(data, dict) else None


def model_component_files(defs_dir: Path, folder: str = "*") -> list[Path]:
    """The component files under ``defs_dir`` that declare models (this library's component type);
    ``folder``: only those in folders of that name (a model's name)."""
    if not defs_dir.is_dir():
        return []
    found = [path for name in COMPONENT_FILES for path in defs_dir.rglob(f"{folder}/{name}")]
    # dg skips hidden folders and __pycache__ when it walks a defs folder; so does this.
    visible = [p for p in found
               if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(defs_dir).parts)]
    return sorted(p for p in visible if component_type(p) == COMPONENT_TYPE)
