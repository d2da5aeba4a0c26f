"""A check outcome as Dagster check metadata: counts, observed vs expected, failing rows, summary."""

import dagster as dg

from ml_assets.validation.outcome import CheckOutcome


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
