from ml_assets.lineage import Check, publication
from ml_assets.versioning import LocalVersionStore

REPO = "lineage-test"


def _publish(store: LocalVersionStore, day: str, data: bytes) -> str:
    branch = f"ingest-{day}"
    store.create_branch(REPO, branch)
    store.put_object(REPO, branch, f"rows/date={day}/part-0.parquet", data)
    raw = store.commit(REPO, branch, day, {"partition": day, "source_files": '{"s3://src/x": "abc"}'}).id
    return store.merge(REPO, branch, metadata={"partition": day, "audited_commit": raw, "checks_passed": "schema"})


def test_publication_finds_the_merge_of_that_day_even_from_a_later_commit(tmp_path):
    store = LocalVersionStore(tmp_path)
    store.ensure_repository(REPO)
    first = _publish(store, "2013-01-01", b"day one")
    later = _publish(store, "2013-01-02", b"day two")
    # A re-ingest of an unchanged day records main's head at that time: a later commit.
    merged, raw = publication(store, REPO, later, "2013-01-01")
    assert merged.id == first
    assert raw.metadata["partition"] == "2013-01-01"
    assert publication(store, REPO, first, "2013-01-02") == (None, None)  # not published yet then


def test_check_statuses():
    assert Check("x", "a", "a", "w").status == "ok"
    assert Check("x", "a", "b", "w").status == "MISMATCH"
    assert Check("x", "a", None, "w").status == "unreachable"
