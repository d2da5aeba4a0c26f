"""The training step's Pipes message reader: Dagster's file reader, reading whole lines only.

Dagster's ``PipesFileMessageReader`` tails the message file with ``readline()`` and parses whatever
it returns. A line the trainer is still appending comes back cut short when the read lands mid-write
(a message longer than the writer's 8 KiB buffer is several writes; a shorter one that crosses a
page boundary becomes visible a page at a time). The parse fails, the reader thread dies, and every
later message of the training is lost: a training that went on to finish failed its step with "did
not receive closed message" and was trained again by the retry (seen in a full test run). Here a
line is handed on only once its newline has arrived, and the file is read to its end after the
session closes (Dagster's reader asks whether to stop after an empty read, so lines landing between
the two were dropped: seen in CI).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dagster as dg

POLL_SECONDS = 0.01


def whole_lines(path: str, should_stop: Callable[[], bool]) -> Iterator[str]:
    """The lines appended to ``path`` until ``should_stop()``, each only once it is complete; a last
    line left without its newline (its writer killed mid-write) comes last, as it is."""
    pending = ""
    with open(path, encoding="utf-8") as stream:
        while True:
            # Asked before reading: a stop set between an empty read and the question would lose
            # what was written just before it (the trainer's last messages, "closed" among them).
            stopping = should_stop()
            part = stream.readline()
            if part:
                pending += part
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif stopping:
                break
            else:
                time.sleep(POLL_SECONDS)
    if pending.strip():
        yield pending


class WholeLineFileMessageReader(dg.PipesFileMessageReader):
    def _reader_thread(self, handler, is_resource_complete) -> None:
        try:
            for line in whole_lines(self._path, is_resource_complete.is_set):
                handler.handle_message(json.loads(line))
        except BaseException:
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise


class TempFileMessageReader(dg.PipesMessageReader):
    """``dg.PipesTempFileMessageReader`` with whole lines: the messages go through a file in a
    temporary directory of their own."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory() as tempdir, \
                WholeLineFileMessageReader(os.path.join(tempdir, "messages")).read_messages(handler) as params:
            yield params

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file."
