"""Scoring and monitoring: the champion at work.

- ``assets``: the predictions and model_monitor assets, the scoring job and schedule;
- ``predictions``: a day's rows scored through the transform the champion was trained with;
  ``monitor``: the day judged on its labels and against the training window;
  ``retrain``: the sensor that retrains when the monitor crosses a blocking limit;
- ``record``: PredictionsRecord, MonitorRecord;
- spec sections: ``monitoring`` and ``retrain`` (ml_assets.spec.monitoring, ml_assets.spec.retrain).
"""
