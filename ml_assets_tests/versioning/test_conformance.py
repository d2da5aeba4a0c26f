"""One behaviour for every VersionStore backend: this suite runs against each of them.

Backends: the embedded store with objects on local disk; the embedded store with objects in S3
(moto's S3 server on loopback); the lakeFS backend through the real `lakefs` SDK over HTTP, against
a server shaped like the lakeFS API (ml_assets_tests/lakefs_api.py: no lakeFS server can run on
these machines); and the lakeFS backend against a real lakeFS when LAKEFS_ENDPOINT,
LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY are set.
"""

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from ml_assets.names import InvalidName
from ml_assets.versioning import (
    LocalVersionStore,
    MergeConflict,
    NoChanges,
    NotFound,
    ProtectedBranch,
    VersionStore,
    VersionStoreError,
)
from ml_assets.versioning import local as local_backend
from ml_assets.versioning.lakefs_backend import LakeFSVersionStore
from ml_assets_tests.lakefs_api import LakeFSLikeServer

REPO = "models-test"


LAKEFS_ENV = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY")
REAL_LAKEFS = all(os.environ.get(k) for k in LAKEFS_ENV)


@pytest.fixture(params=[
    "local",
    "local-s3-objects",
    "lakefs-sdk-over-http",
    pytest.param("lakefs-real", marks=pytest.mark.skipif(not REAL_LAKEFS, reason="set " + ", ".join(LAKEFS_ENV))),
])
def store(request, tmp_path) -> Iterator[VersionStore]:
    if request.param.startswith("lakefs"):
        yield from _lakefs_store(request.param, tmp_path)
        return
    if request.param == "local":
        # Tiny ranges and overlays, so splits and compactions happen in every test.
        backend = LocalVersionStore(tmp_path / "versions", range_size=8, overlay_limit=5)
    else:
        import boto3

        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"vs-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        backend = LocalVersionStore(tmp_path / "versions", objects_url=f"s3://{bucket}/objects",
                                    storage_options={"client_kwargs": {"endpoint_url": endpoint}}, range_size=8,
                                    overlay_limit=5)
    backend.ensure_repository(REPO)
    yield backend


def _lakefs_store(kind: str, tmp_path) -> Iterator[VersionStore]:
    if kind == "lakefs-real":
        import lakefs

        backend = LakeFSVersionStore(os.environ["LAKEFS_ENDPOINT"], os.environ["LAKEFS_ACCESS_KEY_ID"],
                                     os.environ["LAKEFS_SECRET_ACCESS_KEY"],
                                     os.environ.get("LAKEFS_STORAGE_NAMESPACE", "local://ml-assets-tests"))
        # The suite owns this repository on the test server: start it afresh.
        with contextlib.suppress(lakefs.exceptions.NotFoundException):
            lakefs.Repository(REPO, client=backend.client).delete()
        backend.ensure_repository(REPO)
        yield backend
        return
    with LakeFSLikeServer(tmp_path / "lakefs-server") as server:
        backend = LakeFSVersionStore(server.endpoint, "AKIAIOSFODNN7EXAMPLE", "test-secret", "local://ml-assets")
        backend.ensure_repository(REPO)
        yield backend


def _commit_on_branch(store: VersionStore, branch: str, files: dict[str, bytes], source: str = "main") -> str:
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
    head = store.merge(REPO, "ingest-1", "main", metadata={"audited_by": "r2"})
    assert head != commit.id and store.get_commit(REPO, head).parents[1] == commit.id  # a merge commit
    assert store.get_commit(REPO, head).metadata == {"audited_by": "r2"}
    assert store.get_object(REPO, head, "rows/a.parquet") == b"data"
    assert store.merge(REPO, "ingest-1", "main") == head  # already merged: nothing new


def test_three_way_merge_keeps_both_sides(store):
    a = _commit_on_branch(store, "a", {"rows/day=1.parquet": b"one"})
    _commit_on_branch(store, "b", {"rows/day=2.parquet": b"two"})
    first = store.merge(REPO, "a")
    merged = store.merge(REPO, "b")
    assert merged != first
    assert [o.path for o in store.list_objects(REPO, merged)] == ["rows/day=1.parquet", "rows/day=2.parquet"]
    assert set(store.get_commit(REPO, merged).parents) == {first, store.branch_head(REPO, "b")}
    history = [c.id for c in store.log(REPO, "main")]
    assert history[0] == merged and {a, first, store.branch_head(REPO, "b")} <= set(history)
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


