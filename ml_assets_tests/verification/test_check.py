"""The version store's half of ``ml-assets verify``: every object of every commit reachable from main
is read and hashed once, and one that is missing or corrupt is reported with its days; the other
half (versions and aliases) runs end to end in test_e2e_cli."""

from pathlib import Path

import pytest

from ml_assets.verification.check import check
from ml_assets.versioning import LocalVersionStore, NoChanges

MODEL = "shop_sales"
REPO = "shop-sales"


def publish(store: LocalVersionStore, day: str, data: bytes) -> None:
    branch = f"ingest-{day}"
    store.create_branch(REPO, branch)
    store.put_objects(REPO, branch, {f"rows/date={day}/part-0.parquet": data, "dimensions/shops/part-0.parquet": b"shops"})
    raw = store.commit(REPO, branch, day, {"partition": day}).id
    store.merge(REPO, branch, metadata={"partition": day, "audited_commit": raw})
    store.delete_branch(REPO, branch)


def object_file(store_root: Path, data: bytes) -> Path:
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    [path] = (store_root / "objects").glob(f"{sha[:2]}/{sha[2:]}")
    return path


def test_a_whole_store_then_a_lost_and_a_corrupt_object_named_with_their_days(tmp_path):
    store = LocalVersionStore(tmp_path)
    store.ensure_repository(REPO)
    for day, data in (("2024-01-01", b"one"), ("2024-01-02", b"two"), ("2024-01-03", b"three")):
        publish(store, day, data)
    # Day 2 read again with other bytes: its first bytes are no longer on main's head, but the
    # commits that held them are still reachable, so they must still be whole.
    publish(store, "2024-01-02", b"two, corrected")
    report = check(None, store, MODEL)
    assert report.whole and report.objects == 5 and report.commits >= 8, report.findings
    assert report.summary().startswith("shop_sales: whole: ")

    object_file(tmp_path, b"two").unlink()
    object_file(tmp_path, b"three").write_bytes(b"thre3")
    report = check(None, store, MODEL)
    assert not report.whole
    assert {(f.days, f.problem.split(" (")[0]) for f in report.findings} == {
        (("2024-01-02",), "missing"), (("2024-01-03",), "corrupt: its bytes do not hash to its record")}
    line = next(f.line() for f in report.findings if f.days == ("2024-01-02",))
    assert line.startswith("object rows/date=2024-01-02/part-0.parquet: missing (") and "(needed by day 2024-01-02)" in line


def test_a_corrupt_object_set_aside_is_stored_again_by_the_next_write_of_its_bytes(tmp_path):
    store = LocalVersionStore(tmp_path)
    store.ensure_repository(REPO)
    publish(store, "2024-01-01", b"one")
    object_file(tmp_path, b"one").write_bytes(b"0ne")
    [finding] = [f for f in check(None, store, MODEL).findings]
    aside = store.set_aside(finding.sha256)
    assert Path(aside).read_bytes() == b"0ne"  # kept for a person to look at
    # What a repair's re-ingest does: the same bytes written again; nothing new to commit.
    store.create_branch(REPO, "again")
    store.put_object(REPO, "again", "rows/date=2024-01-01/part-0.parquet", b"one")
    with pytest.raises(NoChanges):
        store.commit(REPO, "again", "again", {})
    assert check(None, store, MODEL).whole


def test_no_repository_yet_is_whole_and_empty(tmp_path):
    report = check(None, LocalVersionStore(tmp_path), MODEL)
    assert report.whole and (report.commits, report.objects) == (0, 0)


def test_the_scheduled_job_is_green_on_a_whole_store_and_fails_naming_what_was_lost(tmp_path):
    import dagster as dg

    from ml_assets.resources import LocalVersionStoreResource, MlflowTrackingResource
    from ml_assets.verification.job import build_verify_job, build_verify_schedule
    from ml_assets_tests.helpers import model_spec

    spec = model_spec(name=MODEL)
    job = build_verify_job(spec, {"ml_assets/model": MODEL})
    schedule = build_verify_schedule(spec, job)
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED  # off until someone turns it on
    store = LocalVersionStore(tmp_path / "store")
    store.ensure_repository(REPO)
    publish(store, "2024-01-01", b"one")
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    defs = dg.Definitions(jobs=[job], resources={
        "version_store": LocalVersionStoreResource(root=str(tmp_path / "store")),
        "tracking": MlflowTrackingResource(tracking_uri=db, artifact_root=str(tmp_path / "artifacts"))})
    run = defs.resolve_job_def(job.name)
    green = run.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert green.success
    assert green.output_for_node(f"{MODEL}_verify_stores") is None

    object_file(tmp_path / "store", b"one").unlink()
    red = run.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not red.success
    [failure] = [e for e in red.all_events if e.is_step_failure]
    reason = failure.step_failure_data.user_failure_data.description
    assert reason.startswith(f"{MODEL}: 1 problem(s) in ") and "object rows/date=2024-01-01/part-0.parquet: missing" in reason
    assert reason.endswith(f"(`ml-assets verify {MODEL} --repair` rebuilds what it can)")


def test_repair_sends_an_object_of_no_one_day_to_a_backup_and_rebuilds_nothing(tmp_path):
    """A repair's limit: no day's ingest writes a dimension table shared by every day, so a lost one
    is named for a restore from a backup, and nothing is ingested or committed in its place."""
    from ml_assets.verification.repair import repair

    store = LocalVersionStore(tmp_path)
    store.ensure_repository(REPO)
    publish(store, "2024-01-01", b"one")
    head = store.log(REPO, "main")[0].id
    object_file(tmp_path, b"shops").unlink()
    report = check(None, store, MODEL)
    assert [(f.subject, f.days) for f in report.findings] == [("object dimensions/shops/part-0.parquet", ())]
    # No settings, spec or registry: a repair that tried to ingest or retrain would fail here.
    lines = repair(None, None, None, store, report, tmp_path / "work")
    assert lines == ["object dimensions/shops/part-0.parquet: not of one day, so no day's ingest rebuilds it; "
                     "restore it from a backup"]
    assert store.log(REPO, "main")[0].id == head and not check(None, store, MODEL).whole
