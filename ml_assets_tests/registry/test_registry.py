"""The registry's alias rule, against a real MLflow registry on a temporary SQLite database."""

import pytest
from mlflow.tracking import MlflowClient

from ml_assets.registry.versions import CHALLENGER, move_challenger


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> MlflowClient:
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    client.create_registered_model("m")
    for partition in ("2013-01-15", "2013-01-16"):
        client.create_model_version("m", source=f"file:///x/{partition}", tags={"partition": partition})
    return client


def test_challenger_moves_forward_but_not_back(client):
    assert move_challenger(client, "m", "1", "2013-01-15")
    assert move_challenger(client, "m", "2", "2013-01-16")
    assert str(client.get_model_version_by_alias("m", CHALLENGER).version) == "2"
    assert not move_challenger(client, "m", "1", "2013-01-15")  # an old partition re-run
    assert str(client.get_model_version_by_alias("m", CHALLENGER).version) == "2"
    assert move_challenger(client, "m", "2", "2013-01-16")  # idempotent for the same version
