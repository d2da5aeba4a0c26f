"""Data validation in plain polars, pandera and scipy: no dagster. The snapshot asset runs these."""
