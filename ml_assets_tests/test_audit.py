"""How ``ml-assets audit`` shows a version's training: full (and why) or a fine-tune with its chain
back to the last full training, read from a real MLflow registry (SQLite) whose versions carry the
tags the pipeline registers (ml_assets.registry.record.VersionTags)."""

import hashlib
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ml_assets import audit
from ml_assets.registry.record import VersionTags
from ml_assets_tests.helpers import version_with_files

MODEL = "flights_delay"
FULL_REASON = "no @champion of flights_delay to fine-tune yet"
FINE_REASON = "the champion v{} still fits the window: fine-tuning it on the newest day"


def weights(n: int) -> bytes:
    return f"weights of version {n}".encode()


def w(n: int) -> str:
    """Version ``n``'s weights' sha256."""
    return hashlib.sha256(weights(n)).hexdigest()


def _tags(partition: str, weights: str, days: dict[str, str], decision: str = "", reason: str = "",
          parent: tuple[str, str] = ("", ""), chain_start: str = "") -> dict[str, str]:
    """A version's tags as the pipeline registers them (``decision`` empty: from before decisions)."""
    return VersionTags(
        data_commit=days[max(days)], data_commits=days, test_data_commit="t" * 40, test_days=[], skipped_days={},
        dagster_run_id="run", dagster_run_url="", partition=partition, code_version="code", checkpoint_sha256=weights,
        checkpoint_uri=f"/checkpoints/{partition}/model.safetensors", feature_state_sha256="f" * 64,
        feature_state_uri="", world_size="1", seed="0", torch_version="2", hyperparameters_source="spec",
        training_decision=decision, training_decision_reason=reason, parent_version=parent[0],
        parent_checkpoint_sha256=parent[1], chain_start_partition=chain_start or partition).to_tags()


def registry_of_chains(db: Path) -> MlflowClient:
    """A registry at ``db``: 1 full, 2 and 3 fine-tunes of it in turn, 4 a scheduled full retrain, 5 from
    before decisions, 6 a fine-tune of 4 that started from other weights than 4's, 7 a fine-tune whose
    parent is gone."""
    client = MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    client.create_registered_model(MODEL)
    versions = [
        _tags("2013-03-08", w(1), {"2013-03-06": "c06", "2013-03-07": "c07"}, "full", FULL_REASON),
        _tags("2013-03-09", w(2), {"2013-03-07": "c07", "2013-03-08": "c08"}, "fine_tune", FINE_REASON.format(1),
              ("1", w(1)), "2013-03-08"),
        _tags("2013-03-10", w(3), {"2013-03-08": "c08b", "2013-03-09": "c09"}, "fine_tune",
              FINE_REASON.format(2), ("2", w(2)), "2013-03-08"),
        _tags("2013-03-11", w(4), {"2013-03-09": "c09", "2013-03-10": "c10"}, "full", "scheduled: every 3 days"),
        _tags("2013-03-05", w(5), {"2013-03-04": "c04"}),
        _tags("2013-03-12", w(6), {"2013-03-11": "c11"}, "fine_tune", FINE_REASON.format(4), ("4", "9" * 64)),
        _tags("2013-03-13", w(7), {"2013-03-12": "c12"}, "fine_tune", FINE_REASON.format(99), ("99", "8" * 64)),
    ]
    for n, tags in enumerate(versions, start=1):
        version_with_files(client, MODEL, tags, db.parent / "runs", weights=weights(n))
    return client


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> MlflowClient:
    return registry_of_chains(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def test_a_fine_tune_lists_its_chain_back_to_the_full_training_and_every_day_it_read(client):
    training = audit.training_chain(client, MODEL, "3")
    assert (training["decision"], training["reason"], training["broken"]) == ("fine_tune", FINE_REASON.format(2), None)
    assert [(c["version"], c["partition"], c["decision"], c["weights_sha256"], c["started_from_parent_weights"])
            for c in training["chain"]] == [("1", "2013-03-08", "full", w(1), None),
                                            ("2", "2013-03-09", "fine_tune", w(2), True),
                                            ("3", "2013-03-10", "fine_tune", w(3), True)]
    # Each version's days, by version: a day read again at a new commit shows both commits.
    assert [(d["day"], d["commit"], d["versions"]) for d in training["data_commits"]] == [
        ("2013-03-06", "c06", ["1"]), ("2013-03-07", "c07", ["1", "2"]), ("2013-03-08", "c08", ["2"]),
        ("2013-03-08", "c08b", ["3"]), ("2013-03-09", "c09", ["3"])]
    text = "\n".join(audit.render_training({**training, "fine_tune": None}))
    assert text.startswith(f"## Training: fine_tune\n\nFine-tuned from version 2: {FINE_REASON.format(2)}.")
    assert f"| 1 | 2013-03-08 | full | `{w(1)[:16]}` | - |" in text
    assert f"| 3 | 2013-03-10 | fine_tune | `{w(3)[:16]}` | yes |" in text
    assert "| 2013-03-07 | c07 | 1, 2 |" in text and "| 2013-03-08 | c08b | 3 |" in text


def test_a_fine_tune_that_did_not_start_from_its_parents_registered_weights_says_so(client):
    training = audit.training_chain(client, MODEL, "6")
    assert [(c["version"], c["started_from_parent_weights"]) for c in training["chain"]] == [("4", None), ("6", False)]
    text = "\n".join(audit.render_training({**training, "fine_tune": None}))
    assert f"| 6 | 2013-03-12 | fine_tune | `{w(6)[:16]}` | **NO**: started from {'9' * 16} |" in text


def test_what_a_fine_tune_trained_on_comes_from_its_registered_decision(client):
    shown = audit._fine_tune({"kind": "fine_tune", "reason": "fits", "fine_tune_days": ["2013-03-09"], "epochs": 1,
                              "learning_rate": 0.001, "replay": {"rows": 40}})
    assert shown == {"fine_tune": {"days": ["2013-03-09"], "epochs": 1, "learning_rate": 0.001, "replay_rows": 40}}
    assert audit._fine_tune({"kind": "full", "reason": "scheduled"}) == {"fine_tune": None}
    text = audit.render_training({**audit.training_chain(client, MODEL, "3"), **shown})
    assert text[3] == "It trained 1 epoch(s) at learning rate 0.001 on 2013-03-09, with 40 replayed row(s) of older days."


def test_a_fine_tune_whose_parent_is_gone_is_audited_with_its_chain_marked_broken(client):
    training = audit.training_chain(client, MODEL, "7")
    assert [c["version"] for c in training["chain"]] == ["7"] and "99" in training["broken"]
    assert "**Its chain cannot be followed**" in "\n".join(audit.render_training({**training, "fine_tune": None}))


@pytest.mark.parametrize(("version", "says"), [
    ("4", "A full training, from scratch: scheduled: every 3 days."),
    ("5", "A full training, from scratch: registered before training decisions were recorded."),
])
def test_a_full_training_says_it_is_one_and_why(client, version, says):
    training = audit.training_chain(client, MODEL, version)
    assert [c["version"] for c in training["chain"]] == [version] and training["decision"] == "full"
    assert audit.render_training({**training, "fine_tune": None}) == ["## Training: full", "", says]
