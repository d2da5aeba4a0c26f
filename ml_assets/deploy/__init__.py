"""How ml_assets is deployed: the machinery around the code location, not the pipeline itself.

- ``run_launcher``: the production run launcher (ml_assets/instance/production.yaml ``run_launcher``), whose
  run workers run monitoring can watch and resume;
- ``pg_storage``: dagster-postgres's storage with a kept connection per process (``storage: custom``);
- ``services``: the MLflow server's command (``ml-assets mlflow-server``), with MLflow's authentication;
- ``mlflow_users``: its identities, made by its admin (``ml-assets mlflow-users``);
- ``preload``: what the multiprocess executor's fork server imports first (builds the definitions);
- ``alerts``: run-failure alerts to a webhook, the sensor and what it sends;
- ``k8s``: Kubernetes (ML_ASSETS_ENV=k8s): step pods, the multi-node training Job, trial pods.

The only imports of Dagster's private modules (``dagster._*``) in ml_assets live here, pinned to
dagster 1.13.27 (pyproject.toml); upgrading Dagster means re-reading them
(ml_assets_tests/production/test_private_imports.py keeps them here and fails when the installed
version differs from this one). They are private because Dagster's public API has none for what
they do:

- a run launcher: ``RunLauncher`` and its contexts and health results (``dagster._core.launcher``),
  the run worker's command (``ExecuteRunArgs``, ``ResumeRunArgs`` in ``dagster._grpc.types``), its
  entry point (``dagster._cli.main``) and the run-retries tag (``dagster._core.storage.tags``);
- a class that dagster.yaml names by ``module`` and ``class`` (the launcher, the storage):
  ``ConfigurableClass`` and ``ConfigurableClassData`` (``dagster._serdes``).

Nothing is imported here: the trainer and the CLI import ``ml_assets`` without paying for Dagster.
"""
