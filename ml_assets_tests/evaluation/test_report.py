"""The baselines' training rows: a seeded, bounded, uniform sample of the window (the whole window
when it is small), read from the pinned files, and recorded in the report and its summary."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ml_assets.evaluation.document import BaselineSample, EvaluationReport
from ml_assets.evaluation.report import sample_rows
from ml_assets.evaluation.summary import summary_markdown
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.storage import IntegrityError
from ml_assets.trainer.config import DataRef
from ml_assets.trainer.data import read_frame

REPORTS = Path(__file__).parent / "reports"


@pytest.fixture
def window(tmp_path) -> list[DataRef]:
    """Three days of 1,000 rows each, numbered in file order."""
    refs = []
    for day in range(3):
        path = tmp_path / f"day-{day}.parquet"
        pl.DataFrame({"row": np.arange(day * 1000, (day + 1) * 1000), "x": np.random.default_rng(day).random(1000)}
                     ).write_parquet(path)
        refs.append(DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest()))
    return refs


def test_a_window_under_the_bound_is_used_whole_as_it_was_read_before(window):
    frame, sample = sample_rows(window, 3000, seed=0)
    assert frame.equals(read_frame(window))
    assert sample == BaselineSample(rows=3000, window_rows=3000, seed=0) and sample.whole


def test_a_larger_window_gives_a_seeded_uniform_sample_in_file_order(window):
    frame, sample = sample_rows(window, 600, seed=0)
    assert sample == BaselineSample(rows=600, window_rows=3000, seed=0) and not sample.whole
    rows = frame["row"].to_numpy()
    assert len(rows) == 600 and len(np.unique(rows)) == 600 and np.all(np.diff(rows) > 0)
    whole = read_frame(window)
    assert frame.equals(whole.filter(pl.col("row").is_in(rows.tolist())))  # the rows as they were, every column
    assert sample_rows(window, 600, seed=0)[0].equals(frame)
    assert not sample_rows(window, 600, seed=1)[0].equals(frame)
    per_day = np.bincount(rows // 1000, minlength=3)
    assert per_day.min() > 150 and not np.all(rows % 5 == rows[0] % 5)  # every day drawn, not every k-th row


def test_the_sample_is_read_from_checked_files(window):
    bad = [window[0], DataRef(uri=window[1].uri, sha256="0" * 64), window[2]]
    with pytest.raises(IntegrityError, match="refusing to use it"):
        sample_rows(bad, 600, seed=0)


def test_the_report_and_its_summary_say_what_the_baselines_were_fitted_on():
    document = json.loads((REPORTS / "binary_first_model.json").read_text())
    spec = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")
    sampled = {**document, "baseline": {**document["baseline"],
                                        "sample": {"rows": 200_000, "window_rows": 5_512_340, "seed": 0}}}
    report = EvaluationReport.from_dict(sampled)
    assert report.baseline.sample == BaselineSample(rows=200_000, window_rows=5_512_340, seed=0)
    assert report.to_dict() == sampled
    assert ("fitted on 200,000 of the 5,512,340 rows of the model's training days (drawn uniformly, seed 0)"
            in summary_markdown(spec, report, {}))
    whole = {**sampled, "baseline": {**sampled["baseline"], "sample": {"rows": 900, "window_rows": 900, "seed": 0}}}
    assert "fitted on all 900 rows of the model's training days" in summary_markdown(
        spec, EvaluationReport.from_dict(whole), {})
    before = EvaluationReport.from_dict(document)  # a report from before the sample was recorded
    assert before.baseline.sample is None and "sample" not in before.to_dict()["baseline"]
    assert "fitted on the model's training days" in summary_markdown(spec, before, {})
