"""The published JSON schemas of a model spec, so that an editor completes and checks its fields.

    python -m ml_assets.spec_schema           # writes schema/model-spec.schema.json and
                                              # schema/model-component.schema.json
    python -m ml_assets.spec_schema --check   # exits 1 when a committed file is stale

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

SCHEMA_DIR = Path("schema")
SPEC_SCHEMA = SCHEMA_DIR / "model-spec.schema.json"
COMPONENT_SCHEMA = SCHEMA_DIR / "model-component.schema.json"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
REPO = Path(__file__).resolve().parents[1]


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
    """Each published file (relative to the repository) and the text it should hold."""
    return {path: json.dumps(schema, indent=2) + "\n"
            for path, schema in ((SPEC_SCHEMA, spec_schema()), (COMPONENT_SCHEMA, component_schema()))}


def stale(root: Path = REPO) -> list[Path]:
    """The published files under ``root`` that differ from what ModelSpec gives now."""
    return [path for path, text in rendered().items()
            if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ml_assets.spec_schema", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a published schema is stale")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        for path in outdated:
            print(f"{path} is stale: run python -m ml_assets.spec_schema", file=sys.stderr)
        return 1 if outdated else 0
    for path, text in rendered().items():
        (REPO / path).parent.mkdir(exist_ok=True)
        (REPO / path).write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
