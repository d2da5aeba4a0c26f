"""Promotion and rollback: moving ``@champion``, with one audit record kept in three places.

A record (model, action, version, previous champion, evidence, policy, decision, reason, time,
actor) is written to the production_model materialization's metadata, to the promoted version's
MLflow tags and, appended to ``promotions/<model>.jsonl``, to main of the model's version-store
repository (through a branch and a merge, like every other write to main).

Crash safety. The record is first stored as a ``promotion.pending`` tag of the registered model;
then the alias moves, the log is appended (skipped if the record's id is already there), the
version is tagged, and the pending tag is removed. A run that dies anywhere in between leaves the
pending tag, and the next promotion run (a re-tick, a retry, any CLI call) finishes that record
before doing anything else: one alias, one record, whatever the crash point.

Who. Only an identity MLflow lets set the alias moves it (the platform's, docs/deployment.md "Who
can do what"); any other is refused with MLflow's 403 before the pending tag, so a refused move
writes nothing.

- ``assets``: the production_model asset, its job and sensor; ``config``: the job's config;
  ``moves``: the work; ``record``: PromotionRecord;
- spec section: ``promotion`` (ml_assets.spec.promotion), shared with the evaluation's gate.
"""
