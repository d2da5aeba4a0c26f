"""What each team spends: the trainings (by decision: full, fine_tune, skip), tuning trials and
scoring runs of every model, with the CPU and GPU rank-seconds and wall seconds they held and the
samples the trainings processed, read from the records already written (``ml-assets usage``;
docs/operations.md). Nothing here writes.

    record   one piece of work and what it held (``Spent``); whose team a run is; a skip's observation
    collect  reading them from the Dagster instance
    report   adding them up per team and model, the trainings per decision; the table and the JSON document
    command  the command: its input checked, then collect and report
"""
