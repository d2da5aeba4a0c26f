"""The files that declare models: a plain ``<name>.yaml`` spec or a Dagster component ``<name>/defs.yaml``.

A models directory (``ML_ASSETS_MODELS_DIR``, default the bundled ``ml_assets/models``) may hold
both. The component form names the component type and nests the very same fields under
``attributes``; the same ``ModelSpec`` validates both forms, so a broken spec reads the same either
way (docs/components.md). No dagster import here: the spec loader and the CLI read these files too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ml_assets.spec import ModelSpec, SpecError, load_spec, load_specs
from ml_assets.spec.loading import read_yaml, spec_from_data

COMPONENT_TYPE = "ml_assets.components.ModelComponent"
COMPONENT_FILES = ("defs.yaml", "defs.yml")
SPEC_SUFFIXES = (".yaml", ".yml")


def spec_files(models_dir: Path) -> list[Path]:
    """The plain ``<name>.yaml`` specs directly in ``models_dir``."""
    return sorted(p for suffix in SPEC_SUFFIXES for p in models_dir.glob(f"*{suffix}"))


def component_files(models_dir: Path) -> list[Path]:
    """The ``defs.yaml`` of each model folder under ``models_dir`` (folders may group them, as dg allows)."""
    found = [path for name in COMPONENT_FILES for path in models_dir.glob(f"*/**/{name}")]
    # dg skips hidden folders and __pycache__ when it walks a defs folder; so does this.
    return sorted(p for p in found
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(models_dir).parts))


def spec_from_attributes(attributes: object, path: Path) -> ModelSpec:
    """A component's attributes validated as a spec; the messages name ``path`` as for a plain spec file."""
    if not isinstance(attributes, Mapping):
        raise SpecError(f"{path}: attributes: expected a mapping of spec fields, got {type(attributes).__name__}")
    name = attributes.get("name")
    if isinstance(name, str) and name != path.parent.name:  # said first, before any other field's error
        raise SpecError(f"{path}: name: {name!r} must match the folder name {path.parent.name!r}")
    return spec_from_data(dict(attributes), path, path.parent.name, "folder name")


def _component_document(path: Path) -> dict:
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), path)
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: (top level): expected `type` and `attributes`, got {type(data).__name__}")
    return data


def load_component_spec(path: Path) -> ModelSpec:
    """The spec declared by a model's component file (``type: ml_assets.components.ModelComponent``)."""
    data = _component_document(path)
    if data.get("type") != COMPONENT_TYPE:
        raise SpecError(f"{path}: type: expected {COMPONENT_TYPE}, got {data.get('type')!r}")
    # post_processing, requirements, template_vars_module: dg's, which the code location does not apply.
    extra = sorted(set(data) - {"type", "attributes"})
    if extra:
        raise SpecError(f"{path}: {extra[0]}: a model's component file holds only type and attributes")
    return spec_from_attributes(data.get("attributes"), path)


def _declared_names(models_dir: Path, components: list[Path]) -> None:
    seen: dict[str, Path] = {}
    for path, name in [*((p, p.stem) for p in spec_files(models_dir)), *((p, p.parent.name) for p in components)]:
        if name in seen:
            raise SpecError(f"{path}: name: model {name!r} is also declared by {seen[name]}; keep one of them")
        seen[name] = path


def load_model_specs(models_dir: Path) -> list[ModelSpec]:
    """Every model in ``models_dir``, in either form, by name; a name declared twice is refused."""
    components = component_files(models_dir) if models_dir.is_dir() else []
    _declared_names(models_dir, components)
    # load_specs says what is wrong with a missing or empty directory.
    plain = load_specs(models_dir) if spec_files(models_dir) or not components else []
    return sorted([*plain, *(load_component_spec(p) for p in components)], key=lambda spec: spec.name)


def model_spec_file(models_dir: Path, name: str) -> Path:
    """Where model ``name`` is declared (``<name>.yaml`` when it is nowhere, for the message)."""
    plain = [models_dir / f"{name}{suffix}" for suffix in SPEC_SUFFIXES]
    components = [p for p in component_files(models_dir) if p.parent.name == name] if models_dir.is_dir() else []
    return next((p for p in [*plain, *components] if p.is_file()), plain[0])


def load_model_spec(models_dirs: Path | Sequence[Path], name: str) -> ModelSpec:
    """Model ``name``'s spec, in whichever form and whichever of the directories it is declared."""
    dirs = [models_dirs] if isinstance(models_dirs, Path) else list(models_dirs)
    paths = [model_spec_file(d, name) for d in dirs]
    path = next((p for p in paths if p.is_file()), paths[0])
    return load_component_spec(path) if path.name in COMPONENT_FILES else load_spec(path)


def load_all_model_specs(models_dirs: Sequence[Path]) -> list[ModelSpec]:
    """Every model of several directories; a name declared in two of them is refused."""
    specs: dict[str, tuple[ModelSpec, Path]] = {}
    for models_dir in models_dirs:
        for spec in load_model_specs(models_dir):
            if spec.name in specs:
                raise SpecError(f"{models_dir}: name: model {spec.name!r} is also declared in {specs[spec.name][1]}; "
                                "keep one of them")
            specs[spec.name] = (spec, models_dir)
    found = sorted((spec for spec, _ in specs.values()), key=lambda spec: spec.name)
    check_rivals(found)
    return found


def check_rivals(specs: Sequence[ModelSpec]) -> None:
    """``promotion.rival`` names another declared model answering the same question."""
    by_name = {spec.name: spec for spec in specs}
    for spec in specs:
        name = spec.promotion.rival
        if name is None:
            continue
        rival = by_name.get(name)
        where = f"model {spec.name}: promotion.rival: {name!r}"
        if name == spec.name:
            raise SpecError(f"{where} is this model itself (its champion is compared anyway)")
        if rival is None:
            raise SpecError(f"{where} is not a declared model ({sorted(by_name)})")
        mine, theirs = spec.target, rival.target
        if (mine.name, mine.task, mine.classes) != (theirs.name, theirs.task, theirs.classes):
            raise SpecError(f"{where} predicts {theirs.name} ({theirs.task}), this model {mine.name} ({mine.task}): "
                            "their metrics cannot be compared")
