"""Features: the day's feature rows, built from one main commit, content-addressed.

- ``assets``: the features asset; ``day``: building one day from the version store;
- the logic in plain polars/numpy (no dagster, so training and batch inference share it): ``build``
  (joins, target, transforms), ``state`` (the fitted state: vocabularies, scalers), ``window``
  (featurizing a window larger than memory), ``serve`` (transforming rows at serving time);
- ``record``: FeaturesRecord;
- spec sections: ``features`` and ``target`` (ml_assets.spec.features, ml_assets.spec.target).
"""
