"""Reading spec files: one message that names the file, the field and the problem."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import yaml
from pydantic import ValidationError

from ml_assets.spec.architecture import resolve_code_path
from ml_assets.spec.model import ModelSpec
from ml_assets.spec.source import resolve_source_paths

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecError(ValueError):
    """A model spec that cannot be used; the message names the file, the field and the problem."""


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        # Cross-field checks run on the whole spec and start their message with the field.
        lines.append(f"{path}: {loc}: {msg}" if loc else f"{path}: {msg}")
    return "invalid model spec\n  " + "\n  ".join(lines)


def read_yaml(text: str, path: Path) -> object:
    """The YAML document in ``text``; a SpecError naming ``path`` and the line when it is not YAML."""
    try:
        # libyaml's loader (in PyYAML's wheels): the pure-Python one took ~40% of building a code
        # location of 100 models. Same documents, same errors with their line and column.
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def calibration_path(path: Path) -> Path:
    """Where the calibration of the spec in ``path`` lives: ``<model>.calibration.json`` beside a plain
    spec, ``calibration.json`` beside a component's ``defs.yaml``."""
    if path.stem == "defs":
        return path.with_name("calibration.json")
    return path.with_name(f"{path.stem}.calibration.json")


_IGNORED: list[bool] = []


@contextlib.contextmanager
def without_calibration() -> Iterator[None]:
    """Specs loaded inside read no calibration file (``ml-assets calibrate`` makes a new one, even when
    the old one no longer fits the schema)."""
    _IGNORED.append(True)
    try:
        yield
    finally:
        _IGNORED.pop()


def _with_calibration(data: dict, path: Path) -> dict:
    """``data`` with the calibration file beside ``path`` as ``validation.calibration`` (a spec that
    holds its own keeps it)."""
    file = calibration_path(path)
    validation = data.get("validation")
    if _IGNORED or not file.is_file() or (isinstance(validation, dict) and "calibration" in validation):
        return data
    try:
        calibration = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{file}: not a readable calibration ({exc}); run ml-assets calibrate again") from None
    return {**data, "validation": {**(validation if isinstance(validation, dict) else {}), "calibration": calibration}}


def spec_from_data(data: dict, path: Path, name: str, named_by: str = "file name") -> ModelSpec:
    """``data`` validated as a spec, the messages naming ``path``; the spec's name must be ``name``
    (what ``named_by``, the file or the folder, says it is)."""
    data = _with_calibration(data, path)
    try:
        spec = ModelSpec.model_validate(resolve_source_paths(resolve_code_path(data, path), path))
    except ValidationError as exc:
        raise SpecError(_format_errors(path, exc)) from None
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from None
    if spec.name != name:
        raise SpecError(f"{path}: name: {spec.name!r} must match the {named_by} {name!r}")
    return spec


def parse_spec(text: str, path: Path) -> ModelSpec:
    data = read_yaml(text, path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: (top level): expected a mapping of spec fields, got {type(data).__name__}")
    return spec_from_data(data, path, path.stem)


def load_spec(path: Path) -> ModelSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read: {exc.strerror}") from None
    return parse_spec(text, path)


def load_specs(models_dir: Path) -> list[ModelSpec]:
    if not models_dir.is_dir():
        raise SpecError(f"{models_dir}: models directory does not exist (ML_ASSETS_MODELS_DIR)")
    paths = sorted([*models_dir.glob("*.yaml"), *models_dir.glob("*.yml")])
    if not paths:
        raise SpecError(f"{models_dir}: no model specs (*.yaml) found")
    return [load_spec(p) for p in paths]
