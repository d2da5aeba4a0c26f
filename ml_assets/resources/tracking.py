from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


class MlflowTrackingResource(dg.ConfigurableResource):
    """MLflow tracking and registry. Runs are tagged with the Dagster run id, as dagster-mlflow does."""

    tracking_uri: str
    # Empty with an MLflow server that serves artifacts: the server's --artifacts-destination decides.
    artifact_root: str
    ui_url: str = "http://127.0.0.1:5000"

    def client(self) -> MlflowClient:
        # Imported here: mlflow takes seconds to import and definitions load on every UI reload.
        import os

        from mlflow.tracking import MlflowClient

        from ml_assets.resources.retries import say_mlflow_retries
        from ml_assets.settings import public_url

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bars in run logs
        if self.tracking_uri.startswith(("http://", "https://")):
            say_mlflow_retries(public_url(self.tracking_uri))

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        client = self.client()
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        # Without an explicit location a local store would put artifacts in ./mlruns of whatever cwd.
        location = None
        if self.artifact_root:
            location = self.artifact_root.rstrip("/") + f"/{name}"
            if "://" not in location:
                Path(location).mkdir(parents=True, exist_ok=True)
                location = Path(location).resolve().as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:
            # Another run created it first.
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"{self.ui_url}/#/experiments/{experiment_id}/runs/{run_id}"

    def artifact_url(self, run_id: str, path: str) -> str:
        """The MLflow UI's download address of a run artifact (an image renders from it)."""
        from urllib.parse import quote

        return f"{self.ui_url}/get-artifact?path={quote(path)}&run_uuid={run_id}"

    def model_url(self, name: str, version: str) -> str:
        return f"{self.ui_url}/#/models/{name}/versions/{version}"
