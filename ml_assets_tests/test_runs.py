"""Runs from the command line: a window of days ingested with `ml-assets backfill`, and the reason a
run failed said in the last lines the user sees."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from ml_assets.runs import failure_reasons
from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import cli_in_process, flights_files, small_training, write_spec

pytestmark = pytest.mark.e2e


def test_backfill_ingests_a_window_skips_published_days_and_ends_with_why_a_day_failed(home, tmp_path, spec_dict):
    days = [dt.date(2013, 3, 4), dt.date(2013, 3, 5)]
    data = small_training(spec_dict)
    data["source"] = flights_files(tmp_path / "data", days)  # 2013-03-06 has no file
    data["validation"] = {}
    write_spec(tmp_path / "models", data)
    code, out, err = cli_in_process("backfill", "flights_delay", "--start", "2013-03-04", "--end", "2013-03-05",
                             models_dir=tmp_path / "models")
    assert code == 0, err[-3000:]
    assert "flights_delay: 2 day(s) ingested, validated and featurized, 0 already published" in out
    store = LocalVersionStore(load_settings().version_store_root)
    main_before = store.branch_head("flights-delay", "main")
    code, out, err = cli_in_process("backfill", "flights_delay", "--start", "2013-03-04", "--end", "2013-03-06",
                             models_dir=tmp_path / "models")
    assert code == 1
    assert "2013-03-04: already published, skipped" in out and "2013-03-05: already published, skipped" in out
    last = err.strip().splitlines()[-2:]
    assert last[0].startswith("ml-assets backfill: the run for 2013-03-06 failed")
    assert "flights_delay__raw_data:" in last[1] and "no parquet files match" in last[1]
    assert str(tmp_path / "data" / "flights" / "2013-03-06.parquet") in last[1]
    # The day failed before anything was written: main as it was, no branch left behind.
    assert store.branch_head("flights-delay", "main") == main_before
    assert set(store.list_branches("flights-delay")) == {"main"}
    code, _, err = cli_in_process("backfill", "flights_delay", "--start", "2012-12-30", "--end", "2013-01-02",
                           models_dir=tmp_path / "models")
    assert code == 2 and "outside the model's partitions (2013-01-01..2013-12-31)" in err


def test_failure_reasons_are_the_stages_own_words():
    @dg.op
    def refuses() -> None:
        raise dg.Failure(description="the validation days hold 14 rows, fewer than training.min_validation_rows "
                                     "(30); raise training.validation_days")

    @dg.op
    def breaks() -> None:
        raise ValueError("rows lack the feature columns ['items']")

    for op, reason in ((refuses, "refuses: the validation days hold 14 rows"),
                       (breaks, "breaks: ValueError: rows lack the feature columns ['items']")):
        result = dg.GraphDefinition(name=f"g_{op.name}", node_defs=[op]).to_job().execute_in_process(
            raise_on_error=False)
        (found,) = failure_reasons(result)
        assert found.startswith(reason), found
