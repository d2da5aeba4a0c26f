"""Distribution drift of the current window (the day, pooled with the ``current_days - 1`` days on main
before it) against a reference of the validated days before that window.

Each comparison judges an effect size against its limit and, because a few rows can look like anything,
a two-sample test that accounts for both sample sizes; a column drifts only when both say so:

- categoricals: population stability index (PSI) and a chi-square test, on categories pooled until each
  expects ``min_expected_count`` rows of the current window;
- numerics: the Kolmogorov-Smirnov statistic and its p-value; the Wasserstein distance (in reference
  standard deviations) is reported as an effect size, and blocks only where the spec sets a limit;
- a binary label: its relationship to the features and its rate (label_drift.py).

The tests share the spec's ``significance`` (Bonferroni), so it is the chance that a window with no drift
at all fails the check. A column (or the label) with fewer than ``min_rows`` non-null rows in the current
window or the reference is not judged: the check passes and its metadata names it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ml_assets.spec import DriftSpec, ModelSpec
from ml_assets.validation.label_drift import (
    DAY,
    Labelled,
    binary_labels,
    label_rate,
    label_relationship,
    labelled,
    relationship_not_judged,
)
from ml_assets.validation.names import DRIFT
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.stats import (
    MIN_SHARE,
    chi_square_p,
    ks_test,
    pooled_counts,
    psi_of,
    too_few,
)

__all__ = ["DAY", "drift_check", "drift_columns"]


def drift_columns(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The declared feature inputs present in the raw rows (never the target's inputs)."""
    raw = spec.data_schema.columns
    numeric = [c for c in spec.features.numeric_names if c in raw and raw[c].dtype in ("int64", "float64")]
    categorical = [c for c in spec.features.categorical_names if c in raw]
    return numeric, categorical


@dataclass
class _Findings:
    observed: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    not_judged: dict[str, str] = field(default_factory=dict)

    def problem(self, kind: str, text: str) -> None:
        self.counts[kind] = 1
        self.problems.append(text)


def _limit(cfg: DriftSpec, column: str, measure: str) -> float | None:
    override = cfg.columns.get(column)
    value = getattr(override, measure) if override else None
    return value if value is not None else getattr(cfg, measure)


def _values(frame: pl.DataFrame, column: str) -> np.ndarray:
    return frame[column].cast(pl.Float64).fill_nan(None).drop_nulls().to_numpy()


def _current_window(rows: pl.DataFrame, earlier: pl.DataFrame | None, reference: pl.DataFrame
                    ) -> tuple[pl.DataFrame, set[str]]:
    """The day's rows pooled with the window's earlier days, over the columns whose dtype matches the
    reference's (a column whose dtype differs is the schema check's to report)."""
    same = {c for c in rows.columns if c in reference.columns and rows[c].dtype == reference[c].dtype}
    if earlier is None or earlier.height == 0:
        return rows, same
    same = {c for c in same if c in earlier.columns and earlier[c].dtype == rows[c].dtype}
    order = [c for c in rows.columns if c in same]
    return pl.concat([rows.select(order), earlier.select(order)]), same


