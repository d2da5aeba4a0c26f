"""Model versions in the MLflow registry: runs found by key, versions by checkpoint, aliases, and
a version's files downloaded and verified against its tags."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ml_assets.layout import META_FILE, MLFLOW_MODEL
from ml_assets.names import check_model_name
from ml_assets.registry.record import VersionTags

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from ml_assets.trainer.checkpoint import LoadedCheckpoint

CHALLENGER = "challenger"
CHAMPION = "champion"


class RegistryError(Exception):
    """A model, version or alias that does not exist, model files that do not match their record, or
    an operation MLflow refused to this identity."""


class PermissionDenied(RegistryError):
    """MLflow's authentication refused an operation on a registered model (HTTP 403, or 401 for
    credentials it does not accept); the message names the model, the operation and the user."""

    def __init__(self, model: str, operation: str, user: str | None, status: int, hint: str = "") -> None:
        self.model, self.operation, self.user, self.status = model, operation, user, status
        who = f"MLflow user {user!r}" if user else "this client (MLFLOW_TRACKING_USERNAME is not set)"
        if status == 401:
            why = (f"not authenticated (HTTP 401): MLflow does not accept the credentials of {who}; "
                   "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
        else:
            why = f"permission denied (HTTP 403) for {who}" + (f": {hint}" if hint else "")
        super().__init__(f"model {model!r}: {operation}: {why}")


PLATFORM_ONLY = ("only the platform's identity registers versions and moves @champion and @challenger "
                 "(docs/deployment.md, \"Who can do what\")")


def refusal(exc: MlflowException, model: str, operation: str, hint: str = "") -> PermissionDenied | None:
    """``exc`` as PermissionDenied when it is MLflow's 401 or 403, else None."""
    from mlflow.environment_variables import MLFLOW_TRACKING_USERNAME

    status = exc.get_http_status_code()
    if status not in (401, 403):
        return None
    return PermissionDenied(model, operation, MLFLOW_TRACKING_USERNAME.get(), status, hint)


@contextmanager
def refused_as(model: str, operation: str, hint: str = PLATFORM_ONLY) -> Iterator[None]:
    """MLflow's 401 and 403 inside, raised as PermissionDenied naming ``operation`` on ``model``."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        denied = refusal(exc, model, operation, hint)
        if denied is None:
            raise
        raise denied from None


def check_can_set_alias(client: MlflowClient, name: str, alias: str) -> None:
    """PermissionDenied unless this identity may point ``alias`` of ``name`` at a version.

    Asks MLflow to point it at version 0, which never exists: the server's authentication answers
    before the request is carried out, so an identity without the permission gets MLflow's own 403,
    and one with it gets "no such version" and nothing changes. A move that would be refused is
    thus refused before anything of it (a pending record, a log line, a Dagster run) is written."""
    from mlflow.exceptions import MlflowException

    check_model_name(name)
    with refused_as(name, f"set alias {alias}"):
        try:
            client.set_registered_model_alias(name, alias, "0")
        except MlflowException as exc:
            if exc.get_http_status_code() in (401, 403):
                raise


def keyed_run(client: MlflowClient, experiment_id: str, key: str, value: str, run_name: str,
              tags: dict[str, str]) -> str:
    """The MLflow run tagged ``key=value``: found, or created once (re-runs and retries reuse it)."""
    found = client.search_runs([experiment_id], filter_string=f"tags.{key} = '{value}'",
                               max_results=1, order_by=["attributes.start_time ASC"])
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=run_name, tags={
        **tags, key: value, "mlflow.source.name": "ml_assets"})
    return run.info.run_id


def training_run(client: MlflowClient, experiment_id: str, run_name: str, checkpoint_sha: str,
                 tags: dict[str, str]) -> str:
    """The MLflow run of the training that produced ``checkpoint_sha``."""
    return keyed_run(client, experiment_id, "checkpoint_sha256", checkpoint_sha, run_name, tags)


def ensure_registered_model(client: MlflowClient, name: str, description: str, owner: str, team: str) -> None:
    from mlflow.exceptions import MlflowException

    if client.search_registered_models(filter_string=f"name='{name}'"):
        return
    try:
        client.create_registered_model(name, description=description, tags={"owner": owner, "team": team})
    except MlflowException:  # created by a concurrent run in between
        if not client.search_registered_models(filter_string=f"name='{name}'"):
            raise


def version_of_checkpoint(client: MlflowClient, name: str, checkpoint_sha: str) -> ModelVersion | None:
    found = client.search_model_versions(f"name='{name}' and tags.checkpoint_sha256='{checkpoint_sha}'")
    return min(found, key=lambda v: int(v.version)) if found else None


def by_alias(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def get_version(client: MlflowClient, name: str, version: str) -> ModelVersion:
    """A version by number, or RegistryError naming what is wrong (model name, number, existence)."""
    from mlflow.exceptions import MlflowException

    check_model_name(name)
    if not str(version).isdigit() or int(version) < 1:
        raise RegistryError(f"version {version!r} is not a version number (1, 2, ...)")
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        raise refusal(exc, name, "read") or RegistryError(f"model {name!r} is not registered") from None
    try:
        return client.get_model_version(name, str(int(version)))
    except MlflowException:
        raise RegistryError(f"model {name!r} has no version {version}") from None


def move_challenger(client: MlflowClient, name: str, version: str, partition: str) -> bool:
    """Point @challenger at this version unless it already names a newer partition's model.

    Re-running an old partition must not push a newer challenger aside.
    """
    current = by_alias(client, name, CHALLENGER)
    newer = current is not None and VersionTags.from_tags(current.tags).partition > partition
    if newer and str(current.version) != str(version):
        return False
    client.set_registered_model_alias(name, CHALLENGER, str(version))
    return True


def run_json(client: MlflowClient, run_id: str | None, path: str) -> dict | None:
    """A JSON artifact of an MLflow run (the evaluation report, the trainer config), or None when the
    run lacks it or there is no run (a version registered by hand, outside the pipeline)."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    with tempfile.TemporaryDirectory(prefix="ml_assets-run-") as tmp:
        try:
            return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_bytes())
        except (MlflowException, OSError):
            return None


