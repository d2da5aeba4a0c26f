"""The typed evaluation report reads the documents registered versions already hold: reports written
by the code before it (kept in reports/: a first model and a challenger of flights_delay, a first
multiclass and a first regression model, a model judged against a rival) load, write back the same
document, and give the same gate when the policy judges them again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ml_assets import cards
from ml_assets.evaluation.document import EvaluationReport
from ml_assets.evaluation.policy import decide
from ml_assets.spec import PromotionSpec

REPORTS = Path(__file__).parent / "reports"
DOCUMENTS = sorted(p for p in REPORTS.glob("*.json") if p.stem != "policies")


def _document(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_reports_of_earlier_code_are_here():
    assert {p.stem for p in DOCUMENTS} >= {"binary_first_model", "binary_challenger", "multiclass_first_model",
                                          "regression_first_model", "binary_with_rival"}


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.stem)
def test_a_stored_report_loads_and_writes_back_the_same_document(path):
    document = _document(path)
    report = EvaluationReport.from_dict(document)
    assert report.to_dict() == document
    assert json.loads(report.to_json()) == document
    assert EvaluationReport.from_json(report.to_json()) == report


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.stem)
def test_the_policy_gives_a_stored_report_the_gate_it_was_given(path):
    stored = EvaluationReport.from_dict(_document(path))
    policy = PromotionSpec.model_validate(json.loads((REPORTS / "policies.json").read_text())[path.stem])
    assert decide(policy, stored).as_gate() == stored.gate


def test_the_fields_read_what_the_keys_held():
    document = _document(REPORTS / "binary_challenger.json")
    report = EvaluationReport.from_dict(document)
    assert report.compared and report.champion.version == document["champion"]["version"]
    assert report.champion.metrics == document["champion"]["metrics"]
    assert list(report.primary_delta) == document["primary_delta"]
    assert [s.to_dict() for s in report.slices] == document["slices"]
    assert report.baseline.best_score.name == document["baseline"]["best"]
    assert report.gate.passed == document["gate"]["passed"]
    assert [c.to_dict() for c in report.gate.clauses] == document["gate"]["clauses"]


def test_a_report_from_before_baselines_rivals_and_skipped_days_loads_with_their_defaults():
    document = _document(REPORTS / "binary_first_model.json")
    for key in ("baseline", "rival", "skipped_days", "slice_regressions", "test_files"):
        document.pop(key)
    report = EvaluationReport.from_dict(document)
    assert report.baseline is None and report.rival is None and report.skipped_days == {}
    assert report.slice_regressions == () and report.test_files == ()


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.stem)
def test_a_card_reads_a_stored_report(path):
    report = EvaluationReport.from_dict(_document(path))
    card = {"report": report, "skipped_days": {}, "card": {"considerations": []}}
    found = cards.limits(card)
    assert any(f"{report.primary_metric} is known only to within" in line for line in found)
    section = "\n".join(cards._evaluation_section(report))
    assert f"Primary metric **{report.primary_metric}** {report.primary_value:.4f}" in section
