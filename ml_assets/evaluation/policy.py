"""The promotion policy as a pure function of an evaluation report: every clause with what was
observed and what was required, so a failed gate says exactly why.

A challenger passes when, against the champion evaluated on the same held-out rows, its primary
metric improves by at least ``min_improvement`` (in the metric's units), no slice loses more than
``max_slice_regression`` on it and (classification) expected calibration error grows by at most
``max_calibration_worsening`` (multiclass: the top-label calibration error, its ``ece``). A first
model, with no champion, must beat the evaluation's best simple baseline (fitted on its own training
days) by ``min_improvement`` on the primary metric, and reach the ``floors``. With ``rival``, either
must also beat another model's champion on the same rows by ``min_improvement``. Any metric of the
task may be the primary one.

A successor (``promotion.successor``): a candidate fine-tuned from the champion itself is held to
non-inferiority instead: its primary metric no more than ``max_regression`` worse, with the same
slice and calibration guards; a day fresher and as good is worth promoting. With
``max_champion_age_days``, once the champion's partition is that many days behind the candidate's,
any candidate is held to that bar. It is never above the challenger's (``min_improvement``): the
lower of the two applies. The first clause names the bar and why.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ml_assets.evaluation.document import Clause, EvaluationReport, Gate
from ml_assets.spec import HIGHER_IS_BETTER, PromotionSpec


@dataclass
class Decision:
    passed: bool
    kind: str  # "first_model", "challenger", "successor" or "same_as_champion"
    clauses: list[Clause] = field(default_factory=list)

    @property
    def failed(self) -> list[Clause]:
        return [c for c in self.clauses if not c.ok]

    def reason(self) -> str:
        if self.kind == "same_as_champion":
            return "these are the champion's weights (same sha256): nothing to promote"
        if self.passed:
            return "; ".join(c.detail or f"{c.name} {c.observed} ({c.required})" for c in self.clauses) or "no rules"
        bar = [c.detail for c in self.clauses if c.name == "bar"]  # a refused successor: which bar it missed
        return "; ".join(bar + [c.detail or f"{c.name} {c.observed} (required {c.required})" for c in self.failed])

    def as_gate(self) -> Gate:
        return Gate(passed=self.passed, kind=self.kind, reason=self.reason(), clauses=tuple(self.clauses))


def better_by(metric: str, new: float, old: float) -> float:
    """How much better ``new`` is than ``old`` (positive: better), whichever way the metric points."""
    return new - old if HIGHER_IS_BETTER[metric] else old - new


def _gain(metric: str, delta: tuple[float, float, float]) -> tuple[float, float, float]:
    """A change (new - old, with its interval) as an improvement: positive is better either way."""
    point, lo, hi = delta
    return (point, lo, hi) if HIGHER_IS_BETTER[metric] else (-point, -hi, -lo)


def champion_age(report: EvaluationReport) -> int | None:
    """Days from the champion's partition to the candidate's (None when either is not a day)."""
    try:
        return (dt.date.fromisoformat(report.partition) - dt.date.fromisoformat(report.champion.partition)).days
    except (AttributeError, TypeError, ValueError):
        return None


def bar(policy: PromotionSpec, report: EvaluationReport, trained: dict[str, Any] | None) -> Clause | None:
    """The successor's bar, as the clause that says why it applies; None: the challenger's bar."""
    champion, successor = report.champion, policy.successor
    if successor is None or champion is None:
        return None
    trained = trained or {}
    parent = (trained.get("parent") or {}).get("version")
    why = ""
    if trained.get("kind") == "fine_tune" and str(parent) == champion.version:
        why = f"fine-tuned from champion v{champion.version}"
    age = champion_age(report)
    if not why and policy.max_champion_age_days and age is not None and age > policy.max_champion_age_days:
        why = (f"champion v{champion.version} (partition {champion.partition}) is {age} days old, past "
               f"max_champion_age_days {policy.max_champion_age_days}")
    if not why:
        return None
    return Clause(name="bar", observed="successor", required="successor", ok=True,
                  detail=f"successor's bar ({why}): {policy.primary_metric} no more than "
                         f"{successor.max_regression} worse than the champion")


def decide(policy: PromotionSpec, report: EvaluationReport, trained: dict[str, Any] | None = None) -> Decision:
    """The gate on a report without one: its metrics, its champion (compared on the same rows, or the
    champion's own weights), its slice regressions, its baseline and rival. ``trained``: the
    candidate's training decision (ml_assets.training.decision), which says whether it is a
    fine-tune of the champion."""
    primary = policy.primary_metric
    metrics, champion = report.metrics, report.champion
    if champion is None:
        return _first_model(policy, report)
    if champion.same_weights:
        return Decision(passed=True, kind="same_as_champion", clauses=[Clause(
            name="same weights as champion", observed=champion.version, required="different weights", ok=True,
            detail=f"identical to champion version {champion.version}")])
    successor = bar(policy, report, trained)
    if successor is None:
        decision = Decision(passed=True, kind="challenger")
        decision.clauses.append(_improvement(policy, report, f"improvement of {primary}",
                                             f"champion v{champion.version}", champion.metrics[primary],
                                             report.primary_delta))
    else:
        decision = Decision(passed=True, kind="successor", clauses=[successor])
        decision.clauses.append(_improvement(policy, report, f"non-inferiority of {primary}",
                                             f"champion v{champion.version}", champion.metrics[primary],
                                             report.primary_delta,
                                             least=min(policy.min_improvement, -policy.successor.max_regression)))
    worst = max(report.slice_regressions, key=lambda r: r.regression, default=None)
    if worst is None:
        decision.clauses.append(Clause(name=f"slice regression of {primary}", observed=None,
                                       required=f"<= {policy.max_slice_regression}", ok=True,
                                       detail="no slice large enough on both models to compare"))
    else:
        decision.clauses.append(Clause(
            name=f"slice regression of {primary}", observed=round(worst.regression, 6),
            required=f"<= {policy.max_slice_regression}", ok=worst.regression <= policy.max_slice_regression,
            detail=f"worst slice {worst.column}={worst.value} ({worst.rows} rows): {primary} {worst.new:.4f} vs "
                   f"{worst.old:.4f}, {worst.regression:+.4f} worse, allowed {policy.max_slice_regression}"))
    if "ece" in metrics and "ece" in champion.metrics:
        growth = metrics["ece"] - champion.metrics["ece"]
        decision.clauses.append(Clause(
            name="calibration (ECE) worsening", observed=round(growth, 6),
            required=f"<= {policy.max_calibration_worsening}", ok=growth <= policy.max_calibration_worsening,
            detail=f"expected calibration error {metrics['ece']:.4f} vs {champion.metrics['ece']:.4f} "
                   f"({growth:+.4f}), allowed growth {policy.max_calibration_worsening}"))
    _rival(policy, report, decision)
    decision.passed = all(c.ok for c in decision.clauses)
    return decision


def _first_model(policy: PromotionSpec, report: EvaluationReport) -> Decision:
    """No champion yet: the best baseline by min_improvement, the floors (and a rival)."""
    primary, metrics = policy.primary_metric, report.metrics
    decision = Decision(passed=True, kind="first_model")
    baseline = report.baseline
    if baseline and policy.beat_baseline:
        # Beating what a practitioner would try first is the bar; a floor only adds to it.
        best = baseline.best_score
        decision.clauses.append(_improvement(
            policy, report, f"improvement of {primary} over the baseline",
            f"baseline {best.name} ({best.description})", best.metrics[primary], baseline.delta,
            prefix="first model: "))
    for metric, floor in sorted(policy.floors.items()):
        value = metrics[metric]
        higher = HIGHER_IS_BETTER[metric]
        ok = value >= floor if higher else value <= floor
        bound = f"{'>=' if higher else '<='} {floor}"
        decision.clauses.append(Clause(
            name=f"floor {metric}", observed=round(value, 6), required=bound, ok=ok,
            detail=f"first model: {metric} {value:.4f} {'meets' if ok else 'misses'} the floor {bound}"))
    _rival(policy, report, decision)
    decision.passed = all(c.ok for c in decision.clauses)
    return decision


def _rival(policy: PromotionSpec, report: EvaluationReport, decision: Decision) -> None:
    """``promotion.rival``: another model's champion, on the same rows, must be beaten as a champion is."""
    rival = report.rival
    if not rival:
        return
    primary = policy.primary_metric
    if rival.version is None:
        decision.clauses.append(Clause(name=f"improvement of {primary} over the rival {rival.model}", observed=None,
                                       required=f">= {policy.min_improvement}", ok=True,
                                       detail=f"rival {rival.model} has no champion yet: not compared"))
        return
    decision.clauses.append(_improvement(policy, report, f"improvement of {primary} over the rival {rival.model}",
                                         f"rival {rival.model} v{rival.version}", rival.metrics[primary],
                                         rival.primary_delta))


def _improvement(policy: PromotionSpec, report: EvaluationReport, name: str, other: str, other_value: float,
                 delta: tuple[float, float, float], prefix: str = "", least: float | None = None) -> Clause:
    """The primary metric's change over another model on the same rows, at least ``least``
    (``min_improvement`` unless given)."""
    primary = policy.primary_metric
    least = policy.min_improvement if least is None else least
    gain, lo, hi = _gain(primary, delta)
    return Clause(name=name, observed=round(gain, 6), required=f">= {least}", ok=gain >= least,
                  detail=f"{prefix}{primary} {report.metrics[primary]:.4f} vs {other} {other_value:.4f}: {gain:+.4f} "
                         f"(interval of the change {lo:+.4f}..{hi:+.4f}), required >= {least:+.4f}")
