"""A registered model that predicts from rows, the fitted transforms inside.

    import mlflow
    model = mlflow.pyfunc.load_model("models:/flights_delay@champion")
    probabilities = model.predict(rows)      # a pandas or polars DataFrame

It returns the positive class's probability per row (binary classification) or the prediction
(regression) as an array; a multiclass model returns a pandas DataFrame with one probability
column per class, named by the class, and ``predicted_class``, the most probable class's name.

``rows`` carry the model's feature columns as the features asset builds them: raw columns (carrier,
distance, ...), the joined and rolling columns (weather, plane attributes, a carrier's 7-day delay
rate) and, if they are missing, the spec's time parts are derived from the raw timestamp column.
Standardizing, clipping, bucketizing, vocabularies and hashing come from the feature state fitted
on the training window, stored inside the model: the same ``transform`` training used.
Joins and rolling aggregates need dimension tables and earlier days, which one row cannot carry:
``ml_assets.features.serve.featurize`` builds them from raw tables outside MLflow.

Saved as MLflow "models from code" (``mlflow_model.py``): loading runs the ``ml_assets`` code that
travels in the model directory's ``code/`` (MLflow's ``code_paths``: the copy the version was
registered with, which MLflow puts first on ``sys.path``) and reads JSON and safetensors (a network)
or XGBoost's UBJSON (family xgboost: ``model.ubj`` in place of ``model.safetensors``, parsed as data);
there is no pickle in the model directory. Its requirements name only published packages
(``SERVING_PACKAGES``, and XGBoost's for a booster, at the versions registered), so
``mlflow models serve`` needs no index that serves ml_assets.

Served over HTTP, the signature's feature columns are required: a request without one, or with a
value of the wrong type, gets HTTP 400 naming the column (MLflow's schema enforcement); a problem
only the transforms can see (a time part that can be neither read nor derived) is a 400 too.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.pyfunc
import pandas as pd

from ml_assets.layout import BOOSTER_FILE, EXPORT_FILES, FEATURE_STATE_FILE, META_FILE, weights_file

if TYPE_CHECKING:
    import torch
    import xgboost

SPEC_FILE = "spec.json"
FILES = (*EXPORT_FILES, SPEC_FILE)
"""A network's model directory; a booster's holds BOOSTER_FILE in place of the weights (``files_of``)."""
PREDICTED_CLASS = "predicted_class"
CODE = Path(__file__).with_name("mlflow_model.py")
PACKAGE = Path(__file__).resolve().parents[1]
SERVING_PACKAGES = ("mlflow", "torch", "polars", "numpy", "pandas", "pyarrow", "pydantic", "safetensors",
                    "fsspec", "pyyaml", "holidays")
"""What loading and predicting with a registered model imports besides the standard library and
its own code (a test checks this list against a fresh process's imports)."""
BOOSTER_IMPORTS = ("xgboost",)
"""What a booster's model imports besides SERVING_PACKAGES (``serving_packages``)."""
EXAMPLE_ROWS = 2


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(meta: dict) -> tuple[str, ...]:
    """The files of the model directory of an export described by ``meta``: its weights file (as
    meta.json names it), meta.json, the feature state and the spec."""
    return (weights_file(meta), META_FILE, FEATURE_STATE_FILE, SPEC_FILE)


def is_booster(meta: dict) -> bool:
    """A gradient-boosted model's export (family xgboost), by the weights file its meta.json names."""
    return weights_file(meta) == BOOSTER_FILE




class TabularModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from ml_assets.spec import ModelSpec
        from ml_assets.trainer.checkpoint import LoadedCheckpoint

        meta = json.loads(Path(context.artifacts[META_FILE]).read_bytes())
        if missing := [name for name in files_of(meta) if name not in context.artifacts]:
            raise ValueError(f"the model directory lacks {missing}, which its meta.json names; the model files are damaged")
        paths = {name: Path(context.artifacts[name]) for name in files_of(meta)}
        weights = weights_file(meta)
        # Checked before anything is parsed: the weights and the state must be the bytes meta.json pins.
        for name, key in ((weights, "weights_sha256"), (FEATURE_STATE_FILE, "feature_state_sha256")):
            if _sha(paths[name]) != meta[key]:
                raise ValueError(f"{paths[name]}: sha256 does not match meta.json's {key}; the model files are damaged")
        self.spec = ModelSpec.model_validate(json.loads(paths[SPEC_FILE].read_bytes()))
        model = _booster(paths[weights]) if is_booster(meta) else _network(meta, paths[weights])
        self.loaded = LoadedCheckpoint(model, meta, json.loads(paths[FEATURE_STATE_FILE].read_bytes()))

    # Annotated with one of the types MLflow infers no schema from: without a hint it warns at every
    # import (its own filter overrides ours); a hint it can read would switch on its input conversion,
    # where the signature saved with the model describes the input instead.
    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None):
        import polars as pl
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        from ml_assets.serving.predict import predict

        frame = model_input if isinstance(model_input, pl.DataFrame) else pl.from_pandas(model_input)
        try:
            out = predict(self.loaded, self._time_parts(frame))
        except ValueError as exc:  # the rows' own problem (a column the transforms need): HTTP 400, said
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None
        classes = self.loaded.meta.get("classes")
        return class_frame(out, classes) if classes else out

    def _time_parts(self, frame):
        """Derive the spec's time parts from the raw timestamp when the rows lack them."""
        from ml_assets.features import build

        time = self.spec.features.time
        wanted = {f"{time.prefix}{p}" for p in time.parts} if time else set()
        missing = wanted - set(frame.columns)
        ts = (time.column if time else None) or self.spec.partitioning.timestamp_column
        if not missing or ts not in frame.columns:
            return frame
        lazy = build._time_parts(self.spec, build.dated(self.spec, frame.lazy()), streaming=False)
        return lazy.collect(engine="in-memory").select([*frame.columns, *sorted(missing)])


