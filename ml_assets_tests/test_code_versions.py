"""A stage's code version covers the code it runs, found from its imports: editing a module a stage
imports only indirectly changes that stage's version, and leaves a stage that never runs it alone.

The edits are made in a copy of the package, imported by a fresh process, so the versions are
computed from the files as Dagster would see them after a deploy."""

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import ml_assets
from ml_assets.code_version import closure, imported_names, imports_of
from ml_assets_tests.helpers import BUNDLED_SPEC

PACKAGE = Path(ml_assets.__file__).parent

# Prints {stage: code version} of the bundled model as built from the ml_assets on sys.path, then
# again after each edit of argv[2:] (appending a comment to a file of the package, then undoing it).
# Each build starts from files read afresh, as a new process after a deploy would.
VERSIONS = """
import json, sys
from pathlib import Path
import ml_assets.code_version as cv
from ml_assets.pipeline.model import build_model_defs
from ml_assets.spec import load_spec

def versions():
    for value in vars(cv).values():
        getattr(value, "cache_clear", lambda: None)()
    defs = build_model_defs(load_spec(Path(sys.argv[1])))
    return {key.path[-1]: version for asset in defs.assets for key, version in asset.code_versions_by_key.items()}

out = {"": versions()}
for edited in sys.argv[2:]:
    path = Path(cv.__file__).parent / edited
    original = path.read_text()
    path.write_text(original + "\\n# an edit\\n")
    try:
        out[edited] = versions()
    finally:
        path.write_text(original)
out["undone"] = versions()
print(json.dumps(out))
"""

ASSET_MODULES = {"raw_data": "ingest", "validated_snapshot": "validation", "features": "features",
                 "trained_checkpoint": "training", "evaluation_report": "evaluation", "registered_model": "registry",
                 "production_model": "promotion", "hyperparameters": "tuning", "predictions": "scoring",
                 "model_monitor": "scoring"}

# (file edited, stages whose asset modules reach it only through other modules, stages that never run it)
INDIRECT = [
    ("parquet.py", ["raw_data", "features"], ["trained_checkpoint", "evaluation_report"]),
    ("validation/verdict.py", ["validated_snapshot"], ["raw_data", "features"]),
    ("validation/stats.py", ["validated_snapshot", "model_monitor"], ["raw_data", "features"]),
    # Run by torchrun, not imported: the trainer's entry points are the training stages' declared roots.
    ("trainer/loop.py", ["trained_checkpoint", "hyperparameters"], ["evaluation_report", "features"]),
    ("evaluation/policy.py", ["evaluation_report"], ["trained_checkpoint", "registered_model"]),
    ("serving/pyfunc.py", ["registered_model", "production_model"], ["features", "validated_snapshot"]),
    ("features/day.py", ["model_monitor"], ["raw_data", "trained_checkpoint"]),
    ("tuning/space.py", ["hyperparameters"], ["evaluation_report", "features"]),
]
# The window code picks a training's days and an evaluation's test days; both stages once missed it.
DIRECT = [("training/window.py", ["trained_checkpoint", "evaluation_report"], ["raw_data", "features"])]


def test_a_module_a_stage_imports_indirectly_changes_its_code_version_and_no_other(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "ml_assets", ignore=shutil.ignore_patterns("__pycache__"))
    edits = INDIRECT + DIRECT
    out = subprocess.run([sys.executable, "-c", VERSIONS, str(BUNDLED_SPEC), *[path for path, _, _ in edits]],
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    before = versions[""]
    assert set(before) == set(ASSET_MODULES) and all(before.values()), before
    for path, changed, unchanged in edits:
        after = versions[path]
        for stage in changed:
            assert after[stage] != before[stage], f"editing {path} left {stage}'s code version as it was"
        for stage in unchanged:
            assert after[stage] == before[stage], f"editing {path} changed {stage}'s code version"
    assert versions["undone"] == before


def test_the_edited_modules_are_reached_only_through_others():
    """What the test above edits is not imported by the stage's asset module itself."""
    for path, changed, _ in INDIRECT:
        module = "ml_assets." + path.removesuffix(".py").replace("/", ".")
        for stage in changed:
            asset_module = f"ml_assets.{ASSET_MODULES[stage]}.assets"
            assert module not in imports_of(asset_module), f"{asset_module} imports {module} directly"
            if stage not in ("trained_checkpoint", "hyperparameters"):
                assert module in closure((asset_module,)), f"{asset_module} does not reach {module}"


def _ast_reading(tree: ast.Module, module: str, is_package: bool):
    """The reference: every name an import statement may load, read from the syntax tree."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join([*anchor[: len(anchor) - (node.level - 1)], *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                todo.extend(getattr(node, name, ()))


TRICKY = '''"""A docstring that shows
import ml_assets.cli
"""
from typing import TYPE_CHECKING
from . import (  # a comment
    spec,
    trainer as t,
)
import json, ml_assets.lineage as lineage
if TYPE_CHECKING:
    from ml_assets.registry import client
    import ml_assets.audit
else:
    from .. import cards


def f():
    x = \'\'\'import ml_assets.demo\'\'\'
    from ml_assets.runs import \\
        latest
'''


def test_the_import_scanner_reads_every_module_of_the_package_as_ast_does():
    files = sorted(Path(ml_assets.__file__).parent.rglob("*.py"))
    assert len(files) > 150
    for path in [*files, None]:
        if path is None:
            text, module, is_package = TRICKY, "ml_assets.pipeline.x", False
        else:
            text = path.read_text()
            parts = path.relative_to(Path(ml_assets.__file__).parents[1]).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module, is_package = ".".join(parts[:-1] if is_package else parts), is_package
        expected = set(_ast_reading(ast.parse(text), module, is_package))
        assert set(imported_names(text, module, is_package)) == expected, path or "TRICKY"
    tricky = set(imported_names(TRICKY, "ml_assets.pipeline.x", False))
    assert {"ml_assets.pipeline.spec", "ml_assets.pipeline.trainer", "ml_assets.lineage", "ml_assets.cards",
            "ml_assets.runs.latest"} <= tricky
    assert not tricky & {"ml_assets.cli", "ml_assets.registry.client", "ml_assets.audit", "ml_assets.demo"}
