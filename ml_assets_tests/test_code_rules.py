"""Rules the codebase keeps so that the next engineer can carry it (measured, not promised)."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ml_assets"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_MEDIAN_MODULE_LINES = 150


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_no_module_is_over_400_lines_and_the_median_is_under_150():
    sizes = {_name(p): len(p.read_text().splitlines()) for p in _modules()}
    assert not {n: s for n, s in sizes.items() if s > MAX_MODULE_LINES}
    assert statistics.median(sizes.values()) < MAX_MEDIAN_MODULE_LINES


def test_no_function_is_over_60_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{_name(path)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long


def _keyed_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``x.metadata[...]``, ``x.metadata.get(...)``, ``x.tags[...]``, ``x.tags.get(...)`` read by key."""
    found = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        if isinstance(target, ast.Attribute) and target.attr in ("metadata", "tags"):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_only_the_records_package_reads_metadata_or_tags_by_key():
    reads = [f"{_name(p)}:{line} {text}" for p in _modules() if "records" not in p.relative_to(PACKAGE).parts
             for line, text in _keyed_reads(ast.parse(p.read_text()))]
    assert not reads, "read them through ml_assets.records instead:\n" + "\n".join(reads)


def test_the_key_scan_finds_what_it_looks_for():
    tree = ast.parse("a = mv.tags['x']\nb = rec.metadata.get('y')\nc = mv.tags\nmv.tags['z'] = 1\n")
    assert [line for line, _ in _keyed_reads(tree)] == [1, 2]


def test_every_asset_body_is_glue_of_at_most_40_lines():
    assets, long = [], []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            decorated = isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith(("dg.asset(", "dg.asset", "dg.multi_asset")) for d in node.decorator_list)
            if decorated:
                assets.append(node.name)
                if node.end_lineno - node.body[0].lineno + 1 > 40:
                    long.append(f"{_name(path)}:{node.lineno} {node.name}")
    # Every stage's asset is seen: a decorator written another way must not slip past the rule.
    assert set(assets) >= {"raw_data", "validated_snapshot", "features", "trained_checkpoint", "evaluation_report",
                           "registered_model", "production_model", "hyperparameters"}
    assert not long, "move the work into a plain module: " + ", ".join(long)
