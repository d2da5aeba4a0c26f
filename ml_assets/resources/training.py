import sys

import dagster as dg


class TorchrunLauncher(dg.ConfigurableResource):
    """Launches the trainer as ``torchrun --standalone --nproc_per_node=N`` through Dagster Pipes."""

    nproc_per_node: int | None = None
    """Overrides the spec's training.processes_per_node when set."""
    threads_per_process: int = 1
    """OMP/MKL threads per rank: ranks x threads should not exceed the cores."""

    def command(self, config_path: str, nproc: int) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={self.nproc_per_node or nproc}",
            "-m", "ml_assets.trainer.train", "--config", config_path,
        ]

    def run(self, context: dg.AssetExecutionContext, config_path: str, nproc: int) -> dg.MaterializeResult:
        threads = str(self.threads_per_process)
        invocation = dg.PipesSubprocessClient().run(
            context=context,
            command=self.command(config_path, nproc),
            env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads},
        )
        return invocation.get_materialize_result()