def _network(meta: dict, weights: Path) -> torch.nn.Module:
    """The network in eval mode, its verified safetensors weights loaded (tensors only, no pickle)."""
    from safetensors.torch import load as safetensors_load

    from ml_assets.trainer.build import rebuild

    # A factory's package travels in the model directory's code/ (MLflow's code_paths).
    model = rebuild(meta, str(code_dir(weights)))
    model.load_state_dict(safetensors_load(weights.read_bytes()))
    model.eval()
    return model


def _booster(weights: Path) -> xgboost.Booster:
    """The xgboost.Booster from its verified UBJSON (XGBoost parses it as data: no pickle)."""
    from ml_assets.trainer.export import load_booster

    return load_booster(weights.read_bytes())


def code_dir(artifact: Path) -> Path:
    """The model directory's ``code/`` (where MLflow copies ``code_paths``), from one of its artifacts."""
    return artifact.parent.parent / "code"


def class_frame(probabilities, classes: list[str]):
    """Multiclass predictions as a pandas DataFrame: a probability column per class, then the most
    probable class's name."""
    import numpy as np
    import pandas as pd

    out = pd.DataFrame(probabilities, columns=list(classes))
    out[PREDICTED_CLASS] = np.asarray(classes, dtype=object)[probabilities.argmax(axis=1)]
    return out


def output_schema(classes: list[str]):
    """What predict returns, for the model's signature."""
    from mlflow.types import ColSpec, Schema

    if not classes:
        return Schema([ColSpec("double")])
    return Schema([*(ColSpec("double", c) for c in classes), ColSpec("string", PREDICTED_CLASS)])


def signature_columns(spec) -> list:
    """The model's inputs: the feature columns (required), the time parts and the raw timestamp
    they may be derived from instead (optional: one or the other is needed)."""
    from mlflow.types import ColSpec

    feats = spec.features
    time = feats.time
    parts = {f"{time.prefix}{p}" for p in time.parts} if time else set()
    ts = [(time.column if time else None) or spec.partitioning.timestamp_column] if parts else []
    return [*(ColSpec("double", c, required=c not in parts) for c in feats.numeric_names),
            *(ColSpec("string", c, required=c not in parts) for c in feats.categorical_names),
            *(ColSpec("string", c, required=False) for c in ts if c not in feats.categorical_names)]


def input_example(spec, rows):
    """A few real rows (a polars frame of the features as built) as the signature types them."""
    import polars as pl

    columns = [c for c in signature_columns(spec) if c.name in rows.columns]
    typed = rows.head(EXAMPLE_ROWS).select(
        [pl.col(c.name).cast(pl.Float64 if c.type.to_numpy().kind == "f" else pl.String) for c in columns])
    return typed.to_pandas()


