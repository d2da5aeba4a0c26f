"""Validation: validated_snapshot, the day after its checks, merged into main (write-audit-publish).

- ``assets``: the validated_snapshot asset and its checks; ``publish``: audit on the branch, then
  merge; ``check_results``: each check's Dagster result;
- the checks in plain polars, pandera and scipy (no dagster): ``run`` runs them, ``schema_checks``
  and ``pandera_schema`` the declared columns, ``keys``, ``checks``, ``drift``, ``label_drift``,
  ``stats``, ``custom``; ``verdict`` decides, ``failures`` reads pandera's failure cases, ``replay``
  replays a history of days;
- the calibrated gate (``ml-assets calibrate``, docs/data-validation.md "Calibrated limits"):
  ``calibrate`` fits a calibration on a history, ``signals`` and ``profiles`` and ``label_fit``
  describe the days, ``gate`` computes each test's statistic day by day, ``calibrated`` makes it the
  drift check, ``fast_replay`` replays a range vectorized over days, ``report`` and ``command`` show
  it; the document itself is ``ml_assets.spec.calibration``;
- ``record``: SnapshotRecord, and the merge's metadata PublishCommit;
- spec sections: ``schema`` (ml_assets.spec.data_schema) and ``validation`` (ml_assets.spec.validation).
"""
