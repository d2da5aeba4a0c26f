"""The MLflow side of a model's life, shared by the assets, the promotion job and the CLI.

One MLflow run per training (found again by the checkpoint's sha256, so a re-run or a retry never
makes a second one), one model version per run, aliases ``challenger`` (the newest registered) and
``champion`` (what serves; moved only by ``ml_assets.promotion``). ``assets`` holds the
registered_model asset, ``register`` its work.
"""

from ml_assets.registry.versions import (
    CHALLENGER,
    CHAMPION,
    RegistryError,
    by_alias,
    download_model,
    ensure_registered_model,
    get_version,
    keyed_run,
    load_version,
    move_challenger,
    run_json,
    training_run,
    version_of_checkpoint,
)

__all__ = ["CHALLENGER", "CHAMPION", "RegistryError", "by_alias", "download_model",
           "ensure_registered_model", "get_version", "keyed_run", "load_version", "move_challenger", "run_json", "training_run",
           "version_of_checkpoint"]
