"""Waits on the MLflow server made visible: each retry of a request to it is a line in the step's log.

MLflow's client retries a request that finds its server down (7 times, backing off 2, 4, ... 64 s:
about two minutes by default; MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR
bound it). It does so inside urllib3 and says nothing, so a step waiting on a dead server looked
hung. urllib3 records each retry on its ``urllib3.util.retry`` logger (at DEBUG); a handler there
turns the retries of MLflow's API calls into "MLflow at ... not answering (...); retry 3 of 7 in
~8 s" on Dagster's logger, which a step's event log captures (and which prints outside a run).
Past the bound MLflow raises its error, which names the server, and the step fails with it.
"""

from __future__ import annotations

import logging
import threading

RETRY_LOGGER = "urllib3.util.retry"
_API_PATHS = ("/api/2.0/mlflow", "/api/3.0/mlflow", "/ajax-api/")  # the first covers /api/2.0/mlflow-artifacts
_lock = threading.Lock()
_handler: RetryLines | None = None


class RetryLines(logging.Handler):
    """Says each retry of a request to the MLflow server at ``where``."""

    def __init__(self, where: str, logger: logging.Logger) -> None:
        super().__init__(logging.DEBUG)
        self.where, self.logger = where, logger
        self.passes = logger.getEffectiveLevel()
        """The level the logger had: what reached other handlers before, and still does."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.line(record)
            if line:
                import dagster as dg

                dg.get_dagster_logger("ml_assets").warning(line)
        except Exception:  # logging must never break the request it reports on
            self.handleError(record)
        if record.levelno >= self.passes and self.logger.parent is not None:
            self.logger.parent.handle(record)

    def line(self, record: logging.LogRecord) -> str | None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 2 or not str(args[0]).startswith(_API_PATHS):
            return None
        retry = args[1]
        history = getattr(retry, "history", ())
        if not history:
            return None
        done, left = len(history), getattr(retry, "total", None)
        bound = f" of {done + left}" if isinstance(left, int) and not isinstance(left, bool) else ""
        last = history[-1]
        cause = f"HTTP {last.status}" if last.status else _short(last.error)
        factor, cap = getattr(retry, "backoff_factor", 0) or 0, getattr(retry, "backoff_max", 120)
        wait = 0.0 if done <= 1 else min(cap, factor * 2 ** (done - 1))
        return f"MLflow at {self.where} not answering ({cause}); retry {done}{bound} in ~{wait:.0f} s"


def _short(error: object) -> str:
    """urllib3's error without the connection it starts with ("HTTPConnection(host=..., port=...): ")."""
    text = str(error) if error is not None else "no answer"
    return text.split("): ", 1)[-1][:300]


def say_mlflow_retries(where: str) -> None:
    """Install (once per process; a later call updates the address) the handler for the MLflow
    server at ``where`` (shown as given: pass it without credentials)."""
    global _handler
    with _lock:
        if _handler is None:
            logger = logging.getLogger(RETRY_LOGGER)
            _handler = RetryLines(where, logger)
            logger.addHandler(_handler)
            # urllib3 logs retries at DEBUG. The records this level lets through go to the handler
            # alone, which passes on what the logger's level let through before.
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
        else:
            _handler.where = where
