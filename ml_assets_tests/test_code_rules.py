"""Rules the codebase keeps so that the next engineer can carry it (measured, not promised)."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

from ml_assets.code_version import imports_of

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


# Reads dataclasses.Field.metadata (what a TrainConfig field declares), not Dagster's or MLflow's.
FIELD_DECLARATIONS = PACKAGE / "trainer" / "config.py"


def _is_record(path: Path) -> bool:
    return "records" in path.relative_to(PACKAGE).parts or path.name == "record.py" or path == FIELD_DECLARATIONS


def test_only_records_read_metadata_or_tags_by_key():
    reads = [f"{_name(p)}:{line} {text}" for p in _modules() if not _is_record(p)
             for line, text in _keyed_reads(ast.parse(p.read_text()))]
    assert not reads, "read them through a stage's record (<stage>/record.py) instead:\n" + "\n".join(reads)


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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Every import of the package, those inside functions included (they run too), and the parent
    packages an import runs first."""
    return {name: set(imports_of(name)) for name in map(_module_name, _modules())}


def test_no_import_cycles_between_modules_of_the_package():
    found = cycles(_import_graph())
    assert not found, "import cycles (move what both sides need into a module both import):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


STAGES = ("ingest", "validation", "features", "training", "evaluation", "registry", "promotion", "scoring", "tuning")


def test_no_stage_imports_another_stages_asset_module():
    """A stage's asset module is assembled by ml_assets.pipeline alone; what two stages share lives in
    a module both import."""
    wrong = []
    for name, imported in _import_graph().items():
        for target in imported:
            parts = target.split(".")
            elsewhere = not name.startswith((f"ml_assets.{parts[1]}.", "ml_assets.pipeline."))
            if len(parts) == 3 and parts[1] in STAGES and parts[2] == "assets" and elsewhere:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_every_stage_package_holds_its_asset_module_and_its_record():
    for stage in STAGES:
        assert (PACKAGE / stage / "assets.py").is_file(), stage
        assert (PACKAGE / stage / "record.py").is_file(), stage


def test_only_the_graph_builds_asset_keys():
    """Keys come from ml_assets.pipeline.graph (ModelGraph.key, Wiring.key), never from strings elsewhere."""
    graph = PACKAGE / "pipeline" / "graph.py"
    built = [f"{_name(p)}:{node.lineno}" for p in _modules() if p != graph for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and ast.unparse(node.func) in ("dg.AssetKey", "AssetKey")]
    assert not built, "ask ml_assets.pipeline.graph for the key:\n" + "\n".join(built)
