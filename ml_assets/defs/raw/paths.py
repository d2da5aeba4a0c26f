"""Where a day's tables live in the model's version-store repository."""

import datetime as dt

from ml_assets.sources import ROWS
from ml_assets.spec import ModelSpec


def object_paths(spec: ModelSpec, day: dt.date) -> dict[str, str]:
    paths = {ROWS: f"rows/date={day.isoformat()}/part-0.parquet"}
    for name, table in spec.source.dimensions.items():
        daily = table.timestamp_column is not None or (table.path is not None and "{date}" in table.path)
        paths[name] = (
            f"dimensions/{name}/date={day.isoformat()}/part-0.parquet" if daily else f"dimensions/{name}/part-0.parquet"
        )
    return paths
