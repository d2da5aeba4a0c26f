"""A check outcome as Dagster check metadata: counts, observed vs expected, failing rows, summary; and
what the merge into main records of the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from ml_assets.validation.outcome import CheckOutcome

if TYPE_CHECKING:
    from ml_assets.validation.run import Verdict  # pandera, scipy: imported at run time only


def check_metadata(outcome: CheckOutcome, repo: str, branch: str, commit: str) -> dict:
    metadata = {
        "summary": dg.MetadataValue.md(outcome.markdown()),
        "failures_by_kind": dg.MetadataValue.json(outcome.counts),
        "observed": dg.MetadataValue.json(outcome.observed),
        "expected": dg.MetadataValue.json(outcome.expected),
        "failures": sum(outcome.counts.values()),
        "repository": repo, "branch": branch, "audited_commit": commit,
    }
    if outcome.waived:
        metadata["waived"] = outcome.waived
    rows = outcome.failing_rows
    if rows is not None and rows.height:
        columns = ["failed", *[c for c in rows.columns if c != "failed"]]
        metadata["failing_rows"] = dg.MetadataValue.table(
            records=[dg.TableRecord({c: "" if v is None else str(v) for c, v in zip(columns, row, strict=True)})
                     for row in rows.select(columns).iter_rows()],
            schema=dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in columns]),
        )
    return metadata


def check_result(outcome: CheckOutcome, repo: str, branch: str, commit: str, quarantined: int) -> dg.AssetCheckResult:
    metadata = check_metadata(outcome, repo, branch, commit)
    metadata["quarantined_rows"] = quarantined
    # A waived failure, like a severity-warn check's, shows as failed with severity WARN, which does not block:
    # the UI keeps saying what the check found (and the waiver's reason beside it).
    warn = outcome.waived or not outcome.blocking
    return dg.AssetCheckResult(
        check_name=outcome.name, passed=outcome.passed and not outcome.waived, description=outcome.summary,
        severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR, metadata=metadata)


def verdict_metadata(verdict: Verdict, names: list[str]) -> dict[str, str]:
    """The merge commit's record of the checks: which passed, which failures were waived or only warned."""
    warned = {o.name: o.summary for o in verdict.warnings}
    quarantined = len(verdict.quarantined)
    metadata = {"checks_passed": f"{', '.join(n for n in names if n not in warned)} ({verdict.rows.height} rows"
                                 + (f", {quarantined} quarantined)" if quarantined else ")")}
    if verdict.waived:
        metadata["waived"] = "; ".join(f"{name}: {why}" for name, why in verdict.waived.items())
    if warned:
        metadata["warnings"] = "; ".join(f"{name}: {why}" for name, why in warned.items())
    return metadata
