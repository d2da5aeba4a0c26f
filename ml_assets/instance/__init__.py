"""The Dagster instance configurations the package ships: ``local.yaml`` (SQLite under
``DAGSTER_HOME``, the embedded default) and ``production.yaml`` (PostgreSQL, the run queue with its
per-team limits, the ``gpu`` pool, run monitoring; docs/deployment.md). ``ml-assets instance``
writes either into ``$DAGSTER_HOME/dagster.yaml``."""

from pathlib import Path

LOCAL_INSTANCE = Path(__file__).with_name("local.yaml")
PRODUCTION_INSTANCE = Path(__file__).with_name("production.yaml")
