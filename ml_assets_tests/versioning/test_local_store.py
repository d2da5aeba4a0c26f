import threading

import pytest

from ml_assets.names import InvalidName
from ml_assets.versioning import (
    LocalVersionStore,
    MergeConflict,
    NoChanges,
    NotFound,
    ProtectedBranch,
    VersionStoreError,
)

REPO = "models-test"


@pytest.fixture
def store(tmp_path) -> LocalVersionStore:
    store = LocalVersionStore(tmp_path / "versions")
    store.ensure_repository(REPO)
    return store


def _commit_on_branch(store: LocalVersionStore, branch: str, files: dict[str, bytes], source: str = "main") -> str:
    store.create_branch(REPO, branch, source)
    for path, data in files.items():
        store.put_object(REPO, branch, path, data)
    return store.commit(REPO, branch, f"write {sorted(files)}", {"who": "test"}).id


def test_main_refuses_direct_writes_and_commits(store):
    with pytest.raises(ProtectedBranch):
        store.put_object(REPO, "main", "a.txt", b"x")
    with pytest.raises(ProtectedBranch):
        store.commit(REPO, "main", "m", {})
    with pytest.raises(ProtectedBranch):
        store.delete_branch(REPO, "main")
    assert store.list_objects(REPO, "main") == []


def test_branch_sees_its_writes_main_does_not_until_merge(store):
    store.create_branch(REPO, "ingest-1")
    store.put_object(REPO, "ingest-1", "rows/a.parquet", b"data")
    assert store.get_object(REPO, "ingest-1", "rows/a.parquet") == b"data"
    with pytest.raises(NotFound):
        store.stat_object(REPO, "main", "rows/a.parquet")
    commit = store.commit(REPO, "ingest-1", "m", {"dagster_run_id": "r1"})
    assert store.get_commit(REPO, commit.id).metadata == {"dagster_run_id": "r1"}
    head = store.merge(REPO, "ingest-1", "main")
    assert head == commit.id  # fast-forward
    assert store.get_object(REPO, head, "rows/a.parquet") == b"data"


def test_three_way_merge_keeps_both_sides(store):
    a = _commit_on_branch(store, "a", {"rows/day=1.parquet": b"one"})
    _commit_on_branch(store, "b", {"rows/day=2.parquet": b"two"})
    assert store.merge(REPO, "a") == a
    merged = store.merge(REPO, "b")
    assert merged != a
    assert [o.path for o in store.list_objects(REPO, merged)] == ["rows/day=1.parquet", "rows/day=2.parquet"]
    assert set(store.get_commit(REPO, merged).parents) == {a, store.branch_head(REPO, "b")}
    history = [c.id for c in store.log(REPO, "main")]
    assert history[0] == merged and a in history and store.branch_head(REPO, "b") in history
    assert set(store.list_branches(REPO)) == {"main", "a", "b"}


def test_identical_changes_on_both_sides_are_not_a_conflict(store):
    _commit_on_branch(store, "a", {"dims/planes.parquet": b"same", "rows/1": b"1"})
    _commit_on_branch(store, "b", {"dims/planes.parquet": b"same", "rows/2": b"2"})
    store.merge(REPO, "a")
    store.merge(REPO, "b")
    assert store.get_object(REPO, "main", "dims/planes.parquet") == b"same"


def test_conflicting_merge_raises_and_leaves_main_untouched(store):
    _commit_on_branch(store, "a", {"dims/planes.parquet": b"v1"})
    _commit_on_branch(store, "b", {"dims/planes.parquet": b"v2"})
    first = store.merge(REPO, "a")
    with pytest.raises(MergeConflict, match="dims/planes.parquet"):
        store.merge(REPO, "b")
    assert store.branch_head(REPO, "main") == first
    assert store.get_object(REPO, "main", "dims/planes.parquet") == b"v1"


def test_commit_without_changes_is_refused(store):
    store.create_branch(REPO, "empty")
    with pytest.raises(NoChanges):
        store.commit(REPO, "empty", "m", {})
    _commit_on_branch(store, "a", {"x": b"1"})
    store.merge(REPO, "a")
    store.create_branch(REPO, "again")
    store.put_object(REPO, "again", "x", b"1")  # the same bytes main already holds
    head = store.branch_head(REPO, "main")
    with pytest.raises(NoChanges):
        store.commit(REPO, "again", "m", {})
    assert store.merge(REPO, "again") == head  # nothing staged is left behind to block the merge


def test_merging_a_branch_that_adds_nothing_makes_no_commit(store):
    _commit_on_branch(store, "a", {"x": b"1"})
    head = store.merge(REPO, "a")
    _commit_on_branch(store, "b", {"y": b"2"}, source=head)
    store.merge(REPO, "b")
    head = store.branch_head(REPO, "main")
    store.create_branch(REPO, "c", "b")  # already merged content
    assert store.merge(REPO, "c") == head


def test_reads_by_commit_id_never_move(store):
    first = _commit_on_branch(store, "a", {"x": b"old"})
    store.merge(REPO, "a")
    _commit_on_branch(store, "b", {"x": b"new"})
    store.merge(REPO, "b")
    assert store.get_object(REPO, first, "x") == b"old"
    assert store.get_object(REPO, "main", "x") == b"new"


def test_uncommitted_branch_cannot_merge(store):
    store.create_branch(REPO, "dirty")
    store.put_object(REPO, "dirty", "x", b"1")
    with pytest.raises(VersionStoreError, match="uncommitted"):
        store.merge(REPO, "dirty")


def test_corrupt_object_is_detected(store):
    commit = _commit_on_branch(store, "a", {"x": b"payload"})
    info = store.stat_object(REPO, commit, "x")
    store._object_path(info.sha256).write_bytes(b"tampered")
    with pytest.raises(VersionStoreError, match="corrupt"):
        store.get_object(REPO, commit, "x")


@pytest.mark.parametrize("branch", ["../main", "a b", "-x", "x/y", ""])
def test_unsafe_branch_names_are_refused(store, branch):
    with pytest.raises(InvalidName):
        store.create_branch(REPO, branch)


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a//b", "a/./b", "a/b/"])
def test_unsafe_object_paths_are_refused(store, path):
    store.create_branch(REPO, "b")
    with pytest.raises(InvalidName):
        store.put_object(REPO, "b", path, b"x")


def test_unknown_repository_and_ref(store):
    with pytest.raises(NotFound, match="repository"):
        store.branch_head("nope-repo", "main")
    with pytest.raises(NotFound, match="branch"):
        store.get_object(REPO, "missing", "x")
    with pytest.raises(NotFound, match="commit"):
        store.get_object(REPO, "0" * 64, "x")


def test_concurrent_merges_lose_nothing(store):
    branches = [f"day-{i}" for i in range(8)]
    for i, branch in enumerate(branches):
        _commit_on_branch(store, branch, {f"rows/{i}": str(i).encode()})
    errors = []

    def merge(branch: str) -> None:
        try:
            LocalVersionStore(store.root).merge(REPO, branch)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=merge, args=(b,)) for b in branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(o.path for o in store.list_objects(REPO, "main")) == sorted(f"rows/{i}" for i in range(8))
