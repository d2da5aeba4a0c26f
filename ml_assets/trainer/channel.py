"""Rank 0's voice: Dagster Pipes when a Dagster step started the training, stderr otherwise. The
other ranks stay silent, so the step sees one log and one result, save for one thing: a rank that
stops the training for a reason a restart cannot fix (``refuse``) says so itself, since the fault
may be its alone. dagster_pipes is the trainer's only non-torch dependency, and it is opened on
rank 0 alone."""

from __future__ import annotations

import os
import sys
import traceback

from dagster_pipes import (
    PIPES_PROTOCOL_VERSION,
    PIPES_PROTOCOL_VERSION_FIELD,
    PipesEnvVarParamsLoader,
    PipesFileMessageWriterChannel,
    open_dagster_pipes,
)

from ml_assets.trainer.runtime import restarts_left


class Channel:
    """Logs, warnings and custom messages of one rank, sent only by rank 0."""

    def __init__(self, master: bool) -> None:
        self.master = master
        # Only rank 0 may talk to Dagster: if every rank reported, the step would see several results.
        self.pipes = open_dagster_pipes() if master and PipesEnvVarParamsLoader().is_dagster_pipes_process() else None

    def log(self, message: str) -> None:
        if self.master:
            self.pipes.log.info(message) if self.pipes is not None else print(f"[trainer] {message}", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        if self.master:
            self.pipes.log.warning(message) if self.pipes is not None else print(f"[trainer] WARNING {message}", file=sys.stderr, flush=True)

    def report(self, payload: dict) -> None:
        if self.pipes is not None:
            self.pipes.report_custom_message(payload)

    def refuse(self, message: str, rank: int) -> None:
        """Any rank: the training stops for ``message``, which no restart fixes. Rank 0 reports it as
        always; another rank prints it and, under Pipes, appends the same report to the step's
        message file itself (one line, appended whole: the file is the session's, and no other
        message of this rank goes there), so the step's failure names it whichever rank met it."""
        payload = {"kind": "refused", "message": message if self.master else f"rank {rank}: {message}"}
        if self.master:
            self.warn(message)
            self.report(payload)
            return
        print(f"[trainer rank {rank}] {message}", file=sys.stderr, flush=True)
        loader = PipesEnvVarParamsLoader()
        if not loader.is_dagster_pipes_process():
            return
        path = loader.load_messages_params().get("path")
        if path:  # a temp-file reader (TorchrunLauncher's); other readers hear only rank 0
            PipesFileMessageWriterChannel(path).write_message({
                PIPES_PROTOCOL_VERSION_FIELD: PIPES_PROTOCOL_VERSION, "method": "report_custom_message",
                "params": {"payload": payload}})

    def failed(self, exc: BaseException) -> None:
        """Called while ``exc`` is being handled, before it is re-raised: under Pipes, either the rank
        exits at once for torchrun to restart, or the session closes with the error."""
        if self.pipes is not None and restarts_left():
            # torchrun will start this rank again and it resumes; closing Pipes now would make
            # Dagster drop everything the restarted rank 0 reports. Leave the session open.
            self.warn(f"rank 0 failed ({type(exc).__name__}: {exc}); torchrun restarts it "
                      f"({restarts_left()} restart(s) left) and it resumes from the last checkpoint")
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        if self.pipes is not None:
            self.pipes.__exit__(type(exc), exc, exc.__traceback__)  # Dagster shows the error
            self.pipes = None

    def close(self) -> None:
        if self.pipes is not None:
            self.pipes.close()
