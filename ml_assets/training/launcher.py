import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import dagster as dg

from ml_assets import processes
from ml_assets.trainer import zygote
from ml_assets.training.messages import TempFileMessageReader

# What a training runs in its own processes (torchrun's agent and each rank's trainer): part of the
# code versions of the stages that train.
TRAINER_ROOTS = ("ml_assets.trainer.__main__", "ml_assets.trainer.agent", "ml_assets.trainer.forked")


class TrainingPreempted(Exception):
    """The trainer was stopped by SIGTERM and checkpointed: retrying resumes from that checkpoint."""


@dataclass
class TrainingOutcome:
    returncode: int
    result: dg.MaterializeResult | None
    messages: list[dict] = field(default_factory=list)

    def _of_kind(self, kind: str) -> list[dict]:
        return [m for m in self.messages if isinstance(m, dict) and m.get("kind") == kind]

    @property
    def preempted(self) -> dict | None:
        return next(iter(self._of_kind("preempted")), None)

    @property
    def lease_held(self) -> dict | None:
        """The trainer's report that another training holds the checkpoint directory's lease."""
        return next(iter(self._of_kind("lease_held")), None)

    @property
    def refused(self) -> dict | None:
        """The trainer's report that its input cannot be trained (a model factory that breaks its contract)."""
        return next(iter(self._of_kind("refused")), None)

    @property
    def progress(self) -> list[dict]:
        return self._of_kind("progress")


class TorchrunLauncher(dg.ConfigurableResource):
    """Runs the trainer as ``torchrun --standalone --nproc_per_node=N --max-restarts=R`` through
    Dagster Pipes. Rank 0 reports; its log lines, progress and result arrive through the session.

    torchrun runs as ``ml_assets.trainer.agent``, which follows this process: if the step dies
    (SIGKILL, out of memory), torchrun stops its ranks instead of training on without it."""

    nproc_per_node: int | None = None
    """Overrides the spec's training.processes_per_node when set."""
    threads_per_process: int = 1
    """OMP/MKL threads per rank: ranks x threads should not exceed the cores."""
    termination_grace_seconds: float = 60.0
    """When Dagster stops the step, how long the trainer gets to checkpoint after SIGTERM."""
    rank_start: str = "fork"
    """``fork``: each rank is forked from the trainer zygote, which imported the trainer's libraries
    once (ml_assets.trainer.zygote; a rank then starts in milliseconds instead of seconds);
    ``exec``: each rank is a new Python process that imports them itself."""

    @property
    def spreads_nodes(self) -> bool:
        """Whether training.nodes > 1 really runs on several machines (Kubernetes) or on this one."""
        return False

    def processes(self, spec) -> int:
        """torchrun's processes per node for ``spec`` (locally: the spec's CPU processes)."""
        return self.nproc_per_node or spec.training.processes_per_node

    def train(self, context: dg.AssetExecutionContext, spec, config_path: str, output_dir: str) -> TrainingOutcome:
        """Train ``spec``'s model with the config at ``config_path`` (outputs under ``output_dir``).
        Locally one node, whatever ``training.nodes`` says (ml_assets.training.k8s_launch spreads them)."""
        if spec.training.nodes > 1:
            context.log.warning(f"training.nodes is {spec.training.nodes}: several nodes are a Kubernetes setting "
                                f"(docs/kubernetes.md); here the run trains on this machine with "
                                f"{self.processes(spec)} processes")
        return self.run(context, config_path, self.processes(spec), spec.training.max_restarts)

    def command(self, config_path: str, nproc: int, max_restarts: int, forked: bool = False) -> list[str]:
        """The torchrun command; ``forked``: its workers ask the zygote for their ranks."""
        return [
            sys.executable, "-m", "ml_assets.trainer.agent", "--standalone",
            f"--nproc_per_node={self.nproc_per_node or nproc}", f"--max-restarts={max_restarts}",
            "-m", "ml_assets.trainer.forked" if forked else "ml_assets.trainer", "--config", config_path,
        ]

    def _launch(self, env: dict[str, str], config_path: str, nproc: int, max_restarts: int) -> tuple[list[str], dict]:
        """The command and environment of one launch: with the zygote's socket when ranks fork."""
        if self.rank_start not in zygote.RANK_STARTS:
            raise ValueError(f"TorchrunLauncher: rank_start {self.rank_start!r} is not one of {list(zygote.RANK_STARTS)}")
        threads = str(self.threads_per_process)
        env = processes.child_env({**env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        socket_path = zygote.address() if self.rank_start == "fork" else None
        if socket_path:
            env[zygote.SOCKET_ENV] = socket_path
        return self.command(config_path, nproc, max_restarts, forked=bool(socket_path)), env

    def run(self, context: dg.AssetExecutionContext, config_path: str, nproc: int, max_restarts: int = 0) -> TrainingOutcome:
        with dg.open_pipes_session(
            context=context, context_injector=dg.PipesTempFileContextInjector(),
            message_reader=TempFileMessageReader(),
        ) as session:
            command, env = self._launch({**os.environ, **session.get_bootstrap_env_vars()}, config_path, nproc,
                                        max_restarts)
            process = subprocess.Popen(command, env=env)
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

    def run_plain(self, config_path: str, nproc: int, max_restarts: int = 0) -> TrainingOutcome:
        """The same torchrun command outside a Dagster step (a notebook, a script, a benchmark's baseline):
        no Pipes; the result is read from the ``report.json`` rank 0 writes beside the export."""
        import fsspec

        from ml_assets.trainer.config import TrainConfig
        from ml_assets.trainer.report import REPORT_FILE

        output_dir = TrainConfig.from_json(config_path).output_dir.rstrip("/")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES_")}  # never a Pipes process
        command, env = self._launch(env, config_path, nproc, max_restarts)
        returncode = subprocess.run(command, env=env).returncode
        result = None
        if returncode == 0:
            with fsspec.open(f"{output_dir}/{REPORT_FILE}", "r") as fh:
                report = json.load(fh)
            result = dg.MaterializeResult(metadata=metadata_from_pipes(report["metadata"]),
                                          data_version=dg.DataVersion(report["data_version"]))
        return TrainingOutcome(returncode, result)


def metadata_from_pipes(metadata: dict) -> dict:
    """Pipes' metadata form (typed values as ``{"raw_value": ..., "type": ...}``) as Dagster metadata."""
    typed = {"path": dg.MetadataValue.path, "json": dg.MetadataValue.json, "url": dg.MetadataValue.url,
             "md": dg.MetadataValue.md, "text": dg.MetadataValue.text}
    out = {}
    for name, value in metadata.items():
        if isinstance(value, dict) and set(value) == {"raw_value", "type"}:
            convert = typed.get(value["type"])
            if convert is None:
                raise ValueError(f"training report: metadata {name!r} has type {value['type']!r}, not one of {sorted(typed)}")
            value = convert(value["raw_value"])
        out[name] = value
    return out
