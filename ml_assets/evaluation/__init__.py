"""Evaluation: evaluation_report, the checkpoint judged on held-out days beside the champion and the
baselines, and the promotion gate (a blocking check).

- ``assets``: the evaluation_report asset and its gate; ``store``: the report to MLflow and the
  record;
- the logic in plain numpy and scikit-learn: ``report`` assembles it, ``inputs`` reads the rows,
  ``metrics`` (with ``binary``, ``multiclass``, ``regression``), ``bootstrap``, ``slices``,
  ``baseline``, ``rival``, ``plots``, ``policy`` (the gate's decision); ``errors``;
- ``record``: EvaluationRecord;
- spec sections: ``evaluation`` and ``promotion`` (ml_assets.spec.evaluation, ml_assets.spec.promotion).
"""