def save(path: Path, files: dict[str, bytes], spec_json: bytes, example=None) -> Path:
    """Write an MLflow pyfunc model directory at ``path`` from the exported files; ``example``: a few
    feature rows (pandas) logged as its input example."""
    import tempfile

    from mlflow.models import ModelSignature
    from mlflow.types import Schema

    from ml_assets.spec import ModelSpec

    spec, meta = ModelSpec.model_validate(json.loads(spec_json)), json.loads(files[META_FILE])
    signature = ModelSignature(inputs=Schema(signature_columns(spec)), outputs=output_schema(meta.get("classes") or []))
    with tempfile.TemporaryDirectory(prefix="ml_assets-pyfunc-") as tmp:
        artifacts = {}
        for name in files_of(meta):
            (Path(tmp) / name).write_bytes(spec_json if name == SPEC_FILE else files[name])
            artifacts[name] = str(Path(tmp) / name)
        # The library's code travels with the model, as a factory's does (no bytecode, no demo specs).
        code = Path(tmp) / "code" / "ml_assets"
        shutil.copytree(PACKAGE, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "models"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            mlflow.pyfunc.save_model(
                str(path), python_model=str(CODE), artifacts=artifacts, signature=signature,
                input_example=example,
                # Pinned here: inferring requirements would load and run the model in a subprocess.
                pip_requirements=requirements(meta),
                code_paths=[str(code), *(_factory_code(meta, spec) or [])],
            )
    return path


def requirements(meta: dict | None = None) -> list[str]:
    """The serving packages of the export ``meta`` describes (``serving_packages``) at the versions
    installed here, as an index publishes them: a local label (torch's ``+cpu``) is dropped, since an
    index serves ``2.13.0`` and a wheel's label says its build."""
    from importlib.metadata import distributions

    installed = {(dist.name or "").lower(): dist.version for dist in distributions()}
    return [f"{name}=={installed[name].split('+')[0]}" for name in serving_packages(meta or {}) if name in installed]


def serving_packages(meta: dict) -> tuple[str, ...]:
    """SERVING_PACKAGES, and for a booster the distribution that provides ``xgboost`` here: XGBoost
    publishes the same module as ``xgboost`` (with CUDA) and ``xgboost-cpu``, and the model must be
    served by the build it was registered with, not whichever an index resolves ``xgboost`` to."""
    if not is_booster(meta):
        return SERVING_PACKAGES
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    found = sorted({dist.lower() for name in BOOSTER_IMPORTS for dist in owners.get(name, [])})
    if not found:
        raise RuntimeError(f"a booster model needs {', '.join(BOOSTER_IMPORTS)} to be served, and it is not "
                           "installed here to pin its version (pip install xgboost)")
    return (*SERVING_PACKAGES, *found)


def _factory_code(meta: dict, spec) -> list[str] | None:
    """A factory's package directory (or module file), checked against its pin, to travel with the model."""
    if "model_factory" not in meta:
        return None
    from ml_assets.trainer import code_pin

    pinned = meta["model_factory"]["code"]
    code_pin.verify(pinned, spec.model.code_path or "")
    return [str(code_pin.package_root(pinned["module"], spec.model.code_path or ""))]


def _saved_meta(model_dir: Path) -> dict:
    """A saved (or downloaded) pyfunc directory's meta.json; empty without one (the caller then finds
    a network's file names missing and says so)."""
    path = model_dir / "artifacts" / META_FILE
    return json.loads(path.read_bytes()) if path.is_file() else {}


def model_files(model_dir: Path) -> dict[str, Path]:
    """The exported files inside a saved (or downloaded) pyfunc directory, by name: the weights file
    is the one its meta.json names (``model.safetensors``, or ``model.ubj`` for a booster)."""
    return {name: model_dir / "artifacts" / name for name in files_of(_saved_meta(model_dir))}


def weights_path(model_dir: Path) -> Path:
    """The weights file inside a saved (or downloaded) pyfunc directory, whichever kind of export."""
    return model_dir / "artifacts" / weights_file(_saved_meta(model_dir))
