"""One way in and out of Dagster metadata for a frozen dataclass.

A record's fields are its metadata keys. A field's kind (``json``, ``path``, ``url``, ``md``) says
how the value shows in the UI; a field of nested records (``of=``) comes back as a tuple of them.
Reading a materialization written without a required field fails naming the record, the field and
the keys that were there: a renamed field fails a round-trip test, not a run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Self

KIND = "ml_assets/kind"
OF = "ml_assets/of"


class RecordError(ValueError):
    """Metadata or tags that do not hold the record they are read as."""


def field(kind: str = "", of: type | None = None, **kwargs: Any) -> Any:
    """A record field shown in the UI as ``kind``; ``of``: the record type of a list's items."""
    return dataclasses.field(metadata={KIND: kind, OF: of}, **kwargs)


def plain(value: Any) -> Any:
    """JSON-able: records as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def unwrap(value: Any) -> Any:
    """A Dagster MetadataValue's raw value (values read back from an instance are wrapped)."""
    import dagster as dg  # here, not at import: a scorer reads version tags without dagster

    return value.value if isinstance(value, dg.MetadataValue) else value


class Record:
    """Mixin for frozen dataclasses whose fields are metadata entries."""

    def to_metadata(self) -> dict[str, Any]:
        import dagster as dg

        convert = {"json": dg.MetadataValue.json, "path": dg.MetadataValue.path, "url": dg.MetadataValue.url,
                   "md": dg.MetadataValue.md}
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            kind = f.metadata.get(KIND, "")
            if value is None:
                if f.default is not None:  # an optional field (default None) is left out when unset
                    out[f.name] = dg.MetadataValue.null()
            elif kind:
                out[f.name] = convert[kind](plain(value))
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_metadata(cls, values: Mapping[str, Any]) -> Self:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in values:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{cls.__name__}: the metadata has no {f.name!r} (it has {sorted(values)})")
                continue
            kwargs[f.name] = decode(f, unwrap(values[f.name]))
        return cls(**kwargs)


def decode(f: dataclasses.Field, value: Any) -> Any:
    of = f.metadata.get(OF)
    if of is not None and value is not None:
        return tuple(of(**item) if isinstance(item, Mapping) else item for item in value)
    return value
