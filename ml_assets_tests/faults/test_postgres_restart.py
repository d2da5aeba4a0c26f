"""PostgreSQL killed and started again under the production instance's storage: a private cluster
(pg_ctl, its own port), never the shared server."""

import pytest

from ml_assets_tests.production.conftest import POSTGRES

pytestmark = pytest.mark.skipif(not POSTGRES, reason="ML_ASSETS_TEST_POSTGRES_URL is not set")


def test_after_a_crash_the_webservers_pool_reconnects_instead_of_failing_requests():
    from ml_assets.deploy.pg_storage import PooledPostgresStorage
    from ml_assets_tests.faults.services import PrivateCluster

    cluster = PrivateCluster()
    try:
        cluster.start()
        cluster.create_database("dagster")
        storage = PooledPostgresStorage(cluster.url("dagster", driver="psycopg2"))  # as production configures it
        storages = (storage.run_storage, storage.event_log_storage, storage.schedule_storage)
        for part in storages:  # what dagster-webserver asks of each storage at its start
            part.optimize_for_webserver(statement_timeout=5000, pool_recycle=3600, max_overflow=2)
        assert storage.run_storage.get_runs() == []  # each pool now holds a live connection
        storage.event_log_storage.get_asset_records()
        cluster.kill()
        cluster.start()
        # The connections the pools kept died with the server: each is checked before use and replaced.
        assert storage.run_storage.get_runs() == []
        assert storage.event_log_storage.get_asset_records() == []
        assert storage.schedule_storage.all_instigator_state() == []
    finally:
        cluster.stop()


def test_a_call_while_the_server_is_down_waits_for_it_saying_so_and_past_the_bound_names_it(monkeypatch, capfd):
    import threading

    from ml_assets.deploy.pg_storage import DatabaseUnavailable, PooledPostgresStorage
    from ml_assets_tests.faults.services import PrivateCluster

    cluster = PrivateCluster()
    try:
        cluster.start()
        cluster.create_database("dagster")
        storage = PooledPostgresStorage(cluster.url("dagster", driver="psycopg2"))
        assert storage.run_storage.get_runs() == []
        cluster.kill()
        # Longer than dagster-postgres's own retries (about 6 s): those alone failed the call.
        threading.Timer(8, cluster.start).start()
        assert storage.run_storage.get_runs() == []  # waited, then answered
        waits = [line for line in capfd.readouterr().err.splitlines() if "not answering" in line]
        assert waits and waits[0].startswith(f"[ml_assets] WARNING PostgreSQL at 127.0.0.1:{cluster.port}/dagster "
                                             "not answering ("), waits
        assert "retry 1 of 6 in 1 s" in waits[0]

        monkeypatch.setenv("ML_ASSETS_DB_RETRIES", "1")
        cluster.kill()
        with pytest.raises(DatabaseUnavailable) as raised:
            storage.event_log_storage.get_asset_records()
        assert str(raised.value).startswith(f"PostgreSQL at 127.0.0.1:{cluster.port}/dagster did not answer "
                                            "(1 retries over ~1 s): ")
    finally:
        cluster.stop()


def test_a_server_that_answers_no_is_not_waited_for():
    import sqlalchemy

    from ml_assets.deploy.pg_storage import connect_patiently, pooled_engine
    from ml_assets_tests.faults.services import PrivateCluster

    cluster = PrivateCluster()
    try:
        cluster.start()  # up, but the database is not there: a configuration to fix, not an outage
        slept: list[float] = []
        engine = pooled_engine(cluster.url("no_such_db", driver="psycopg2"))
        with pytest.raises(sqlalchemy.exc.OperationalError, match='database "no_such_db" does not exist'):
            connect_patiently(engine, "here", sleep=slept.append)
        assert slept == []
        cluster.kill()  # down: waited for, as many times as the bound allows
        with pytest.raises(Exception, match="did not answer"):
            connect_patiently(engine, "here", sleep=slept.append)
        assert slept == [1, 2, 4, 8, 16, 30]
    finally:
        cluster.stop()
