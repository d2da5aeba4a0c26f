"""A calibration in words: per column, each test's limit, the natural variability it came from, and
the history's days it would still block (``ml-assets calibrate``, ``ml-assets audit``)."""

from __future__ import annotations

from pathlib import Path

from ml_assets.spec.calibration import Calibration

SHOWN_DAYS = 5


def _natural(cal: Calibration, test) -> str:
    sig = cal.signals[test.signal]
    u, beta = test.tail
    if test.kind == "run":
        return f"runs: P(one more equal day) {pow(2.718281828, -1 / beta):.3f}" if beta > 0 else "no runs"
    seasons = "+".join(n for n, v in (("weekly", sig.weekly), ("yearly", sig.yearly)) if v is not None)
    scale = f"daily sd {sig.scale:.4g}{' (log)' if sig.log else ''}" if test.kind == "deviation" else ""
    profile = f", {seasons} profile" if seasons and test.kind == "deviation" else ""
    if sig.yearly_scale is not None and test.kind == "deviation":
        profile += ", a scale by season"
    return f"median {test.median:.3g}, 90% {u:.3g}, tail {beta:.3g}{'; ' + scale if scale else ''}{profile}"


def calibration_rows(cal: Calibration) -> list[dict]:
    """One row per test, for tables (the audit's JSON, the asset's metadata)."""
    return [{"column": cal.signals[t.signal].column, "measure": cal.signals[t.signal].measure, "test": t.kind,
             "window": t.window, "limit": t.limit, "natural": _natural(cal, t), "blocked_days": len(t.blocked),
             "blocked": [d.isoformat() for d in t.blocked[:SHOWN_DAYS]]} for t in cal.tests]


def calibration_report(cal: Calibration, path: Path | None = None) -> str:
    head = [f"calibration {cal.version[:12]} of {cal.model}" + (f" ({path})" if path else ""),
            f"  history {cal.start}..{cal.end}: {cal.days} days ({len(cal.missing)} missing), {cal.judged_days} judged",
            f"  target rate {cal.target_rate:g}: each test's tail probability {cal.tail_p:.2g}; the history's days "
            f"blocked at these limits: {cal.in_sample_rate:.2%}",
            f"  {'column':<22} {'measure':<16} {'test':<16} {'limit':>9}  natural variability  -> history days blocked"]
    lines = []
    for row in calibration_rows(cal):
        test = row["test"] + (f" {row['window']}d" if row["window"] > 1 else "")
        blocked = f"{row['blocked_days']}" + (f": {', '.join(row['blocked'])}" if row["blocked"] else "") + \
            (" ..." if row["blocked_days"] > SHOWN_DAYS else "")
        lines.append(f"  {row['column'][:22]:<22} {row['measure'][:16]:<16} {test:<16} {row['limit']:>9.4g}  "
                     f"{row['natural']}  -> {blocked}")
    return "\n".join(head + lines)
