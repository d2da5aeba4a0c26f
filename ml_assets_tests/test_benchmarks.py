"""Every benchmark module runs with --quick and ends with well-formed RESULT lines."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
RESULT = re.compile(r"^RESULT (?P<name>\w+) (?P<value>-?[0-9.eE+-]+) goal (<=|>=|<|>|==) -?[0-9.eE+-]+$")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_quick_run_ends_with_result_line(name):
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert RESULT.match(lines[-1]), f"the last line is not a RESULT line: {lines[-1]!r}"
    results = [RESULT.match(line) for line in lines if line.startswith("RESULT ")]
    assert all(results), f"malformed RESULT lines in {lines!r}"
    assert all(m["name"].startswith(name) for m in results), "RESULT names start with the module's name"


def test_benchmarks_import_no_test_code():
    """A benchmark measures the product from a checkout; the test package is not part of it."""
    importing = [p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if re.search(r"^\s*(from|import) ml_assets_tests\b", p.read_text(), flags=re.M)]
    assert importing == []