def test_fast_forward_on_request_moves_dest_to_the_source_commit(store):
    if isinstance(store, LakeFSVersionStore):
        pytest.skip("lakeFS always makes a merge commit; fast-forward is the embedded store's option")
    commit = _commit_on_branch(store, "a", {"x": b"1"})
    assert store.merge(REPO, "a", fast_forward=True) == commit
    _commit_on_branch(store, "b", {"y": b"2"}, source="main")
    _commit_on_branch(store, "c", {"z": b"3"}, source=commit)
    store.merge(REPO, "b", fast_forward=True)
    merged = store.merge(REPO, "c", fast_forward=True)  # main moved: a three-way merge after all
    assert len(store.get_commit(REPO, merged).parents) == 2


def test_uncommitted_branch_cannot_merge(store):
    store.create_branch(REPO, "dirty")
    store.put_object(REPO, "dirty", "x", b"1")
    with pytest.raises(VersionStoreError, match="uncommitted"):
        store.merge(REPO, "dirty")


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


def test_diff_lists_added_changed_and_removed(store):
    first = _commit_on_branch(store, "a", {"keep": b"1", "change": b"old", "drop": b"x"})
    store.create_branch(REPO, "b", first)
    store.put_object(REPO, "b", "change", b"new")
    store.put_object(REPO, "b", "add", b"+")
    store.delete_object(REPO, "b", "drop")
    second = store.commit(REPO, "b", "edit", {}).id
    changes = {(c.path, c.type) for c in store.diff(REPO, first, second)}
    assert changes == {("add", "added"), ("change", "changed"), ("drop", "removed")}
    assert [c.path for c in store.diff(REPO, first, second, prefix="ch")] == ["change"]
    assert store.diff(REPO, second, second) == []
    with pytest.raises(NotFound):
        store.stat_object(REPO, second, "drop")
    assert store.stat_object(REPO, first, "drop").size == 1  # still there at the older commit


def test_tags_pin_a_commit_and_resolve_as_refs(store):
    _commit_on_branch(store, "a", {"x": b"1"})
    commit = store.merge(REPO, "a")
    assert store.create_tag(REPO, "v1", "main") == commit
    _commit_on_branch(store, "b", {"x": b"2"})
    store.merge(REPO, "b")
    assert store.get_object(REPO, "v1", "x") == b"1"
    assert store.list_tags(REPO) == {"v1": commit}
    with pytest.raises(VersionStoreError, match="already exists"):
        store.create_tag(REPO, "v1", "main")
    store.delete_tag(REPO, "v1")
    with pytest.raises(NotFound):
        store.get_object(REPO, "v1", "x")


def test_revert_undoes_one_commit_through_a_branch(store):
    good = _commit_on_branch(store, "a", {"rows/1": b"good"})
    store.merge(REPO, "a")
    bad = _commit_on_branch(store, "b", {"rows/2": b"bad", "rows/1": b"overwritten"})
    store.merge(REPO, "b")
    with pytest.raises(ProtectedBranch):
        store.revert(REPO, "main", bad)
    store.create_branch(REPO, "fix", "main")
    reverted = store.revert(REPO, "fix", bad, metadata={"reason": "bad day"})
    assert reverted.metadata == {"reason": "bad day"}
    store.merge(REPO, "fix")
    assert store.get_object(REPO, "main", "rows/1") == b"good"
    with pytest.raises(NotFound):
        store.stat_object(REPO, "main", "rows/2")
    assert store.get_object(REPO, good, "rows/1") == b"good"
    with pytest.raises(VersionStoreError, match="parent 2 does not exist"):
        store.revert(REPO, "fix", bad, parent_number=2)


