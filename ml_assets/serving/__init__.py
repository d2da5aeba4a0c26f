"""The registered model as MLflow sees it: a pickle-free pyfunc that predicts from feature rows."""
