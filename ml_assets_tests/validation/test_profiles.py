"""Which relations calibration judges: only those that hold on the part of the history they were not
fitted on (synthetic daily deviations, so that the truth is known)."""

from __future__ import annotations

import numpy as np

from ml_assets.spec.calibration import Signal
from ml_assets.validation.profiles import fit_relations

DAYS = 730


def _signals() -> dict[str, Signal]:
    return {"temp:mean": Signal(column="temp", measure="mean"), "dew:mean": Signal(column="dew", measure="mean"),
            "sky:share=sun": Signal(column="sky", measure="share=sun")}


def _deviations(label_breaks: bool) -> np.ndarray:
    """temp follows dew and the sunny days; the sky label stops meaning "sun" halfway when
    ``label_breaks`` (as Seattle's weather label stopped saying "rain" in April 2013)."""
    rng = np.random.default_rng(7)
    dew = rng.normal(size=DAYS)
    sun = (rng.random(DAYS) < 0.5).astype(float)
    temp = 0.6 * dew + 1.5 * (sun - 0.5) + rng.normal(scale=0.5, size=DAYS)
    label = sun.copy()
    if label_breaks:
        label[DAYS // 2:] = (rng.random(DAYS - DAYS // 2) < 0.5).astype(float)
    return np.column_stack([temp, dew, label - label.mean()])


def test_a_category_share_that_holds_across_the_history_is_an_input():
    relation = fit_relations(_signals(), _deviations(label_breaks=False))["temp:mean"]
    assert relation["sky:share=sun"] > 1.0
    assert "dew:mean" in relation


def test_a_category_whose_meaning_changed_within_the_history_is_left_out_of_the_relation():
    relation = fit_relations(_signals(), _deviations(label_breaks=True))["temp:mean"]
    assert "dew:mean" in relation
    assert not any(k.startswith("sky:") for k in relation), relation


def test_a_relation_that_explains_little_out_of_sample_is_not_judged():
    rng = np.random.default_rng(3)
    noise = rng.normal(size=(DAYS, 3))
    noise[:, 2] = (rng.random(DAYS) < 0.5) - 0.5
    assert fit_relations(_signals(), noise) == {}