def drift_check(spec: ModelSpec, rows: pl.DataFrame, reference: pl.DataFrame, earlier: pl.DataFrame | None = None,
                day: dt.date | None = None, seasonal: pl.DataFrame | None = None) -> CheckOutcome:
    """``reference`` holds the reference days' rows, ``earlier`` the current window's days before ``day``
    and ``seasonal`` the seasonal reference's (the same weeks a period earlier), each with its day in
    column ``__day``. The spec's seasonal columns are judged against ``seasonal``, the others against
    ``reference``."""
    cfg = spec.validation.drift
    days = reference[DAY].n_unique() if reference.height else 0
    if days < cfg.min_reference_days or rows.height == 0:
        return CheckOutcome(DRIFT, True, f"only {days} reference day(s) on main, fewer than {cfg.min_reference_days}: "
                            "drift not judged" if rows.height else "no rows on the day: drift not judged",
                            observed={"reference_days": days}, expected={"reference_days": f">= {cfg.min_reference_days}"})
    current, comparable = _current_window(rows, earlier, reference)
    numeric, categorical = drift_columns(spec)
    numeric, categorical = [c for c in numeric if c in comparable], [c for c in categorical if c in comparable]
    found = _Findings()
    references = _references(cfg, day, reference, seasonal, current, found)
    window_days = 1 + (earlier[DAY].n_unique() if earlier is not None and earlier.height else 0)
    found.observed.update({"current window days": window_days, "current window rows": current.height,
                           "reference days": days, "reference rows": reference.height})
    for col in (*categorical, *numeric):
        if col in cfg.columns and not cfg.columns[col].judged:
            found.not_judged[col] = "expected to drift (validation.drift.columns.<column>.judged: false)"
            continue
        if col in found.not_judged:  # a seasonal column without its reference
            continue

        def size(frame: pl.DataFrame, col: str = col) -> int:
            return len(_values(frame, col)) if col in numeric else frame[col].drop_nulls().len()

        refs = references.get(col, [reference])
        usable = [r for r in refs if too_few(size(current), size(r), cfg.min_rows) is None]
        if not usable:
            found.not_judged[col] = too_few(size(current), max(size(r) for r in refs), cfg.min_rows)
        references[col] = usable
    start = day - dt.timedelta(days=cfg.current_days - 1) if day else None
    labels = {name: found_label for name, expr in binary_labels(spec).items()
              if (found_label := labelled(spec, current, reference, start, expr)) is not None}
    for name, label in labels.items():
        if label.rate_not_judged:
            found.not_judged[f"{name} rate"] = label.rate_not_judged
    tests = sum(c not in found.not_judged for c in (*categorical, *numeric)) + sum(
        not label.rate_not_judged for label in labels.values())
    alpha = cfg.significance / max(tests, 1)  # Bonferroni: the day's tests share the significance
    for col in categorical:
        if col not in found.not_judged:
            _categorical(cfg, col, [r[col] for r in references[col]], current[col], alpha, found)
    for col in numeric:
        if col not in found.not_judged:
            _numeric(cfg, col, [_values(r, col) for r in references[col]], _values(current, col), alpha, found)
    for name, label in labels.items():
        _label(cfg, name, label, numeric, [*numeric, *categorical], alpha, found, alone=len(labels) == 1)
    if len(labels) > 1:
        _classes_relationship(cfg, list(labels), found)
    if found.not_judged:
        found.observed["not judged"] = dict(found.not_judged)
    return CheckOutcome(DRIFT, not found.problems, _summary(found, categorical, numeric, tests, days, bool(labels)),
                        found.counts, found.observed, found.expected)


def _references(cfg: DriftSpec, day: dt.date | None, reference: pl.DataFrame, seasonal: pl.DataFrame | None,
                current: pl.DataFrame, found: _Findings) -> dict[str, list[pl.DataFrame]]:
    """Each seasonal column's references: the same weeks of each earlier period the store holds at
    least ``min_reference_days`` of. Such a column drifts only when the window is unlike every one of
    them: one year's weather differs from the next, and a season is ordinary when it resembles one
    of the seasons before it. Until the store holds one (a year of history, for a yearly season) a
    seasonal column is not judged: against the weeks just before, a season would look like drift."""
    spans = cfg.seasonal_reference(day) if day is not None else []
    if cfg.seasonal is None or not spans:
        return {}
    periods = []
    for first, last in spans:
        part = (seasonal.filter(pl.col(DAY).is_between(first, last)) if seasonal is not None and seasonal.height
                else pl.DataFrame())
        if part.height and part[DAY].n_unique() >= cfg.min_reference_days:
            periods.append(part)
    where = ", ".join(f"{a}..{b}" for a, b in spans)
    found.observed["seasonal reference"] = f"{len(periods)} of the same weeks in earlier periods ({where})"
    references = {}
    for col in cfg.seasonal.columns:
        fit = [p for p in periods if col in p.columns and col in current.columns and p[col].dtype == current[col].dtype]
        if not fit:
            found.not_judged[col] = (f"seasonal: no earlier period ({where}) has {cfg.min_reference_days} days on main "
                                     "yet")
        else:
            references[col] = fit
    return references


def _categorical(cfg: DriftSpec, col: str, references: list[pl.Series], current: pl.Series, alpha: float,
                 found: _Findings) -> None:
    """PSI and chi-square against the reference (of several, the closest: see ``_references``)."""
    counts, value, p, reference = min(((c, psi_of(c), chi_square_p(c), r) for r in references
                                       for c in [pooled_counts(r, current, MIN_SHARE, cfg.min_expected_count)]),
                                      key=lambda found_: found_[1])
    bound = _limit(cfg, col, "psi")
    found.observed[f"{col} psi"], found.expected[f"{col} psi"] = round(value, 4), f"<= {bound} (or p >= {alpha:.2g})"
    found.observed[f"{col} chi-square p-value"] = float(f"{p:.3g}")
    if value > bound and p < alpha:
        found.problem(f"{col}: psi", f"{col}: PSI {value:.3f} > {bound} (chi-square p {p:.1e} < {alpha:.2g}, "
                      f"{current.len()} vs {reference.len()} rows{_of(references)})")


