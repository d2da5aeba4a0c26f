"""Render helm/ml-assets with Helm's own engine (helm-python-sdk, no helm binary) and check it.

    .venv/bin/python helm/render.py helm/examples/values-gpu.yaml [more values files...] > manifests.yaml

Validates the values against values.schema.json, lints, renders as release ``ml-assets`` in
namespace ``ml`` (``--release``, ``--namespace``), validates every manifest strictly against the
Kubernetes schemas (kubernetes-validate) and prints them; what fails is named on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

CHART = Path(__file__).resolve().parent / "ml-assets"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("values", nargs="+", type=Path)
    parser.add_argument("--release", default="ml-assets")
    parser.add_argument("--namespace", default="ml")
    parser.add_argument("--kube-version", default=kubernetes_validate.latest_version())
    args = parser.parse_args(argv)
    values: dict = {}
    for path in args.values:  # later files win, key by key, as with helm -f a -f b
        values = _merge(values, yaml.safe_load(path.read_text()) or {})
    try:
        with helm.Chart.load(CHART) as chart:
            chart.validate_schema(values)
            rendered = chart.render(values, name=args.release, namespace=args.namespace, is_install=True)
    except helm.HelmError as exc:
        print(f"render.py: {exc}", file=sys.stderr)
        return 1
    report = helm.lint(CHART, values, strict=True, namespace=args.namespace)
    problems = [f"lint: {m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    docs = [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, args.kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    for problem in problems:
        print(f"render.py: {problem}", file=sys.stderr)
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 1 if problems else 0


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


if __name__ == "__main__":
    sys.exit(main())
