"""The MLflow side of a model's life, shared by the assets, the promotion job and the CLI.

One MLflow run per training (found again by the checkpoint's sha256, so a re-run or a retry never
makes a second one), one model version per run, aliases ``challenger`` (the newest registered) and
``champion`` (what serves; moved only by ``ml_assets.promotion``).

- ``assets``: the registered_model asset; ``register``: its work; ``versions``: MLflow's registry
  (runs, versions, aliases); ``record``: RegisteredRecord, VersionTags, GateTags;
- spec section: ``card`` (ml_assets.spec.card).
"""
