"""Row and column sampling drawn by the trainer, from (seed, round) alone.

XGBoost draws ``subsample`` and ``colsample_bytree`` from a generator that lives in the running
process and is never saved with a model: a booster loaded from a checkpoint would draw other rows
and columns than the run that saved it, and a resumed training would end with other trees. Here
each round's samples are drawn from a generator seeded by the seed and the round, and handed to
XGBoost as data:

- rows: a weight of 0 or 1 per row. XGBoost's own ``subsample`` zeroes the gradient pairs of the
  rows it leaves out; a weight of 0 does exactly that. The draw covers the whole window's rows and
  each rank takes its range, so 1 and 2 workers leave out the same rows.
- a tree's columns: a feature weight of 1 for the ``k`` columns drawn and 0 for the others, with
  XGBoost's ``colsample_bytree`` set so that it draws exactly ``k`` (weighted, without
  replacement): it can only draw the columns of weight 1, so its own generator no longer decides.

The cost is a draw per round over the window's rows (about 0.1 ms per 50,000 rows), against the
reload a checkpointed booster would otherwise need at each resume point (benchmarks/xgb_overhead.py).
The next round's draw is made on a helper thread while XGBoost builds the current tree (it releases
the GIL), so only setting the weights stays on the training loop's path. A draw depends on (seed,
round) alone, so which thread makes it changes nothing.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np


class Sampler:
    """The samples of one round, for this rank's rows ``[first, last)`` of a window of ``rows``."""

    def __init__(self, params: dict, seed: int, rows: int, first: int, last: int, features: int) -> None:
        self.seed, self.rows, self.first, self.last, self.features = seed, rows, first, last, features
        self.row_rate = float(params.get("subsample", 1.0))
        rate = float(params.get("colsample_bytree", 1.0))
        # XGBoost's own count of a tree's columns: int(rate * columns), which it requires to be > 0.
        self.columns = max(1, int(rate * features))
        self._helper: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future] | None = None

    @property
    def rows_sampled(self) -> bool:
        return self.row_rate < 1.0

    @property
    def columns_sampled(self) -> bool:
        return self.columns < self.features

    def xgb_params(self) -> dict:
        """What XGBoost is told in place of subsample and colsample_bytree."""
        # (k + 0.5) / n: int() of it times n is exactly k, whatever the float rounding.
        return {"colsample_bytree": (self.columns + 0.5) / self.features} if self.columns_sampled else {}

    def draw(self, round_: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The round's row weights (this rank's rows) and feature weights; None where not sampled."""
        draw = np.random.Generator(np.random.PCG64([self.seed, round_]))
        rows = columns = None
        if self.rows_sampled:
            rows = (draw.random(self.rows, dtype=np.float32)[self.first:self.last] < self.row_rate).astype(np.float32)
        if self.columns_sampled:
            columns = np.zeros(self.features, dtype=np.float32)
            columns[draw.choice(self.features, self.columns, replace=False)] = 1.0
        return rows, columns

    def apply(self, dtrain, round_: int) -> None:
        """Set the round's row weights and feature weights on the training matrix, and start drawing
        the next round's."""
        if not (self.rows_sampled or self.columns_sampled):
            return
        pending, self._pending = self._pending, None
        rows, columns = pending[1].result() if pending and pending[0] == round_ else self.draw(round_)
        if rows is not None:
            dtrain.set_info(weight=rows)
        if columns is not None:
            dtrain.set_info(feature_weights=columns)
        if self._helper is None:
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ml-assets-draws")
        self._pending = (round_ + 1, self._helper.submit(self.draw, round_ + 1))

    def close(self) -> None:
        """Stop the helper thread (a draw it is making is left to finish)."""
        if self._helper is not None:
            self._helper.shutdown(wait=False, cancel_futures=True)
        self._helper, self._pending = None, None

    def unweighted(self, dtrain) -> None:
        """Every row at weight 1 again (the training loss is reported over all rows)."""
        if self.rows_sampled:
            dtrain.set_info(weight=np.ones(self.last - self.first, dtype=np.float32))
