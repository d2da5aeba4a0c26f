"""The snapshot's check names and what each checks: light to import (the spec validates waivers with them)."""

SCHEMA, NULLS, RANGES, KEYS = "schema", "nulls", "ranges_and_categories", "duplicate_keys"
VOLUME, FRESHNESS, DRIFT = "volume", "freshness", "drift"

CHECK_DESCRIPTIONS = {
    SCHEMA: "columns and dtypes as the spec declares them (strict column set)",
    NULLS: "no nulls in non-nullable columns; nullable columns within their allowed null fraction",
    RANGES: "numeric ranges and allowed categories",
    KEYS: "no two rows share the spec's key columns",
    VOLUME: "row count within tolerance of the same weekday over recent weeks on main (holiday-aware), unless "
            "ordinary for a count that small",
    FRESHNESS: "rows timestamped outside the partition's day, within a tolerance",
    DRIFT: "distributions against recent validated days on main: PSI with chi-square, KS, Wasserstein; label "
           "rate and label relationship; too few rows are not judged",
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
    out = {**CHECK_DESCRIPTIONS, **{custom_check_name(t): f"custom check {t}" for t in spec.validation.custom_checks}}
    if (cal := spec.validation.calibration) is not None:
        out[DRIFT] = (f"each column against the limits calibrated on its own history (ml-assets calibrate; calibration "
                      f"{cal.version[:12]}, {cal.start}..{cal.end}, target rate {cal.target_rate:g}): what its weekly "
                      "and yearly profile and its recent level leave, its relation to the other columns, runs, nulls, "
                      "new values, the label's rate and fit")
    return out


def enabled(spec, name: str) -> bool:
    """Whether the spec runs check ``name`` (``validation.checks.<name>.enabled``, true by default)."""
    settings = spec.validation.checks.get(name)
    return settings is None or settings.enabled


def blocking(spec, name: str) -> bool:
    """Whether a failure of check ``name`` stops the merge (``severity: block``, the default) or only warns."""
    settings = spec.validation.checks.get(name)
    return settings is None or settings.severity == "block"


def enabled_names(spec) -> list[str]:
    """The checks a snapshot runs and declares, in ``check_names`` order."""
    return [name for name in check_names(spec) if enabled(spec, name)]