def _of(references: list) -> str:
    return f"; the closest of {len(references)} earlier periods" if len(references) > 1 else ""


def _numeric(cfg: DriftSpec, col: str, references: list[np.ndarray], cur: np.ndarray, alpha: float,
             found: _Findings) -> None:
    """KS (and Wasserstein) against the reference (of several, the closest: see ``_references``)."""
    from scipy import stats  # imported when a check runs, not when definitions load

    (ks, p), ref = min(((ks_test(r, cur), r) for r in references), key=lambda found_: found_[0][0])
    wd = float(stats.wasserstein_distance(ref, cur)) / (float(np.std(ref)) or 1.0)
    sizes = f"{len(cur)} vs {len(ref)} rows{_of(references)}"
    found.observed[f"{col} ks p-value"] = float(f"{p:.3g}")
    for measure, value in (("ks", ks), ("wasserstein", wd)):
        bound = _limit(cfg, col, measure)
        found.observed[f"{col} {measure}"] = round(value, 4)
        found.expected[f"{col} {measure}"] = (f"<= {bound} (or KS p >= {alpha:.2g})" if bound is not None
                                              else "an effect size: no limit set")
        if bound is not None and value > bound and p < alpha:
            name = "KS" if measure == "ks" else "Wasserstein"
            found.problem(f"{col}: {measure}", f"{col}: {name} {value:.3f} > {bound}"
                          + (" (reference sd)" if measure == "wasserstein" else "")
                          + f" (KS p {p:.1e} < {alpha:.2g}, {sizes})")


def _label(cfg: DriftSpec, name: str, label: Labelled, numeric: list[str], columns: list[str], alpha: float,
           found: _Findings, alone: bool) -> None:
    """``name``: "label", or "class <c>" for one class of a multiclass label; a class's ranking is
    only measured here (``alone`` false) and judged with the others' by ``_classes_relationship``."""
    if not label.rate_not_judged and (problem := label_rate(cfg, label, alpha, found.observed, found.expected, name)):
        found.problem(f"{name}: rate", problem)
    if (why := relationship_not_judged(label)) is not None:
        found.not_judged[f"{name} relationship"] = why
        found.observed[f"{name} relationship"] = f"not judged: {why}"
    elif (problem := label_relationship(cfg, label, numeric, columns, found.observed, found.expected, name)) and alone:
        found.problem(f"{name}: relationship", problem)


def _classes_relationship(cfg: DriftSpec, names: list[str], found: _Findings) -> None:
    """A multiclass label's relationship to the features: the mean of its classes' rankings (each class
    against the rest). A middle class (late, between on time and very late) ranks weakly even on ordinary
    days, so one class below the bound is noise; labels permuted or redefined pull the mean down."""
    aucs = {n: found.observed.pop(f"{n} relationship auc") for n in names if f"{n} relationship auc" in found.observed}
    for n in names:
        found.expected.pop(f"{n} relationship auc", None)
    if not aucs:
        return
    mean = sum(aucs.values()) / len(aucs)
    found.observed["label relationship auc (mean over classes)"] = round(mean, 4)
    found.observed["label relationship auc by class"] = {n.removeprefix("class "): round(a, 4) for n, a in aucs.items()}
    found.expected["label relationship auc (mean over classes)"] = f">= {cfg.label_auc_min}"
    if mean < cfg.label_auc_min:
        worst = ", ".join(f"{n.removeprefix('class ')} {a:.2f}" for n, a in sorted(aucs.items(), key=lambda kv: kv[1]))
        found.problem("label: relationship", f"label relationship: the reference days' class rates by feature rank "
                      f"the day's labels at a mean ROC-AUC of {mean:.3f} over {len(aucs)} classes, below "
                      f"{cfg.label_auc_min} (by class: {worst}): permuted or redefined labels do this")


def _summary(found: _Findings, categorical: list[str], numeric: list[str], tests: int, days: int, label: bool) -> str:
    if found.problems:
        return "; ".join(found.problems)
    reasons: dict[str, list[str]] = {}
    for what, why in found.not_judged.items():
        reasons.setdefault(why, []).append(what)
    skipped = "; ".join(f"{why} ({', '.join(what)})" for why, what in reasons.items())
    if not tests and "label relationship auc" not in found.observed:
        if not skipped:
            return "no drift columns and no binary label: nothing to judge"
        return f"not judged: {skipped}; nothing could be judged against {days} reference days"
    judged = (f"{sum(c not in found.not_judged for c in categorical)} categorical, "
              f"{sum(c not in found.not_judged for c in numeric)} numeric columns"
              + (" and the label" if label else ""))
    return f"{judged} within limits against {days} reference days" + (f"; not judged: {skipped}" if skipped else "")
