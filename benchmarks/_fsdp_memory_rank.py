"""One rank of ``benchmarks.fsdp_memory``: the platform's Trainer, run by torchrun as the trainer
is, with a probe after every optimizer step. torchrun runs this module in place of
``-m ml_assets.trainer``::

    python -m ml_assets.trainer.agent --standalone --nproc_per_node=2 -m benchmarks._fsdp_memory_rank \\
        CONFIG OUT_JSON

The probe (an optimizer step post-hook: after the step, before the gradients are zeroed, the moment
all three are held) adds up the bytes this rank holds of parameters, gradients and AdamW state:
each tensor's local shard (a DTensor's ``to_local()``, a plain tensor itself), numel * element size.
Each step's loss (summed over all ranks' rows, divided by their count) is recorded through the
progress report the loop makes every ``report_every_steps`` steps. Rank 0 writes both, with every
rank's figures, peak RSS, rows trained and training-loop seconds, to OUT_JSON.
"""

from __future__ import annotations

import gc
import json
import resource
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.loop import Trainer
from ml_assets.trainer.runtime import StopSignal, compute_cleanup, compute_init


def held(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


class ProbedTrainer(Trainer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []
        self.peak = {"params": 0, "grads": 0, "optimizer": 0, "total": 0}
        self.rss_kib = 0
        self.optimizer.register_step_post_hook(self._measure)

    def _measure(self, optimizer: torch.optim.Optimizer, *_) -> None:
        params = list(self.model.parameters())
        now = {"params": sum(held(p) for p in params),
               "grads": sum(held(p.grad) for p in params if p.grad is not None),
               "optimizer": sum(held(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))}
        now["total"] = sum(now.values())
        if now["total"] > self.peak["total"]:
            self.peak = now
        # Peak RSS so far: read here, before the run's final checkpoint stages a copy of the state.
        self.rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def _report_progress(self, interval: dict) -> None:
        loss, rows = self._reduce([interval["loss"], interval["rows"]])
        self.losses.append(loss / rows)
        super()._report_progress(interval)


def main(config: str, out: str) -> None:
    cfg = TrainConfig.from_json(config)
    rt = compute_init()
    say = (lambda m: print(f"[rank 0] {m}", file=sys.stderr, flush=True)) if rt.master else (lambda m: None)
    trainer = ProbedTrainer(cfg, rt, say, lambda _: None)
    try:
        trainer.run(StopSignal(cfg.preemption_grace_seconds, say))
    finally:
        trainer._prefetcher.shutdown(cancel_futures=True)
        trainer.ckpt.close()
    mine = {**trainer.peak, "rss_mib": trainer.rss_kib / 1024, "rows": trainer.stats["rows"],
            "loop_s": trainer.stats["loop_s"]}
    ranks: list[dict] = [{} for _ in range(rt.world)]
    dist.all_gather_object(ranks, mine)
    if rt.master:
        n_params = sum(p.numel() for p in trainer.model.parameters())  # a DTensor's numel is its global one
        with open(out, "w") as fh:
            json.dump({"strategy": cfg.strategy, "parameters": n_params, "losses": trainer.losses, "ranks": ranks}, fh)
    del trainer
    gc.collect()  # DDP's reducer goes before the process group (as in ml_assets.trainer.train)
    compute_cleanup()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
