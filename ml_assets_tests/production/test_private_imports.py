"""Dagster's private modules (``dagster._*``) are imported only in ml_assets/deploy, pinned to the
Dagster version its docstring names, and importing that package imports no Dagster at all."""

import ast
import subprocess
import sys
from pathlib import Path

import dagster

import ml_assets.deploy

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "ml_assets" / "deploy"


def private_dagster_imports(path: Path, root: Path = REPO) -> list[str]:
    """``file:line module`` for each import of a ``dagster._*`` module, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        private = [m for m in modules if m.startswith("dagster._")]
        if private:
            found.append(f"{path.relative_to(root)}:{node.lineno} {private[0]}")
    return found


def test_private_dagster_imports_only_in_the_deploy_package():
    sources = [*(REPO / "ml_assets").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]
    outside = [hit for path in sources if not path.is_relative_to(DEPLOY) for hit in private_dagster_imports(path)]
    assert outside == [], ("dagster._* imported outside ml_assets/deploy (move it there, or use dagster's "
                           "public API):\n" + "\n".join(outside))


def test_the_finder_sees_every_form_of_import_at_any_depth(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import dagster as dg\n"
                      "from dagster import _check\n"
                      "import dagster._utils.cached_method\n"
                      "from ml_assets.names import safe_name\n"
                      "def launch():\n"
                      "    from dagster._cli import main\n"
                      "class Storage:\n"
                      "    def open(self):\n"
                      "        if True:\n"
                      "            from dagster._serdes import ConfigurableClass\n")
    assert private_dagster_imports(module, tmp_path) == [
        "module.py:2 dagster._check", "module.py:3 dagster._utils.cached_method", "module.py:6 dagster._cli",
        "module.py:10 dagster._serdes"]


def test_the_pinned_dagster_version_is_the_installed_one():
    # Private modules change without notice between releases: an upgrade re-reads them, then this line.
    assert f"dagster {dagster.__version__}" in " ".join(ml_assets.deploy.__doc__.split())


def test_importing_the_deploy_package_imports_no_dagster():
    code = "import sys, ml_assets.deploy; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
