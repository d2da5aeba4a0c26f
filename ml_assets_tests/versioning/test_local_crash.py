"""SIGKILL in the middle of an upload, a commit and a merge: main is untouched and the store opens
consistently afterwards. Real processes, real signals."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ml_assets.versioning import LocalVersionStore, NotFound

REPO = "crash-test"

CHILD = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from ml_assets.versioning import LocalVersionStore
    from ml_assets.versioning import local

    root, phase, ready = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def stop_here():
        ready.write_text("ready")
        time.sleep(120)

    store = LocalVersionStore(root)
    if phase == "upload":
        def half_write(self, key, data):
            # The first half of the bytes is on disk (beside its final name) when the kill lands.
            Path(key).parent.mkdir(parents=True, exist_ok=True)
            with open(f"{key}.tmp-crash", "wb") as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
            stop_here()
        local.LocalVersionStore._store_bytes = half_write
        store.put_object("crash-test", "work", "rows/new", b"x" * 1_000_000)
    else:
        if phase == "merge":
            store.put_object("crash-test", "work", "rows/new", b"new rows")
            store.commit("crash-test", "work", "new rows", {})
        original = local.LocalVersionStore._save_tree
        def save_then_stop(self, db, tree):
            result = original(self, db, tree)  # inside the open transaction
            stop_here()
            return result
        local.LocalVersionStore._save_tree = save_then_stop
        if phase == "commit":
            store.put_object("crash-test", "work", "rows/new", b"new rows")
            store.commit("crash-test", "work", "new rows", {})
        else:
            store.merge("crash-test", "work", "main")
''')


@pytest.fixture
def store(tmp_path) -> LocalVersionStore:
    store = LocalVersionStore(tmp_path / "versions")
    store.ensure_repository(REPO)
    store.create_branch(REPO, "seed")
    store.put_object(REPO, "seed", "rows/old", b"old rows")
    store.commit(REPO, "seed", "seed", {})
    store.merge(REPO, "seed")
    store.create_branch(REPO, "work")
    return store


def _kill_at(phase: str, store: LocalVersionStore, tmp_path: Path) -> None:
    ready = tmp_path / f"{phase}.ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(store.root), phase, str(ready)])
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert child.poll() is None, f"the child exited early with {child.returncode}"
        assert time.monotonic() < deadline, "the child never reached the crash point"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("phase", ["upload", "commit", "merge"])
def test_sigkill_leaves_main_untouched_and_the_store_consistent(phase, store, tmp_path):
    main_before = store.branch_head(REPO, "main")
    work_before = store.branch_head(REPO, "work")
    _kill_at(phase, store, tmp_path)

    reopened = LocalVersionStore(store.root)
    assert reopened.branch_head(REPO, "main") == main_before
    assert [o.path for o in reopened.list_objects(REPO, "main")] == ["rows/old"]
    assert reopened.verify() == []
    assert not list((store.root / "objects").glob("*/*.tmp-*")), "verify() removes half-written leftovers"

    if phase == "upload":  # nothing was staged: the interrupted write is simply not there
        with pytest.raises(NotFound):
            reopened.stat_object(REPO, "work", "rows/new")
        reopened.put_object(REPO, "work", "rows/new", b"new rows")
    if phase == "commit":  # the commit never happened; what was staged before it still is
        assert reopened.branch_head(REPO, "work") == work_before
        assert reopened.get_object(REPO, "work", "rows/new") == b"new rows"
    if phase != "merge":
        reopened.commit(REPO, "work", "new rows", {})
    head = reopened.merge(REPO, "work")  # the interrupted operation can simply be done again
    assert reopened.get_object(REPO, head, "rows/new") == b"new rows"
    assert reopened.get_object(REPO, head, "rows/old") == b"old rows"


def test_verify_reports_a_corrupt_or_missing_object(store):
    info = store.stat_object(REPO, "main", "rows/old")
    path = store.root / "objects" / info.sha256[:2] / info.sha256[2:]
    path.write_bytes(b"tampered")
    problems = store.verify()
    assert len(problems) == 1 and "corrupt" in problems[0]
    path.unlink()
    assert "missing" in store.verify()[0]
    with pytest.raises(Exception, match="missing"):
        store.get_object(REPO, "main", "rows/old")


def test_old_layout_is_refused_with_advice(tmp_path):
    import sqlite3

    root = tmp_path / "old"
    root.mkdir()
    db = sqlite3.connect(root / "refs.db")
    db.execute("CREATE TABLE trees (id TEXT)")
    db.commit()
    db.close()
    with pytest.raises(Exception, match="has layout 0.*move it aside"):
        LocalVersionStore(root)
