"""Links to the Dagster UI that records carry (commit metadata, MLflow tags)."""

import dagster as dg


class DagsterLinksResource(dg.ConfigurableResource):
    """The Dagster UI's public address (``ML_ASSETS_DAGSTER_URL``, read by the definitions)."""

    base_url: str = "http://127.0.0.1:3000"

    def run_url(self, run_id: str) -> str:
        return f"{self.base_url.rstrip('/')}/runs/{run_id}"
