import subprocess
import sys

import dagster as dg

from ml_assets.processes import child_env


class TuningResource(dg.ConfigurableResource):
    """Where tuning studies live: the Optuna storage URL (a secret when it is PostgreSQL: from the
    environment, ``ML_ASSETS_OPTUNA_STORAGE``) and a working directory for the trials. Trial workers
    are local processes (ml_assets.tuning.k8s_job makes them pods)."""

    storage_url: str
    workdir: str
    threads_per_process: int = 1

    def is_sqlite(self) -> bool:
        return self.storage_url.startswith("sqlite")

    def run_workers(self, context: dg.AssetExecutionContext, spec, job, workers: int) -> list[int]:
        """Run ``workers`` trial workers of ``job`` (ml_assets.tuning.study.Job) until the study has its
        trials; their exit codes. Stopping the step stops them (their running trials' trainers too)."""
        from pathlib import Path

        path = job.write(Path(job.workdir) / "job.json")
        # Each worker follows this step process (ml_assets.processes): killed with it, they end too.
        env = child_env()
        processes = [subprocess.Popen([sys.executable, "-m", "ml_assets.tuning.study", str(path)], env=env)
                     for _ in range(workers)]
        try:
            return [p.wait() for p in processes]
        except BaseException:
            for p in processes:
                p.terminate()
            for p in processes:
                p.wait()
            raise
