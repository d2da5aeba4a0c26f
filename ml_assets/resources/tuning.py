import dagster as dg


class TuningResource(dg.ConfigurableResource):
    """Where tuning studies live: the Optuna storage URL (a secret when it is PostgreSQL: from the
    environment, ``ML_ASSETS_OPTUNA_STORAGE``) and a working directory for the trials."""

    storage_url: str
    workdir: str
    threads_per_process: int = 1

    def is_sqlite(self) -> bool:
        return self.storage_url.startswith("sqlite")
