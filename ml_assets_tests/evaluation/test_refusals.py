"""The refusals log: each refused candidate one line on main of the model's repository, written whole
or not at all, never twice for the same candidate and champion, and read back oldest first."""

from __future__ import annotations

from ml_assets.audit import render_refusals
from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.evaluation.refusals import SHOWN, log_refusal, refusal, refusals
from ml_assets.layout import Layout
from ml_assets.names import repo_for_model
from ml_assets.versioning import LocalVersionStore

MODEL = "flights_delay"


def _evaluated(sha: str, champion: str | None, value: float) -> EvaluationRecord:
    return EvaluationRecord(
        primary_metric="roc_auc", metrics={"roc_auc": value}, primary_interval=[value - 0.01, value + 0.01],
        test_rows=900, repository="r", test_days=["2013-01-20"], validation_days=[], skipped_days={},
        test_data_commit="c", test_files=[], positive_rate=0.2, decision_threshold=0.3, checkpoint_sha256=sha,
        champion_version=champion, gate_passed=False, gate_reason=f"roc_auc {value} short of the champion",
        slices=[], baseline=None, report_uri="/a/report.json", report_sha256="e" * 64, report_bytes=9,
        mlflow_run_id="run", mlflow_run_url="http://mlflow/run", plots={}, summary="s",
        primary_delta=[-0.0005, -0.004, 0.003], champion_metrics={"roc_auc": value + 0.0005})


def test_each_refusal_is_one_line_on_main_and_the_same_candidate_is_logged_once(tmp_path):
    store = LocalVersionStore(tmp_path / "store")
    first = refusal(MODEL, "2013-01-20", _evaluated("a" * 64, "3", 0.70), [{"name": "improvement", "ok": False}],
                    "fine_tune", "run-1")
    assert log_refusal(store, first) is not None
    head = store.branch_head(repo_for_model(MODEL), "main")
    again = refusal(MODEL, "2013-01-20", _evaluated("a" * 64, "3", 0.70), [], "fine_tune", "run-2")
    assert again["id"] == first["id"] and log_refusal(store, again) is None  # a rerun of the same evaluation
    assert store.branch_head(repo_for_model(MODEL), "main") == head
    second = refusal(MODEL, "2013-01-21", _evaluated("b" * 64, "3", 0.69), [], "full", "run-3")
    log_refusal(store, second)

    logged = refusals(store, MODEL)
    assert [r["partition"] for r in logged] == ["2013-01-20", "2013-01-21"]
    assert logged[0] == first and logged[0]["delta"] == -0.0005 and abs(logged[0]["champion_value"] - 0.7005) < 1e-12
    assert logged[1]["trained"] == "full" and logged[1]["dagster_run_id"] == "run-3"
    assert list(store.list_branches(repo_for_model(MODEL))) == ["main"]  # the append's branch is gone
    assert Layout(MODEL).refusals_log != Layout(MODEL).promotions_log


def test_the_audit_lists_the_newest_refusals_with_their_reasons():
    many = [refusal(MODEL, f"2013-02-{d:02d}", _evaluated(f"{d:064d}", "3", 0.6 + d / 1000), [], "fine_tune", "r")
            for d in range(1, SHOWN + 3)]
    lines = render_refusals(many, "flights-delay@main:promotions/flights_delay.refused.jsonl")
    assert lines[0] == f"## Refused candidates ({SHOWN + 2}; flights-delay@main:promotions/flights_delay.refused.jsonl)"
    shown = [x for x in lines if x.startswith("- ")]
    assert len(shown) == SHOWN and "partition 2013-02-12 (fine_tune): roc_auc 0.6120 against champion v3 (-0.0005)" \
        in shown[-1] and shown[-1].endswith("roc_auc 0.612 short of the champion")
    assert render_refusals([], "x")[-1] == "none"
