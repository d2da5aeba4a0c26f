"""The production instance's storage: dagster-postgres with a small connection pool in each process.

dagster-postgres opens a new PostgreSQL connection for every storage call (SQLAlchemy's NullPool,
so idle processes hold none); only the webserver switches to a pool. A run worker writes every
event of its run, each one or more calls, and most of a call's time is connecting (a TCP
handshake, a backend process forked by PostgreSQL). This class is the same storage with a
pool of one kept connection per process, more opened while threads need them (a run worker's
Pipes reader logs beside its main thread; the daemon runs several threads) and closed when
returned. A connection is checked before use (pre-ping), so a restarted server costs a reconnect,
not a failed run.

A server that does not answer is waited for when a connection is taken, visibly and within a bound
(1, 2, 4, 8, 16, 30 s: about a minute; ``ML_ASSETS_DB_RETRIES`` sets the number of retries), each
wait a warning on the process's stderr ("PostgreSQL at host:5432/dagster not answering (…); retry
2 of 6 in 2 s"): dagster-postgres's own retries give up after about 6 s, so a server restarting
failed whatever run was writing an event then. Past the bound: "PostgreSQL at … did not answer …".
Only taking a connection is retried; a statement a dying server dropped fails as it would. The
waits are not logged through Dagster: its event log is this database.

ml_assets/instance/production.yaml selects it (``storage: custom``) with the same configuration as
``storage: postgres``. The webserver replaces these pools with its own (``optimize_for_webserver``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from typing import Any

from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
)

POOL_SIZE = 1  # connections kept open per process and storage (runs, event log, schedules)
MAX_OVERFLOW = 10  # more, opened while concurrent threads need them and closed when returned
RECYCLE_SECONDS = 3600


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` whose run, event-log and schedule storages keep a connection."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True,
                 inst_data: ConfigurableClassData | None = None, token_provider: Any = None):
        super().__init__(postgres_url, should_autocreate_tables, inst_data=inst_data, token_provider=token_provider)
        for storage in (self._run_storage, self._event_log_storage, self._schedule_storage):
            options = storage._engine.url.query.get("options")
            storage._engine.dispose()  # NullPool: holds no connection, disposing only drops the engine
            storage._engine = pooled_engine(storage.postgres_url, options, token_provider)
            # The instance asks each storage itself (not this class) to switch to the webserver's pool.
            storage.optimize_for_webserver = functools.partial(_webserver_pool, storage)
            # Every storage call takes its connection here (dagster-postgres: ``connect`` or ``_connect``).
            patient = functools.partial(_patient_connection, storage)
            for name in ("connect", "_connect"):
                if hasattr(storage, name):
                    setattr(storage, name, patient)

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> PooledPostgresStorage:
        return cls(postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   inst_data=inst_data, token_provider=get_token_provider_from_config(config_value))


def _webserver_pool(storage: Any, statement_timeout: int, pool_recycle: int, max_overflow: int) -> None:
    """dagster-postgres's pool for the webserver (its sizes, its statement timeout), with each
    connection checked before use: without the check, after PostgreSQL restarted, the webserver's
    next requests failed on the dead connections it kept (a run submitted then was refused)."""
    from dagster_postgres.utils import set_pg_statement_timeout
    from sqlalchemy import event

    options = storage._engine.url.query.get("options")
    storage._engine.dispose()
    storage._engine = pooled_engine(storage.postgres_url, options, storage._token_provider, pool_size=1,
                                    max_overflow=max_overflow, pool_recycle=pool_recycle)
    event.listen(storage._engine, "connect",
                 lambda connection, _: set_pg_statement_timeout(connection, statement_timeout))


def pooled_engine(postgres_url: str, options: str | None = None, token_provider: Any = None,
                  pool_size: int = POOL_SIZE, max_overflow: int = MAX_OVERFLOW, pool_recycle: int = RECYCLE_SECONDS):
    kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_size": pool_size, "max_overflow": max_overflow,
                              "pool_recycle": pool_recycle, "pool_pre_ping": True}
    if options:  # as dagster-postgres's own optimize_for_webserver passes them
        kwargs["connect_args"] = {"options": options}
    return create_pg_engine(postgres_url, token_provider, **kwargs)


DB_RETRIES_VARIABLE = "ML_ASSETS_DB_RETRIES"
DEFAULT_DB_RETRIES = 6


NOT_ANSWERING = ("connection refused", "could not connect", "server closed the connection", "connection reset",
                 "connection timed out", "timeout expired", "no route to host", "ssl syscall error",
                 "the database system is starting up", "the database system is shutting down",
                 "the database system is in recovery mode", "terminating connection", "connection already closed")
"""What a server that is down, starting or restarting makes the driver say (lowercase): waited for.
Anything else (authentication, a database or role that does not exist) fails at once."""


class DatabaseUnavailable(Exception):
    """PostgreSQL did not answer within the bound; the message names the server and the last error."""


def where(postgres_url: str) -> str:
    """host:port/database of a PostgreSQL URL, without its credentials."""
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url)
    return f"{url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"


@contextlib.contextmanager
def _patient_connection(storage: Any, *_args: Any, **_kwargs: Any):
    connection = connect_patiently(storage._engine, where(storage.postgres_url))
    try:
        yield connection
    finally:
        connection.close()


def connect_patiently(engine: Any, place: str, sleep=time.sleep):
    """``engine.connect()``, tried again while the server does not answer (see the module's docstring)."""
    import sqlalchemy

    from ml_assets.storage import waits

    value = os.environ.get(DB_RETRIES_VARIABLE, "")
    bound = int(value) if value.isdigit() else DEFAULT_DB_RETRIES
    for attempt in range(bound + 1):
        try:
            return engine.connect()
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
            reason = " ".join(str(exc.orig if exc.orig is not None else exc).split())[:300]
            if not any(marker in reason.lower() for marker in NOT_ANSWERING):
                raise  # it answered, and said no (a password, a database that does not exist): at once
            if attempt == bound:
                raise DatabaseUnavailable(f"PostgreSQL at {place} did not answer ({bound} retries over "
                                          f"~{sum(waits(bound)):.0f} s): {reason}") from exc
            wait = waits(bound)[attempt]
            line = f"PostgreSQL at {place} not answering ({reason}); retry {attempt + 1} of {bound} in {wait:.0f} s"
            # stderr alone: a logging call here would reach stderr a second time through logging's
            # last-resort handler in a process that configured none.
            print(f"[ml_assets] WARNING {line}", file=sys.stderr, flush=True)
            sleep(wait)
    raise AssertionError("unreachable")
