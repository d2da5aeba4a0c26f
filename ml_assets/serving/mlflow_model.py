"""MLflow "models from code" entry point: MLflow runs this file to build the model, so nothing is
pickled. The registered model directory carries it next to its weights (safetensors, or a booster's
UBJSON ``model.ubj``), the fitted feature state and the spec (JSON)."""

from mlflow.models import set_model

from ml_assets.serving.pyfunc import TabularModel

set_model(TabularModel())
