"""The published JSON schemas of a model spec, so that an editor completes and checks its fields.

    ml-assets schema [--output DIR]           # writes DIR/model-spec.schema.json and
                                              # DIR/model-component.schema.json (default DIR: schema)
    python -m ml_assets.spec_schema           # this checkout: regenerates the package's copies
    python -m ml_assets.spec_schema --check   # exits 1 when a packaged copy is stale

The package carries both files (``ml_assets/schemas/``); they are generated here, and a test checks
that the packaged copies are current.

Both come from ModelSpec's own JSON schema: one for a plain ``<name>.yaml`` spec, one for a model's
``defs.yaml`` (the same fields under ``attributes``). A YAML file picks one with its first line,
``# yaml-language-server: $schema=<relative path>`` (docs/components.md). ModelSpec stays the judge:
the schema helps while typing; loading reports the spec's own messages.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ml_assets.model_files import COMPONENT_TYPE
from ml_assets.spec import ModelSpec

SPEC_SCHEMA = Path("model-spec.schema.json")
COMPONENT_SCHEMA = Path("model-component.schema.json")
PACKAGED = Path(__file__).resolve().with_name("schemas")
"""The copies the package carries (package data)."""
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def spec_schema() -> dict:
    """The schema of a plain spec file: ModelSpec's, with what its validators accept besides."""
    schema = ModelSpec.model_json_schema(by_alias=True)
    features = schema["$defs"]["FeaturesSpec"]["properties"]
    for kind in ("numeric", "categorical"):
        # A feature with no options may be given by its name alone (FeaturesSpec turns it into {name: ...}).
        features[kind]["items"] = {"anyOf": [{"type": "string"}, features[kind]["items"]]}
    schema["title"] = "ml_assets model spec"
    schema["description"] = "One model: where its rows come from, what to predict, how to train, judge and promote."
    return {"$schema": DRAFT, **schema}


def component_schema() -> dict:
    """The schema of a model's ``defs.yaml``: the component type and the spec's fields as attributes."""
    spec = spec_schema()
    del spec["$schema"]
    definitions = spec.pop("$defs")
    return {
        "$schema": DRAFT,
        "title": "ml_assets model component (defs.yaml)",
        "description": f"A model as a Dagster component: type {COMPONENT_TYPE}, attributes the spec's fields.",
        "type": "object",
        "properties": {"type": {"const": COMPONENT_TYPE}, "attributes": {"$ref": "#/$defs/ModelSpec"}},
        "required": ["type", "attributes"],
        "additionalProperties": False,
        "$defs": {**definitions, "ModelSpec": spec},
    }


def rendered() -> dict[Path, str]:
    """Each published file (its name) and the text it should hold."""
    return {path: json.dumps(schema, indent=2) + "\n"
            for path, schema in ((SPEC_SCHEMA, spec_schema()), (COMPONENT_SCHEMA, component_schema()))}


def stale(root: Path = PACKAGED) -> list[Path]:
    """The published files under ``root`` that differ from what ModelSpec gives now."""
    return [path for path, text in rendered().items()
            if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text]


def write(directory: Path) -> list[Path]:
    """Write both schemas into ``directory`` (created if missing); returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        (directory / name).write_text(text, encoding="utf-8")
        written.append(directory / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ml_assets.spec_schema", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a packaged schema is stale")
    parser.add_argument("--output", type=Path, default=None,
                        help="the folder to write them to (default: the package's own copies in this checkout, "
                             "else schema/ here)")
    args = parser.parse_args(argv)
    if args.output is None:  # an installed package's folder is not the user's to write in
        from ml_assets.project import project_at

        checkout = project_at(PACKAGED.parents[1])
        args.output = PACKAGED if checkout is not None and checkout.is_this_checkout else Path("schema")
    if args.check:
        outdated = stale(args.output)
        for path in outdated:
            print(f"{args.output / path} is stale: run python -m ml_assets.spec_schema", file=sys.stderr)
        return 1 if outdated else 0
    for path in write(args.output):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
