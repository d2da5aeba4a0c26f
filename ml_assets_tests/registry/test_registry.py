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


def test_an_attempt_logs_into_the_run_a_killed_attempt_left_without_changing_its_params(client):
    """The run of the same weights, left with params by an attempt killed before MLflow made its
    version: MLflow refuses to change a param, so only the missing ones are logged and the tag names
    those the earlier attempt logged differently (they were the run's failure on the re-run)."""
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    from ml_assets.registry.register import _unlogged

    run_id = client.create_run(client.create_experiment("attempts")).info.run_id
    client.log_batch(run_id, params=[Param("output_dir", "/ckpt/attempt-1"), Param("epochs", "2")])
    mine = [Param("output_dir", "/ckpt/attempt-2"), Param("epochs", "2"), Param("learning_rate", "0.01")]
    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        client.log_batch(run_id, params=mine)
    params, tags = _unlogged(client, run_id, mine, {"partition": "2013-03-01"})
    assert [p.key for p in params] == ["learning_rate"]
    assert tags == {"partition": "2013-03-01", "ml_assets.params_from_earlier_attempt": "output_dir"}
    client.log_batch(run_id, params=params)
    assert client.get_run(run_id).data.params == {"output_dir": "/ckpt/attempt-1", "epochs": "2", "learning_rate": "0.01"}
