"""Eight writers at once, each committing and merging into main: every one lands, none is lost."""

import datetime as dt
import subprocess
import sys
import textwrap

import pytest

from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore, StoreBusy, merge_with_retry
from ml_assets_tests.helpers import cli_env, write_spec

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


OPENER = textwrap.dedent('''
    import sys, time
    from ml_assets.versioning import LocalVersionStore

    while time.time() < float(sys.argv[2]):
        time.sleep(0.001)
    LocalVersionStore(sys.argv[1]).ensure_repository("opened")
''')


@pytest.mark.slow
def test_eight_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    """Creating the store's tables is one locked step: a process never sees them half-made."""
    import time

    for attempt in range(3):
        root = tmp_path / f"store{attempt}"
        go = str(time.time() + 3)  # every process opens the store at the same moment
        openers = [subprocess.Popen([sys.executable, "-c", OPENER, str(root), go], stderr=subprocess.PIPE, text=True)
                   for _ in range(8)]
        results = [(o.wait(timeout=120), o.stderr.read()) for o in openers]
        assert [code for code, _ in results] == [0] * 8, [err[-1500:] for code, err in results if code]


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
    # Ordinary days: Feb 8-9 2013 (a blizzard) would rightly fail the nulls check.
    days = [dt.date(2013, 7, d) for d in range(8, 16)]
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


class _BusyFirst:
    """A real store whose first merges find it busy, as when another writer holds the lock."""

    def __init__(self, store: LocalVersionStore, busy_times: int) -> None:
        self.store, self.busy_times, self.attempts = store, busy_times, 0

    def merge(self, *args, **kwargs):
        self.attempts += 1
        if self.attempts <= self.busy_times:
            raise StoreBusy("locked by another writer")
        return self.store.merge(*args, **kwargs)


def test_a_busy_merge_is_retried_not_lost(tmp_path):
    store = LocalVersionStore(tmp_path)
    store.ensure_repository("retry-test")
    store.create_branch("retry-test", "b")
    store.put_object("retry-test", "b", "x", b"1")
    store.commit("retry-test", "b", "m", {})
    flaky = _BusyFirst(store, busy_times=2)
    head = merge_with_retry(flaky, "retry-test", "b", "main", first_wait=0.01)
    assert flaky.attempts == 3 and store.get_object("retry-test", head, "x") == b"1"
    with pytest.raises(StoreBusy):
        merge_with_retry(_BusyFirst(store, busy_times=10), "retry-test", "b", "main", attempts=3, first_wait=0.01)
