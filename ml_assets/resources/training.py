import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import dagster as dg


class TrainingPreempted(Exception):
    """The trainer was stopped by SIGTERM and checkpointed: retrying resumes from that checkpoint."""


@dataclass
class TrainingOutcome:
    returncode: int
    result: dg.MaterializeResult | None
    messages: list[dict] = field(default_factory=list)

    @property
    def preempted(self) -> dict | None:
        return next((m for m in self.messages if isinstance(m, dict) and m.get("kind") == "preempted"), None)

    @property
    def progress(self) -> list[dict]:
        return [m for m in self.messages if isinstance(m, dict) and m.get("kind") == "progress"]


class TorchrunLauncher(dg.ConfigurableResource):
    """Runs the trainer as ``torchrun --standalone --nproc_per_node=N --max-restarts=R`` through
    Dagster Pipes. Rank 0 reports; its log lines, progress and result arrive through the session."""

    nproc_per_node: int | None = None
    """Overrides the spec's training.processes_per_node when set."""
    threads_per_process: int = 1
    """OMP/MKL threads per rank: ranks x threads should not exceed the cores."""
    termination_grace_seconds: float = 60.0
    """When Dagster stops the step, how long the trainer gets to checkpoint after SIGTERM."""

    def command(self, config_path: str, nproc: int, max_restarts: int) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={self.nproc_per_node or nproc}", f"--max-restarts={max_restarts}",
            "-m", "ml_assets.trainer.train", "--config", config_path,
        ]

    def run(self, context: dg.AssetExecutionContext, config_path: str, nproc: int, max_restarts: int = 0) -> TrainingOutcome:
        threads = str(self.threads_per_process)
        with dg.open_pipes_session(
            context=context, context_injector=dg.PipesTempFileContextInjector(),
            message_reader=dg.PipesTempFileMessageReader(),
        ) as session:
            env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                   **session.get_bootstrap_env_vars()}
            process = subprocess.Popen(self.command(config_path, nproc, max_restarts), env=env)
            try:
                process.wait()
            except BaseException:
                # The run is being stopped: SIGTERM lets torchrun pass it on; the trainer checkpoints.
                context.log.info("training interrupted: sending SIGTERM so the trainer can checkpoint")
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=self.termination_grace_seconds)
                except subprocess.TimeoutExpired:
                    process.kill()
                raise
        results = session.get_results()
        result = next((r for r in results if isinstance(r, dg.MaterializeResult)), None)
        return TrainingOutcome(process.returncode, result, list(session.get_custom_messages()))
