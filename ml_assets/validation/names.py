"""The snapshot's check names and what each checks: light to import (the spec validates waivers with them)."""

SCHEMA, NULLS, RANGES, KEYS = "schema", "nulls", "ranges_and_categories", "duplicate_keys"
VOLUME, FRESHNESS, DRIFT = "volume", "freshness", "drift"

CHECK_DESCRIPTIONS = {
    SCHEMA: "columns and dtypes as the spec declares them (strict column set)",
    NULLS: "no nulls in non-nullable columns; nullable columns within their allowed null fraction",
    RANGES: "numeric ranges and allowed categories",
    KEYS: "no two rows share the spec's key columns",
    VOLUME: "row count within tolerance of the same weekday over recent weeks on main (holiday-aware)",
    FRESHNESS: "rows timestamped outside the partition's day, within a tolerance",
    DRIFT: "distributions against recent validated days on main: PSI, KS, Wasserstein; label rate and "
           "label relationship",
}
CHECKS = tuple(CHECK_DESCRIPTIONS)
ROW_LEVEL = (NULLS, RANGES, KEYS)


def custom_check_name(target: str) -> str:
    """The check name of a custom check 'package.module:function'."""
    return "custom_" + target.split(":")[1]


def check_names(spec) -> list[str]:
    """Every check of a spec's snapshot, built-in then custom (a ModelSpec; not imported here)."""
    return [*CHECKS, *(custom_check_name(t) for t in spec.validation.custom_checks)]


def descriptions(spec) -> dict[str, str]:
    return {**CHECK_DESCRIPTIONS, **{custom_check_name(t): f"custom check {t}" for t in spec.validation.custom_checks}}
