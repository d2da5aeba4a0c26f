"""A step waiting on an MLflow server that does not answer says so on every retry, in its event log,
and fails past the bound naming the server; against a real MLflow client and a closed port."""

import logging
import socket

import dagster as dg

from ml_assets.resources import MlflowTrackingResource
from ml_assets.resources.retries import RETRY_LOGGER


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_each_retry_of_a_dead_mlflow_server_is_a_line_and_the_step_fails_naming_it(monkeypatch):
    port = closed_port()
    for name, value in (("MAX_RETRIES", "3"), ("BACKOFF_FACTOR", "0"), ("BACKOFF_JITTER", "0")):
        monkeypatch.setenv(f"MLFLOW_HTTP_REQUEST_{name}", value)

    @dg.asset
    def reads_the_registry(tracking: MlflowTrackingResource) -> None:
        tracking.experiment_id("m")

    tracking = MlflowTrackingResource(tracking_uri=f"http://ml:s3cret@127.0.0.1:{port}", artifact_root="")
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([reads_the_registry], resources={"tracking": tracking}, raise_on_error=False,
                            instance=instance)
    assert not result.success
    # In the run's event log (what the UI and `dagster` show), each with the step's key.
    entries = [e for e in instance.all_logs(result.run_id) if "not answering" in e.user_message]
    assert {e.step_key for e in entries} == {"reads_the_registry"}
    lines = [e.user_message for e in entries]
    assert lines == [f"MLflow at http://127.0.0.1:{port} not answering (Failed to establish a new connection: "
                     f"[Errno 111] Connection refused); retry {n} of 3 in ~0 s" for n in (1, 2, 3)]
    [failure] = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    while error.cause is not None:
        error = error.cause
    assert f"127.0.0.1:{port}" in error.message and "Max retries exceeded" in error.message


def test_what_the_retry_logger_let_through_before_still_reaches_other_handlers():
    """The handler lowers the logger's level to see urllib3's DEBUG retries; records below the level
    it had are not passed on, so a root handler sees no new debug lines, and the rest once each."""
    MlflowTrackingResource(tracking_uri="http://127.0.0.1:1", artifact_root="").client()
    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == RETRY_LOGGER:
                seen.append(record.getMessage())

    root, handler = logging.getLogger(), Seen()
    root.addHandler(handler)
    try:
        logger = logging.getLogger(RETRY_LOGGER)
        logger.debug("Converted retries value: %r -> %r", 3, 3)
        logger.warning("a warning urllib3 logs here")
    finally:
        root.removeHandler(handler)
    assert seen == ["a warning urllib3 logs here"]
