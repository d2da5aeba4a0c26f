"""Feature logic in plain polars/numpy: no dagster, so the trainer and batch inference share it."""