def test_log_is_newest_first_and_carries_metadata(store):
    _commit_on_branch(store, "a", {"x": b"1"})
    store.merge(REPO, "a", metadata={"dagster_run_id": "r1"})
    _commit_on_branch(store, "b", {"y": b"2"})
    head = store.merge(REPO, "b", metadata={"dagster_run_id": "r2"})
    log = store.log(REPO, "main")
    assert log[0].id == head and log[-1].message == "Repository created"
    assert [c.created_at for c in log] == sorted((c.created_at for c in log), reverse=True)
    assert store.get_commit(REPO, head).metadata == {"dagster_run_id": "r2"}
    assert len(store.log(REPO, "main", limit=2)) == 2


def test_many_objects_split_into_ranges_and_stay_addressable(store):
    size = getattr(store, "range_size", local_backend.RANGE_SIZE)
    n = 3 * size + 17
    files = {f"rows/{i:05d}": str(i).encode() for i in range(n)}
    first = _commit_on_branch(store, "bulk", files)
    store.merge(REPO, "bulk")
    listed = store.list_objects(REPO, first, prefix="rows/")
    assert [o.path for o in listed] == sorted(files)
    assert store.get_object(REPO, "main", "rows/00000") == b"0"
    assert store.get_object(REPO, "main", f"rows/{n - 1:05d}") == str(n - 1).encode()
    # Changes spread over several ranges, merged with a concurrent change elsewhere.
    store.create_branch(REPO, "edit", "main")
    for i in (3, size + 5, n - 2):
        store.put_object(REPO, "edit", f"rows/{i:05d}", b"edited")
    store.delete_object(REPO, "edit", "rows/00010")
    store.commit(REPO, "edit", "edit", {})
    _commit_on_branch(store, "other", {"zzz/new": b"z"})
    store.merge(REPO, "other")
    store.merge(REPO, "edit")
    assert {c.path for c in store.diff(REPO, first, "main")} == {
        "rows/00003", f"rows/{size + 5:05d}", f"rows/{n - 2:05d}", "rows/00010", "zzz/new"}
    assert len(store.list_objects(REPO, "main")) == n  # one deleted, one added


def test_lakefs_server_refuses_other_clients_writing_to_main(store):
    """ensure_repository adds a branch-protection rule, so the server itself refuses, not only us."""
    if not isinstance(store, LakeFSVersionStore):
        pytest.skip("lakeFS branch protection")
    import lakefs

    main = lakefs.Repository(REPO, client=store.client).branch("main")
    with pytest.raises(lakefs.exceptions.ForbiddenException):
        main.object("sneaky.txt").upload(b"unchecked", pre_sign=False)
    assert store.list_objects(REPO, "main") == []


def test_random_history_matches_a_plain_model(store):
    """Random writes, deletes, commits and merges (crossing range splits and overlay compactions)
    leave main holding exactly what a dict that replays them holds, at every commit."""
    import random

    rng = random.Random(7)
    model: dict[str, bytes] = {}
    snapshots: list[tuple[str, dict[str, bytes]]] = []
    for round_ in range(6 if isinstance(store, LakeFSVersionStore) else 12):
        branch = f"work-{round_}"
        store.create_branch(REPO, branch, "main")
        pending = dict(model)
        for _ in range(rng.randint(3, 9)):
            path = f"rows/{rng.randint(0, 40):03d}"
            if path in pending and rng.random() < 0.3:
                store.delete_object(REPO, branch, path)
                del pending[path]
            else:
                data = f"{round_}-{rng.random()}".encode()
                store.put_object(REPO, branch, path, data)
                pending[path] = data
        if pending == model:
            continue
        store.commit(REPO, branch, f"round {round_}", {})
        head = store.merge(REPO, branch)
        model = pending
        snapshots.append((head, dict(model)))
        listed = {o.path: o for o in store.list_objects(REPO, "main")}
        assert set(listed) == set(model)
        for path in rng.sample(sorted(model), min(3, len(model))):
            assert store.get_object(REPO, "main", path) == model[path]
    for (old, old_model), (new, new_model) in zip(snapshots, snapshots[1:], strict=False):
        expected = {p for p in old_model.keys() | new_model.keys() if old_model.get(p) != new_model.get(p)}
        assert {c.path for c in store.diff(REPO, old, new)} == expected
    first, first_model = snapshots[0]
    assert {o.path for o in store.list_objects(REPO, first)} == set(first_model)
