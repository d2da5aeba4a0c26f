"""The trainer's own row and column sampling for boosted models: drawn from (seed, round) alone,
the same rows left out whatever the number of workers, and each tree built from its drawn columns."""

from __future__ import annotations

import re

import numpy as np
import xgboost

from ml_assets.trainer.booster_sampling import Sampler


class Recorder:
    def __init__(self) -> None:
        self.info: dict = {}

    def set_info(self, **kw) -> None:
        self.info.update(kw)


def drawn(params: dict, rows: int, first: int, last: int, round_: int, features: int = 10) -> dict:
    out = Recorder()
    Sampler(params, 7, rows, first, last, features).apply(out, round_)
    return out.info


def test_two_workers_leave_out_the_rows_one_worker_leaves_out():
    params = {"subsample": 0.7, "colsample_bytree": 0.5}
    one = drawn(params, 1000, 0, 1000, 3)
    halves = [drawn(params, 1000, 0, 500, 3), drawn(params, 1000, 500, 1000, 3)]
    np.testing.assert_array_equal(np.concatenate([h["weight"] for h in halves]), one["weight"])
    assert all((h["feature_weights"] == one["feature_weights"]).all() for h in halves)
    assert set(np.unique(one["weight"])) == {0.0, 1.0} and 600 < one["weight"].sum() < 800
    assert one["feature_weights"].sum() == 5
    # Another round draws anew; the same round draws the same, in any process.
    assert not (drawn(params, 1000, 0, 1000, 4)["weight"] == one["weight"]).all()
    np.testing.assert_array_equal(drawn(params, 1000, 0, 1000, 3)["weight"], one["weight"])


def test_without_sampling_nothing_is_set_and_xgboost_is_told_nothing():
    sampler = Sampler({"max_depth": 3}, 7, 100, 0, 100, 4)
    out = Recorder()
    sampler.apply(out, 0)
    assert out.info == {} and sampler.xgb_params() == {}


def test_each_tree_is_built_from_its_rounds_drawn_columns():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 12)).astype(np.float32)
    y = (x[:, :6].sum(axis=1) + rng.normal(size=3000) > 0).astype(np.float32)
    dtrain = xgboost.QuantileDMatrix(x, y)
    params = {"colsample_bytree": 0.25, "subsample": 0.8}
    sampler = Sampler(params, 7, 3000, 0, 3000, 12)
    booster = xgboost.Booster({"objective": "binary:logistic", "max_depth": 3, "nthread": 1,
                               **sampler.xgb_params()}, [dtrain])
    allowed = []
    for r in range(15):
        sampler.apply(dtrain, r)
        allowed.append(set(np.flatnonzero(dtrain.get_float_info("feature_weights"))))
        booster.update(dtrain, r)
    for r, tree in enumerate(booster.get_dump()):
        used = {int(f) for f in re.findall(r"\[f(\d+)<", tree)}
        assert used and used <= allowed[r], (r, used, allowed[r])
        assert len(allowed[r]) == 3
