"""ml_assets: declare a model in one YAML spec, get a governed Dagster asset lineage.

``dagster ... -m ml_assets`` finds the Definitions as ``ml_assets.code_location``. It is built on
first access (PEP 562) so that the trainer, which runs as ``ml_assets.trainer`` under torchrun,
never imports dagster.
"""

from __future__ import annotations

import functools
from typing import Any

__version__ = "0.1.0"


@functools.cache
def _defs() -> Any:
    from ml_assets.definitions import build_definitions

    return build_definitions()


def __getattr__(name: str) -> Any:
    if name == "code_location":
        return _defs()
    raise AttributeError(f"module 'ml_assets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "code_location"])
