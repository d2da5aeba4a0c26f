"""scripts/gpu_check.py, the hand-run check of the trainer's CUDA paths, keeps working where the
suite runs (its CPU case): a GPU machine is lent too rarely to find a broken script there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_prepares_inputs_and_reports_a_cpu_case(tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "gpu_check.py")]
    subprocess.run([*script, "prepare", str(tmp_path / "inputs"), "--days", "3"], check=True, cwd=ROOT,
                   capture_output=True, timeout=300)
    proc = subprocess.run([*script, "run", str(tmp_path / "inputs"), "--only", "cpu_fp32",
                           "--json", str(tmp_path / "out.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    case = json.loads((tmp_path / "out.json").read_text())["results"]["cpu_fp32"]
    assert case["ok"] and case["device"] == "cpu" and case["backend"] == "gloo"
    assert case["steps"] > 0 and len(case["weights_sha256"]) == 64
