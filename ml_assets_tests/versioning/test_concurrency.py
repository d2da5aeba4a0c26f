"""Eight writers at once, each committing and merging into main: every one lands, none is lost."""

import datetime as dt
import subprocess
import sys
import textwrap

import pytest

from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.conftest import cli_env, write_spec

WRITER = textwrap.dedent('''
    import sys
    from ml_assets.versioning import LocalVersionStore, merge_with_retry

    root, i = sys.argv[1], int(sys.argv[2])
    store = LocalVersionStore(root)
    branch = f"ingest-{i}"
    store.create_branch("conc-test", branch)
    store.put_object("conc-test", branch, f"rows/date={i}/part-0.parquet", f"rows of day {i}".encode())
    store.put_object("conc-test", branch, "dimensions/planes/part-0.parquet", b"the same planes table")
    store.commit("conc-test", branch, f"day {i}", {"writer": str(i)})
    merge_with_retry(store, "conc-test", branch, "main", metadata={"writer": str(i)})
''')


def test_eight_processes_commit_and_merge_into_main(tmp_path):
    store = LocalVersionStore(tmp_path / "versions")
    store.ensure_repository("conc-test")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(store.root), str(i)], stderr=subprocess.PIPE, text=True)
               for i in range(8)]
    results = [(w.wait(timeout=300), w.stderr.read()) for w in writers]
    assert [code for code, _ in results] == [0] * 8, [err for _, err in results if err]
    paths = [o.path for o in store.list_objects("conc-test", "main")]
    assert paths == ["dimensions/planes/part-0.parquet", *[f"rows/date={i}/part-0.parquet" for i in range(8)]]
    merges = [c for c in store.log("conc-test", "main") if len(c.parents) == 2]
    assert sorted(c.metadata["writer"] for c in merges) == [str(i) for i in range(8)]
    assert store.verify() == []


@pytest.mark.e2e
def test_eight_dagster_partition_runs_at_once_all_publish(home, tmp_path, spec_dict):
    """Eight real `dagster asset materialize` processes ingest and publish eight days concurrently."""
    models = tmp_path / "models"
    write_spec(models, spec_dict)
    env = cli_env(ML_ASSETS_MODELS_DIR=str(models))
    # Dagster's SQLite storage must exist before concurrent runs: creating it is not concurrency-safe.
    subprocess.run([sys.executable, "-m", "dagster", "instance", "migrate"], env=env, check=True, capture_output=True)
    days = [dt.date(2013, 2, d) for d in range(1, 9)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select",
             "flights_delay/raw_data,flights_delay/validated_snapshot", "--partition", day.isoformat()],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for day in days
    ]
    results = [(r.wait(timeout=600), r.stderr.read()) for r in runs]
    assert [code for code, _ in results] == [0] * 8, [err[-2000:] for code, err in results if code]
    store = LocalVersionStore(load_settings().version_store_root)
    rows = [o.path for o in store.list_objects("flights-delay", "main", "rows/")]
    assert rows == [f"rows/date={day.isoformat()}/part-0.parquet" for day in days]
    published = {c.metadata.get("partition") for c in store.log("flights-delay", "main") if len(c.parents) == 2}
    assert published == {day.isoformat() for day in days}
    assert set(store.list_branches("flights-delay")) == {"main"}
