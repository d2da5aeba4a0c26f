"""hyperparameters: an Optuna study per model, whose best parameters feed training."""
