"""Tuning: hyperparameters, an Optuna study whose trials run the same trainer as trained_checkpoint.

- ``assets``: the hyperparameters asset, its job and schedule; ``search``: the study's window and
  job; ``study``: the trial worker (``python -m ml_assets.tuning.study``); ``space``: the search
  space; ``resource``: the workers' launcher; ``k8s_job``: the workers as pods;
- ``record``: TunedRecord;
- spec section: ``tuning`` (ml_assets.spec.tuning).
"""
