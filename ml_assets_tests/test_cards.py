"""How a model card shows the way its version was trained: a full training and why, or the parent it
was fine-tuned from and the chain back to the full training, built from a real MLflow registry
(SQLite) whose versions carry the pipeline's tags (ml_assets_tests.test_audit.registry_of_chains)."""

import pytest

from ml_assets import cards
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets_tests.test_audit import FINE_REASON, registry_of_chains, w

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return registry_of_chains(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def test_a_fine_tunes_card_names_its_parent_and_the_chain_back_to_the_full_training(client):
    text, page = cards.build(client, SPEC, "3", [])
    assert (f"**Training**: fine-tuned from version 2 (partition 2013-03-09), starting from its weights: "
            f"{FINE_REASON.format(2)}.") in text
    assert ("Its weights carry 3 trainings, back to the last full one: version 1 (a full training for 2013-03-08) "
            "→ version 2 (a fine-tune for 2013-03-09) → version 3 (this one: a fine-tune for 2013-03-10).") in text
    assert "`ml-assets reproduce flights_delay --version 3 --chain`" in text
    # Right under the status line, before the intended use; and in the page an auditor opens.
    assert text.index("**Training**") < text.index("## Intended use")
    assert "version 1 (a full training for 2013-03-08)" in page
    assert not [x for x in cards.limits(cards.collect(client, SPEC, "3", [])) if "weights" in x]


@pytest.mark.parametrize(("version", "says"), [
    ("4", "**Training**: a full training, from scratch: scheduled: every 3 days."),
    ("5", "**Training**: a full training, from scratch: registered before training decisions were recorded."),
])
def test_a_full_trainings_card_says_it_is_one_and_why(client, version, says):
    text, _ = cards.build(client, SPEC, version, [])
    assert says in text and "Its weights carry" not in text


def test_a_fine_tune_that_did_not_start_from_its_parents_weights_is_among_the_cards_limits(client):
    found = cards.limits(cards.collect(client, SPEC, "6", []))
    assert (f"version 6 started from weights (sha256 {'9' * 16}) that are not version 4's registered weights "
            f"({w(4)[:16]})") in found


def test_a_fine_tune_whose_parent_is_gone_says_its_chain_cannot_be_followed(client):
    card = cards.collect(client, SPEC, "7", [])
    text = cards.render_markdown(card)
    assert "**Training**: fine-tuned from version 99 (partition ?)" in text and "Its chain cannot be followed" in text
    assert any(x.startswith("its chain of trainings cannot be followed") for x in cards.limits(card))
