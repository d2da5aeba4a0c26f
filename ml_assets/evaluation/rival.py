"""Another model's champion on this model's test rows: how a model of your own (or any new family)
is judged against the model in production for the same question (``promotion.rival``).

The rival's registered version is loaded as the champion is (verified, pickle-free, its own fitted
feature state and, for a factory, its own pinned code) and scores the very rows, file and sha256
this model was evaluated on; the change of the primary metric gets a paired-bootstrap interval,
and the gate (ml_assets.evaluation.policy) requires ``min_improvement`` over it as over a champion.
A rival without a champion yet is reported and not judged.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ml_assets.evaluation import metrics as M
from ml_assets.evaluation.document import EvaluationReport, Rival
from ml_assets.evaluation.errors import EvaluationError
from ml_assets.serving.predict import predict
from ml_assets.spec import ModelSpec


def score_rival(spec: ModelSpec, report: EvaluationReport, by_model: dict[str, np.ndarray], client,
                frame: pl.DataFrame, y: np.ndarray) -> Rival | None:
    """The rival on the report's rows (None: the spec names none); its predictions are added to
    ``by_model`` (for the plots)."""
    from ml_assets.registry import versions as registry

    name, ev, primary = spec.promotion.rival, spec.evaluation, spec.promotion.primary_metric
    if name is None:
        return None
    mv = registry.by_alias(client, name, registry.CHAMPION)
    if mv is None:
        return Rival(model=name, version=None)
    try:
        old = predict(registry.load_version(client, mv), frame)
    except (registry.RegistryError, ValueError) as exc:
        raise EvaluationError(f"the rival {name} (champion v{mv.version}) cannot be scored on the same rows "
                              f"(promotion.rival): {exc}") from None
    threshold = report.threshold
    try:
        values = M.compute_metrics(spec.target.task, y, old, threshold, top_k=ev.top_k)
        fn = M.metric_function(spec.target.task, primary, threshold, top_k=ev.top_k)
        delta = M.paired_bootstrap_delta(y, by_model["this model"], old, fn, n=ev.bootstrap_samples,
                                         level=ev.confidence_level, seed=0)
    except M.MetricError as exc:
        raise EvaluationError(f"comparing with the rival {name}: {exc}") from None
    by_model[f"{name} v{mv.version}"] = old
    return Rival(model=name, version=str(mv.version), metrics=values, primary_delta=tuple(delta))
