"""The files that declare models: a plain ``<name>.yaml`` spec or a Dagster component ``<name>/defs.yaml``.

A models directory (``ML_ASSETS_MODELS_DIR``, default the bundled ``ml_assets/models``) may hold
both. The component form names the component type and nests the very same fields under
``attributes``; the same ``ModelSpec`` validates both forms, so a broken spec reads the same either
way (docs/components.md). No dagster import here: the spec loader and the CLI read these files too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ml_assets.project import COMPONENT_FILES, COMPONENT_TYPE, model_component_files
from ml_assets.settings import Settings
from ml_assets.spec import ModelSpec, SpecError, load_spec, load_specs
from ml_assets.spec.loading import read_yaml, spec_from_data

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


def render_templates(value: object, resolution: object, path: Path) -> object:
    """dg's templates in a component's attributes (``{{ context.project_root }}/data/{date}.csv``,
    ``{{ env.BUCKET }}``), rendered by dg's ``resolution`` context as dg renders a component's:
    only the strings that hold one, so that no other value becomes a number, as dg's native
    rendering would make of "2013"."""
    def render(item: object) -> object:
        if isinstance(item, str):
            if "{{" not in item and "{%" not in item:
                return item
            try:
                return resolution.resolve_value(item)
            except Exception as exc:  # dg's ResolutionException: the template and why, in its words
                raise SpecError(f"{path}: the template {item!r} cannot be rendered: {exc}") from None
        if isinstance(item, dict):
            return {key: render(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [render(inner) for inner in item]
        return item

    return render(value)


class _ProjectScope:
    """``{{ context.project_root }}`` outside dg (the CLI), as dg's LoadContextScope gives it."""

    def __init__(self, root: Path) -> None:
        self.project_root = str(root.resolve())


def _rendered(attributes: object, path: Path) -> object:
    """A component file's attributes with dg's templates rendered, as dg would when loading it."""
    if "{{" not in repr(attributes) and "{%" not in repr(attributes):
        return attributes  # dagster is imported only for a file that needs it
    from dagster.components.resolved.context import ResolutionContext

    from ml_assets.project import find_project

    project = find_project(path.parent)
    scope = {"context": _ProjectScope(project.root)} if project else {}
    return render_templates(attributes, ResolutionContext.default().with_scope(**scope), path)


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
    return spec_from_attributes(_rendered(data.get("attributes"), path), path)


def _declared_names(models_dir: Path, components: list[Path], plain: bool = True) -> None:
    seen: dict[str, Path] = {}
    specs = spec_files(models_dir) if plain else []
    for path, name in [*((p, p.stem) for p in specs), *((p, p.parent.name) for p in components)]:
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


NO_MODELS = ("no models are declared here: in a Dagster project, scaffold one with `dg scaffold defs "
             "ml_assets.components.ModelComponent <name>` and run ml-assets from the project's folder; "
             "elsewhere set ML_ASSETS_MODELS_DIR to a directory of specs")


def load_project_specs(defs_dir: Path) -> list[ModelSpec]:
    """The models a Dagster project declares: its defs folder's ModelComponent files (its other
    components are not models); a name declared twice is refused, naming both files."""
    files = model_component_files(defs_dir)
    _declared_names(defs_dir, files, plain=False)
    return sorted((load_component_spec(p) for p in files), key=lambda spec: spec.name)


def check_team(spec: ModelSpec, settings: Settings) -> ModelSpec:
    """``spec``, if its team is one the deployment serves (ML_ASSETS_TEAMS; any when unset)."""
    if settings.teams and spec.team not in settings.teams:
        raise SpecError(f"model {spec.name!r}: team: {spec.team!r} is not a team of this deployment; "
                        f"ML_ASSETS_TEAMS allows {', '.join(settings.teams)}")
    return spec


def load_declared_specs(settings: Settings) -> list[ModelSpec]:
    """Every model the settings point at: ML_ASSETS_MODELS_DIR, else the project's components (this
    checkout's project: the bundled models)."""
    if settings.models_dirs:
        return [check_team(spec, settings) for spec in load_all_model_specs(settings.models_dirs)]
    if settings.project is not None:
        specs = load_project_specs(settings.project.defs_dir)
        if specs:
            check_rivals(specs)
            return [check_team(spec, settings) for spec in specs]
        raise SpecError(f"{settings.project.defs_dir}: {NO_MODELS}")
    raise SpecError(NO_MODELS)


def select_specs(declared: Sequence[ModelSpec], name: str | None) -> list[ModelSpec]:
    """All of ``declared``, or only model ``name`` (a SpecError naming the known ones when it is not
    declared): what a command over one model or all of them reads."""
    specs = [s for s in declared if name is None or s.name == name]
    if not specs:
        raise SpecError(f"no model {name!r} is declared here; known models: "
                        f"{', '.join(s.name for s in declared) or 'none'}")
    return specs


def declared_models(settings: Settings, name: str | None) -> list[ModelSpec]:
    """Every declared model, or only ``name`` (checked first): what a command over one model or all
    of them reads. SpecError or InvalidName say what is wrong."""
    from ml_assets.names import check_model_name

    if name is not None:
        check_model_name(name)
    return select_specs(load_declared_specs(settings), name)


def load_declared_spec(settings: Settings, name: str) -> ModelSpec:
    """Model ``name``'s spec, wherever the settings say models are declared."""
    if settings.models_dirs:
        return check_team(load_model_spec(settings.models_dirs, name), settings)
    if settings.project is None:
        raise SpecError(NO_MODELS)
    files = [p for p in model_component_files(settings.project.defs_dir) if p.parent.name == name]
    if not files:
        declared = sorted(p.parent.name for p in model_component_files(settings.project.defs_dir))
        raise SpecError(f"{settings.project.defs_dir}: no model {name!r} is declared in this project "
                        f"(declared: {', '.join(declared) or 'none'})")
    if len(files) > 1:
        raise SpecError(f"{files[1]}: name: model {name!r} is also declared by {files[0]}; keep one of them")
    return check_team(load_component_spec(files[0]), settings)


def declared_spec_path(settings: Settings, name: str) -> Path:
    """The file that declares model ``name`` (its spec, or its component's defs.yaml)."""
    if settings.models_dirs:
        paths = [model_spec_file(d, name) for d in settings.models_dirs]
        return next((p for p in paths if p.is_file()), paths[0])
    if settings.project is None:
        raise SpecError(NO_MODELS)
    files = [p for p in model_component_files(settings.project.defs_dir) if p.parent.name == name]
    if not files:
        raise SpecError(f"{settings.project.defs_dir}: no model {name!r} is declared in this project")
    return files[0]
