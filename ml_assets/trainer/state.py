"""A rank's training state as a checkpoint holds it, and how a training resumes from one.

The tensors (model, optimizer moments, every rank's RNG) go into torch.distributed.checkpoint with
the same keys on every rank; everything else is the Progress JSON beside them. Resuming fills the
model and optimizer in place from the newest verified checkpoint; on a different number of ranks the
data order and weights carry over and dropout's random stream is reseeded.

Under FSDP the same code holds sharded state: FSDP2 keeps the bare model's parameter names, and the
parameters and AdamW moments are DTensors that carry their global shape, so the keys are the same,
each rank writes only its shard, and loading fills each rank's shard (from however many ranks wrote
it: DCP reshards). The whole model exists only in the exports (``full_state_dict``)."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from ml_assets.trainer.checkpoint import CheckpointError
from ml_assets.trainer.progress import Progress
from ml_assets.trainer.setup import TrainerSetup


class CheckpointedTrainer(TrainerSetup):
    """Saves the training state at a step, and restores it from the newest checkpoint."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Model, optimizer and RNG state: tensors only, the same keys on every rank."""
        out = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for index, entries in self.optimizer.state_dict()["state"].items():
            for key, value in entries.items():
                out[f"optim.{self.param_names[index]}.{key}"] = value
        rng = torch.get_rng_state()
        if self.rt.world > 1:
            gathered = [torch.empty_like(rng) for _ in range(self.rt.world)]
            dist.all_gather(gathered, rng)
            out["rng.cpu"] = torch.stack(gathered)
        else:
            out["rng.cpu"] = rng.unsqueeze(0)
        if self.rt.device.type == "cuda":
            out["rng.cuda"] = torch.cuda.get_rng_state(self.rt.device).unsqueeze(0)
        return out

    def checkpoint(self, *, blocking: bool = False) -> None:
        sched = self.scheduler.state_dict()
        # lr_lambdas holds only callable objects' state (ours is a plain function: None).
        self.progress.scheduler = {**sched, "lr_lambdas": [None] * len(sched.get("lr_lambdas", []))}
        self.progress.optimizer_groups = [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
            for g in self.optimizer.state_dict()["param_groups"]]
        self.progress.scaler = self.scaler.state_dict() if self.scaler else {}
        self.progress.world_size = self.rt.world
        # A copy: the background writer serializes it while training goes on.
        progress = json.loads(json.dumps(self.progress.to_dict()))
        if self.rt.world > 1:  # rank 0's copy is saved, and it alone carries the epoch's loss on resume
            progress["epoch_loss"] = self._reduce(list(self.progress.epoch_loss))
        stall = self.ckpt.save(self.progress.step, self.tensors(), progress, blocking=blocking)
        self._last_saved_step = self.progress.step
        self.stats["checkpoint_stall_s"] += stall
        self.stats["checkpoints"] += 1

    def resume(self) -> None:
        found = self.ckpt.latest(self.progress.fingerprint)
        if found is None:
            return
        saved = self.ckpt.saved_keys(found)
        groups = found.progress["optimizer_groups"]
        optim_state: dict[int, dict[str, torch.Tensor]] = {}
        targets = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for index, (name, param) in enumerate(self.model.named_parameters()):
            entries = {}
            for key in ("step", "exp_avg", "exp_avg_sq"):
                fqn = f"optim.{name}.{key}"
                if fqn in saved:
                    entries[key] = torch.zeros(saved[fqn], dtype=torch.float32) if key == "step" else torch.zeros_like(param)
                    targets[fqn] = entries[key]
            if entries:
                optim_state[index] = entries
        rng_rows = {k: torch.zeros(saved[k], dtype=torch.uint8) for k in ("rng.cpu", "rng.cuda") if k in saved}
        targets.update(rng_rows)
        missing = sorted(k for k in targets if k not in saved)
        if missing:
            raise CheckpointError(f"checkpoint {found.directory} lacks {missing[:5]} (a different model?)")
        self.ckpt.load(found, targets)
        self.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})
        self.scheduler.load_state_dict(found.progress["scheduler"])
        if self.scaler and found.progress.get("scaler"):
            self.scaler.load_state_dict(found.progress["scaler"])
        p = found.progress
        self.progress = Progress(**{k: p[k] for k in Progress.__dataclass_fields__ if k in p})
        saved_world = int(rng_rows["rng.cpu"].shape[0]) if "rng.cpu" in rng_rows else 0
        if saved_world == self.rt.world:
            # A copy: torch.set_rng_state crashes (SIGSEGV) on a row view at a non-zero offset.
            torch.set_rng_state(rng_rows["rng.cpu"][self.rt.rank].clone())
            if "rng.cuda" in rng_rows and self.rt.device.type == "cuda" and self.rt.world == 1:
                torch.cuda.set_rng_state(rng_rows["rng.cuda"][0].clone(), self.rt.device)
        else:
            torch.manual_seed(self.cfg.seed * 1_000_003 + self.progress.step * 101 + self.rt.rank)
            self.log(f"checkpoint written by {saved_world} rank(s), resuming on {self.rt.world}: data order and "
                     "weights carry over, dropout's random stream is reseeded")
        if not self.rt.master:
            self.progress.epoch_loss = [0.0, 0.0]  # rank 0 carries the epoch's partial sums
        self.resumed_from = self._last_saved_step = found.step
        self.log(f"resumed from {found.directory}: step {found.step}, epoch {self.progress.epoch + 1}, "
                 f"{self.progress.rows_in_epoch} rows into it")
