"""Hyperparameter search: an Optuna study whose trials run the same trainer as trained_checkpoint."""
