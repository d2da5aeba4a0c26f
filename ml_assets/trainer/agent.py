"""torchrun's agent, tied to the process that started it: ``python -m ml_assets.trainer.agent``
takes torchrun's own arguments (``--standalone --nproc_per_node=2 -m ml_assets.trainer --config
CONFIG``) and runs torchrun in this process.

Two things plain torchrun lacks: it ends when the process that started it (the Dagster step, a tuning
worker) dies, however that died (ml_assets.processes: SIGTERM, on which torchrun stops its workers,
which checkpoint and exit); and it names itself to its workers as their parent, so that a rank that
starts after the agent was already killed notices at once instead of training on as init's child.
Stdlib and torch only, like the trainer.
"""

from __future__ import annotations

import os
import sys

from ml_assets import processes

GRACE_SECONDS = 60.0
"""After the parent dies: torchrun gives its workers 30 s after SIGTERM before killing them; this is
the backstop if its shutdown itself hangs."""


def main(argv: list[str] | None = None) -> None:
    processes.follow_parent(grace_seconds=GRACE_SECONDS)
    os.environ[processes.PARENT_ENV] = processes.parent_token()  # torchrun copies it to every worker
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
