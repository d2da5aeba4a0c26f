"""The Dockerfile agrees with the chart and the pods, and what it copies is enough to install the package.

No image is built here (no Docker daemon, no registry reachable): docs/kubernetes.md says so."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import yaml

from ml_assets.deploy.k8s.pods import HOME, RUN_AS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+((?:[^\n]*\\\n)*[^\n]*)", DOCKERFILE, re.MULTILINE)]


def test_the_image_runs_as_the_pods_user_with_the_pods_home():
    assert _instructions("USER") == [f"{RUN_AS}:{RUN_AS}"]
    env = " ".join(_instructions("ENV"))
    assert f"ML_ASSETS_HOME={HOME}" in env and f"HOME={HOME}" in env
    assert "torch==2.13.0" in DOCKERFILE  # the version the project pins, from the chosen index


def test_the_images_default_command_is_the_charts_code_server():
    values = yaml.safe_load((ROOT / "helm" / "examples" / "values-default.yaml").read_text())
    with helm.Chart.load(ROOT / "helm" / "ml-assets") as chart:
        rendered = chart.render(values, name="ml-assets", namespace="ml")["ml-assets/templates/code-server.yaml"]
    container = next(yaml.safe_load_all(rendered))["spec"]["template"]["spec"]["containers"][0]
    [cmd] = _instructions("CMD")
    assert json.loads(cmd) == container["command"] + container["args"]


def test_what_the_dockerfile_copies_is_enough_to_build_the_package(tmp_path):
    context = tmp_path / "context"
    for source in [s for line in _instructions("COPY") if not line.startswith("--from")
                   for s in line.split()[:-1]]:
        target = context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, target)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "dist"), str(context)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("ml_assets-*.whl")
    listing = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True).stdout
    for needed in ("ml_assets/models/flights_delay.yaml", "ml_assets/training/k8s_job.py", "ml_assets/trainer/train.py"):
        assert needed in listing
