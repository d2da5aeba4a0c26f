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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ml_assets.spec import HIGHER_IS_BETTER, PromotionSpec


@dataclass
class Clause:
    name: str
    observed: float | str | None
    required: str
    ok: bool
    detail: str = ""


@dataclass
class Decision:
    passed: bool
    kind: str  # "first_model", "challenger" or "same_as_champion"
    clauses: list[Clause] = field(default_factory=list)

    @property
    def failed(self) -> list[Clause]:
        return [c for c in self.clauses if not c.ok]

    def reason(self) -> str:
        if self.kind == "same_as_champion":
            return "these are the champion's weights (same sha256): nothing to promote"
        if self.passed:
            return "; ".join(c.detail or f"{c.name} {c.observed} ({c.required})" for c in self.clauses) or "no rules"
        return "; ".join(c.detail or f"{c.name} {c.observed} (required {c.required})" for c in self.failed)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "kind": self.kind, "reason": self.reason(),
                "clauses": [asdict(c) for c in self.clauses]}


def better_by(metric: str, new: float, old: float) -> float:
    """How much better ``new`` is than ``old`` (positive: better), whichever way the metric points."""
    return new - old if HIGHER_IS_BETTER[metric] else old - new


def _gain(metric: str, delta: list[float]) -> tuple[float, float, float]:
    """A change (new - old, with its interval) as an improvement: positive is better either way."""
    point, lo, hi = delta
    return (point, lo, hi) if HIGHER_IS_BETTER[metric] else (-point, -hi, -lo)


def decide(policy: PromotionSpec, report: dict[str, Any]) -> Decision:
    """``report`` as the evaluation_report asset writes it: ``metrics``, ``champion`` (None or its
    ``version``, ``metrics``, ``same_weights``), ``slice_regressions`` (each with ``regression``:
    positive is worse) and ``primary_delta`` (point, lo, hi)."""
    primary = policy.primary_metric
    metrics = report["metrics"]
    champion = report.get("champion")
    if champion is None:
        return _first_model(policy, report)
    if champion.get("same_weights"):
        return Decision(passed=True, kind="same_as_champion", clauses=[Clause(
            "same weights as champion", champion["version"], "different weights", True,
            f"identical to champion version {champion['version']}")])
    decision = Decision(passed=True, kind="challenger")
    decision.clauses.append(_improvement(policy, report, f"improvement of {primary}",
                                         f"champion v{champion['version']}", champion["metrics"][primary],
                                         report["primary_delta"]))
    regressions = report.get("slice_regressions", [])
    worst = max(regressions, key=lambda r: r["regression"], default=None)
    if worst is None:
        decision.clauses.append(Clause(f"slice regression of {primary}", None, f"<= {policy.max_slice_regression}",
                                       True, "no slice large enough on both models to compare"))
    else:
        ok = worst["regression"] <= policy.max_slice_regression
        decision.clauses.append(Clause(
            f"slice regression of {primary}", round(worst["regression"], 6), f"<= {policy.max_slice_regression}", ok,
            f"worst slice {worst['column']}={worst['value']} ({worst['rows']} rows): {primary} {worst['new']:.4f} vs "
            f"{worst['old']:.4f}, {worst['regression']:+.4f} worse, allowed {policy.max_slice_regression}"))
    if "ece" in metrics and "ece" in champion["metrics"]:
        growth = metrics["ece"] - champion["metrics"]["ece"]
        decision.clauses.append(Clause(
            "calibration (ECE) worsening", round(growth, 6), f"<= {policy.max_calibration_worsening}",
            growth <= policy.max_calibration_worsening,
            f"expected calibration error {metrics['ece']:.4f} vs {champion['metrics']['ece']:.4f} "
            f"({growth:+.4f}), allowed growth {policy.max_calibration_worsening}"))
    _rival(policy, report, decision)
    decision.passed = all(c.ok for c in decision.clauses)
    return decision


def _first_model(policy: PromotionSpec, report: dict[str, Any]) -> Decision:
    """No champion yet: the best baseline by min_improvement, the floors (and a rival)."""
    primary, metrics = policy.primary_metric, report["metrics"]
    decision = Decision(passed=True, kind="first_model")
    baseline = report.get("baseline")
    if baseline and policy.beat_baseline:
        # Beating what a practitioner would try first is the bar; a floor only adds to it.
        best = next(b for b in baseline["baselines"] if b["name"] == baseline["best"])
        decision.clauses.append(_improvement(
            policy, report, f"improvement of {primary} over the baseline",
            f"baseline {best['name']} ({best['description']})", best["metrics"][primary], baseline["delta"],
            prefix="first model: "))
    for metric, floor in sorted(policy.floors.items()):
        value = metrics[metric]
        higher = HIGHER_IS_BETTER[metric]
        ok = value >= floor if higher else value <= floor
        bound = f"{'>=' if higher else '<='} {floor}"
        decision.clauses.append(Clause(
            f"floor {metric}", round(value, 6), bound, ok,
            f"first model: {metric} {value:.4f} {'meets' if ok else 'misses'} the floor {bound}"))
    _rival(policy, report, decision)
    decision.passed = all(c.ok for c in decision.clauses)
    return decision


def _rival(policy: PromotionSpec, report: dict[str, Any], decision: Decision) -> None:
    """``promotion.rival``: another model's champion, on the same rows, must be beaten as a champion is."""
    rival = report.get("rival")
    if not rival:
        return
    primary = policy.primary_metric
    if rival["version"] is None:
        decision.clauses.append(Clause(f"improvement of {primary} over the rival {rival['model']}", None,
                                       f">= {policy.min_improvement}", True,
                                       f"rival {rival['model']} has no champion yet: not compared"))
        return
    decision.clauses.append(_improvement(policy, report, f"improvement of {primary} over the rival {rival['model']}",
                                         f"rival {rival['model']} v{rival['version']}", rival["metrics"][primary],
                                         rival["primary_delta"]))


def _improvement(policy: PromotionSpec, report: dict[str, Any], name: str, other: str, other_value: float,
                 delta: list[float], prefix: str = "") -> Clause:
    """The primary metric's change over another model on the same rows, at least ``min_improvement``."""
    primary = policy.primary_metric
    gain, lo, hi = _gain(primary, delta)
    return Clause(name, round(gain, 6), f">= {policy.min_improvement}", gain >= policy.min_improvement,
                  f"{prefix}{primary} {report['metrics'][primary]:.4f} vs {other} {other_value:.4f}: {gain:+.4f} "
                  f"(interval of the change {lo:+.4f}..{hi:+.4f}), required >= {policy.min_improvement:+.4f}")
