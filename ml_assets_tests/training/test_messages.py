"""The training step's Pipes reader hands on whole lines only (ml_assets.training.messages)."""

import json
import threading
import time

import dagster as dg

from ml_assets.training.messages import TempFileMessageReader, whole_lines


def test_a_line_read_while_it_is_being_written_is_handed_on_once_whole(tmp_path):
    path = tmp_path / "messages"
    path.write_text("")
    message = json.dumps({"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "x" * 5000}}) + "\n"
    done = threading.Event()

    def writer():  # as a buffered writer or a page boundary splits a line: two writes, apart
        with open(path, "a", encoding="utf-8") as fh:
            for _ in range(3):
                fh.write(message[:10])
                fh.flush()
                time.sleep(0.2)
                fh.write(message[10:])
                fh.flush()
        with open(path, "a", encoding="utf-8") as fh:
            fh.write('{"cut": ')  # a writer killed mid-line: its part comes last, as it is
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    lines = list(whole_lines(str(path), done.is_set))
    thread.join()
    assert lines == [message] * 3 + ['{"cut": ']


def test_lines_written_just_before_the_stop_are_still_read(tmp_path):
    # The race Dagster's tail_file has (seen failing in CI): the reader finds the file empty, the
    # trainer's last lines land and the session closes, then the reader asks whether to stop.
    path = tmp_path / "messages"
    path.write_text("")
    lines = ['{"method": "report_asset_materialization"}\n', '{"method": "closed"}\n']

    def stop_after_the_last_write():
        if path.stat().st_size == 0:
            path.write_text("".join(lines))
        return True

    assert list(whole_lines(str(path), stop_after_the_last_write)) == lines


def test_messages_reach_the_step_through_the_reader(tmp_path):
    # The real Pipes session: what a trainer writes to the file the reader names becomes the step's.
    @dg.asset
    def trained(context: dg.AssetExecutionContext):
        with dg.open_pipes_session(context=context, message_reader=TempFileMessageReader(),
                                   context_injector=dg.PipesTempFileContextInjector()) as session:
            path = session.message_reader_params["path"]
            with open(path, "a", encoding="utf-8") as fh:
                for method, params in (("opened", {}), ("report_asset_materialization",
                                                          {"asset_key": "trained", "data_version": None,
                                                           "metadata": {"rows": {"raw_value": 7, "type": "int"}}}),
                                       ("closed", {})):
                    fh.write(json.dumps({"__dagster_pipes_version": "0.1", "method": method, "params": params}) + "\n")
        yield from session.get_results()

    result = dg.materialize([trained], instance=dg.DagsterInstance.ephemeral())
    assert result.success
    (materialization,) = result.asset_materializations_for_node("trained")
    assert materialization.metadata["rows"] == dg.IntMetadataValue(7)