def download(client: MlflowClient, mv: ModelVersion, path: str, dest: str | Path) -> Path:
    """A directory of the version's MLflow run, downloaded; RegistryError naming the version and where
    its artifacts were when they cannot be read (objects lost behind the registry's back, a store
    that does not answer), instead of MLflow's traceback."""
    from mlflow.exceptions import MlflowException

    try:
        return Path(client.download_artifacts(mv.run_id, path, str(dest)))
    except (MlflowException, OSError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise RegistryError(f"{mv.name} version {mv.version}: its artifacts ({mv.source}) cannot be read: "
                            f"{reason}") from None


def download_model(client: MlflowClient, mv: ModelVersion, dest: Path) -> Path:
    """The version's pyfunc directory, its weights (``model.safetensors``, or a booster's ``model.ubj``,
    as its meta.json names it) checked against the version's sha256 tag."""
    from ml_assets.serving.pyfunc import weights_path

    local = download(client, mv, MLFLOW_MODEL, dest)
    try:
        weights = weights_path(local)
    except (ValueError, OSError) as exc:  # a meta.json that cannot be read or names no known file
        raise RegistryError(f"{mv.name} version {mv.version}: {mv.source}/artifacts/{META_FILE}: {exc}") from None
    expected = VersionTags.from_tags(mv.tags).checkpoint_sha256
    if not weights.exists():
        raise RegistryError(f"{mv.name} version {mv.version}: {mv.source} has no artifacts/{weights.name}")
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    if actual != expected:
        raise RegistryError(f"{mv.name} version {mv.version}: weights sha256 {actual} differ from the "
                            f"registered {expected}")
    return local


def check_loadable(client: MlflowClient, mv: ModelVersion) -> None:
    """RegistryError (one line) unless the version's model files can be read and its weights hash to
    its record: what promotion asks before it points an alias at a version."""
    with tempfile.TemporaryDirectory(prefix="ml_assets-loadable-") as tmp:
        download_model(client, mv, Path(tmp))


def load_version(client: MlflowClient, mv: ModelVersion) -> LoadedCheckpoint:
    """A registered version as the evaluation loads a fresh checkpoint (verified, pickle-free): a
    network, or a booster (``LoadedCheckpoint.model`` an ``xgboost.Booster``)."""
    from ml_assets.serving.pyfunc import code_dir, weights_path
    from ml_assets.trainer.checkpoint import load_checkpoint
    from ml_assets.trainer.config import DataRef

    with tempfile.TemporaryDirectory(prefix="ml_assets-version-") as tmp:
        local = download_model(client, mv, Path(tmp))
        meta = local / "artifacts" / META_FILE
        # A factory's model is rebuilt from the code registered with it (its pin is checked).
        return load_checkpoint(DataRef(uri=str(weights_path(local)), sha256=VersionTags.from_tags(mv.tags).checkpoint_sha256),
                               DataRef(uri=str(meta), sha256=hashlib.sha256(meta.read_bytes()).hexdigest()),
                               code_path=str(code_dir(meta)))
