"""Train a tabular model with DistributedDataParallel; run by torchrun. Pure PyTorch: the only
non-torch import is dagster_pipes, opened on rank 0 alone.

By hand, no Dagster needed (the ``trained_checkpoint`` asset writes the same config and runs the
same command; ``ml_assets.trainer.agent`` is torchrun, tied to the process that starts it)::

    python -m ml_assets.trainer.agent --standalone --nproc_per_node=2 --max-restarts=2 \\
        -m ml_assets.trainer --config train_config.json

Several machines (run on each node; ``--node_rank`` is picked by the rendezvous)::

    torchrun --nnodes=2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        --rdzv-id=JOB -m ml_assets.trainer --config train_config.json

gloo on CPU, nccl on CUDA. Every rank trains on its shard; metrics are all-reduced; rank 0 alone
logs, writes the best weights and the export, and reports to Dagster through Pipes. Checkpoints
(torch.distributed.checkpoint) are written every N steps / M seconds / epoch end and the run resumes
from the newest complete one: run the same command again after a crash. SIGTERM: the step in flight
finishes, a checkpoint is written, the process exits with code 75 (EXIT_PREEMPTED). A rank whose
torchrun agent dies does the same within ``orphan_grace_seconds`` or is ended (ml_assets.processes);
rank 0 holds the checkpoint directory's lease (ml_assets.trainer.lease) from before it reads a
checkpoint until the export is written, so no two trainings write one directory together.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes
from torch.nn.parallel import DistributedDataParallel

from ml_assets import processes
from ml_assets.features.state import cardinalities
from ml_assets.trainer.checkpoint import CheckpointError, CheckpointManager, export_model
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import (
    ResumableSampler,
    check_class_indices,
    make_loader,
    read_frame,
    read_state,
    read_verified,
    to_tensors,
)
from ml_assets.trainer.model import ModelConfig, build_model, loss_fn
from ml_assets.trainer.report import result_metadata, write_report
from ml_assets.trainer.runtime import (
    EXIT_CONFIG,
    EXIT_LEASE,
    EXIT_PREEMPTED,
    LeaseUnavailable,
    Preempted,
    Runtime,
    StopSignal,
    choose_precision,
    compute_cleanup,
    compute_init,
    restarts_left,
    stop_the_agent,
    take_lease,
)

SYNC_EVERY = 8
"""With several ranks, how often (in optimizer steps) they agree whether to stop or checkpoint: an
all-reduce per step would cost more than the step itself for a small tabular model."""
PROCESS_STARTED = time.perf_counter()


def warmup_cosine(warmup: int, total: int, floor: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        span = max(total - warmup, 1)
        progress = min(max(step - warmup, 0) / span, 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


@dataclass
class Progress:
    """Everything about where training is that is not a tensor (saved as JSON with the checkpoint)."""

    fingerprint: str
    step: int = 0
    epoch: int = 0
    rows_in_epoch: int = 0
    """Rows of the current epoch's permutation already trained on, over all ranks."""
    epoch_loss: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """[sum of losses, rows] of the current epoch so far, over all ranks."""
    history: list[dict] = field(default_factory=list)
    best_val_loss: float | None = None
    best_epoch: int = 0
    bad_epochs: int = 0
    done: bool = False
    stop_reason: str = ""
    world_size: int = 1
    scheduler: dict = field(default_factory=dict)
    optimizer_groups: list[dict] = field(default_factory=list)
    scaler: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Trainer:
    def __init__(self, cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
                 warn: Callable[[str], None] | None = None) -> None:
        self.cfg, self.rt, self.log, self.report = cfg, rt, log, report
        self.warn = warn or log
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(cfg.seed)
        self.state = read_state(cfg.feature_state)
        self.train_t = to_tensors(read_frame(cfg.train_files), self.state)
        self.val_t = to_tensors(read_frame(cfg.val_files), self.state)
        if cfg.task == "multiclass_classification":
            check_class_indices(self.train_t[2], cfg.classes, "training")
            check_class_indices(self.val_t[2], cfg.classes, "validation")
        self.model_config = ModelConfig(
            n_numeric=self.train_t[0].shape[1], cardinalities=cardinalities(self.state),
            hidden_sizes=list(cfg.hidden_sizes), dropout=cfg.dropout, family=cfg.family, n_outputs=cfg.n_outputs,
        )
        self.model = build_model(self.model_config, cfg.activation_checkpointing).to(rt.device)
        self.param_names = [name for name, _ in self.model.named_parameters()]
        # One rank needs no gradient all-reduce: DDP would only add hooks and copies.
        self.net = self.model if rt.world == 1 else DistributedDataParallel(
            self.model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            gradient_as_bucket_view=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.micro_batch = max(1, cfg.batch_size // (rt.world * cfg.grad_accum_steps))
        rows_per_rank = math.ceil(len(self.train_t[2]) / rt.world)
        self.steps_per_epoch = math.ceil(math.ceil(rows_per_rank / self.micro_batch) / cfg.grad_accum_steps)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio))
        self.autocast_dtype, use_scaler = choose_precision(cfg.precision, rt.device, log)
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.criterion = loss_fn(cfg.task)
        self.ckpt = CheckpointManager(cfg.checkpoint_root, rank=rt.rank, world=rt.world, mode=cfg.checkpoint_async,
                                      keep_last=cfg.keep_last, log=log, warn=self.warn)
        self.progress = Progress(fingerprint=cfg.fingerprint(), world_size=rt.world)
        self.stats = {"data_wait_s": 0.0, "loop_s": 0.0, "checkpoint_stall_s": 0.0, "checkpoints": 0,
                      "rows": 0, "steps": 0}
        self.resumed_from: int | None = None
        self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-epoch")
        self._next: tuple[int, Future] | None = None
        self._last_saved_step = 0

    # -- state ---------------------------------------------------------------------------------
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

    # -- loop ------------------------------------------------------------------------------------
    def _flags(self, stop: bool, due: bool) -> tuple[bool, bool]:
        """Every rank must stop and checkpoint at the same step: agree by an all-reduce (max)."""
        if self.rt.world == 1:
            return stop, due
        flags = torch.tensor([float(stop), float(due)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    def _reduce(self, values: list[float]) -> list[float]:
        if self.rt.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def validate(self) -> float:
        numeric, categorical, target = (t[self.rt.rank::self.rt.world].to(self.rt.device) for t in self.val_t)
        self.model.eval()
        with torch.no_grad(), self._autocast():
            total = float(self.criterion(self.model(numeric, categorical).float(), target)) if len(target) else 0.0
        self.model.train()
        loss, rows = self._reduce([total, float(len(target))])
        return loss / rows

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.rt.device.type, dtype=self.autocast_dtype)

    def run(self, stop: StopSignal) -> None:
        cfg, p = self.cfg, self.progress
        if p.done:
            self.log("the checkpoint says training already finished; exporting")
            return
        self.log(f"training {cfg.model} ({cfg.family}): {len(self.train_t[2])} rows, {len(self.val_t[2])} validation rows, "
                 f"{self.rt.world} rank(s) on {self.rt.device}, {cfg.epochs} epochs x {self.steps_per_epoch} steps, "
                 f"micro-batch {self.micro_batch} x {cfg.grad_accum_steps} accumulation, precision "
                 f"{self.autocast_dtype or torch.float32}")
        self.model.train()
        last_save = time.monotonic()
        interval = {"loss": 0.0, "rows": 0.0, "t": time.perf_counter(), "step": p.step}
        loop_started = time.perf_counter()
        while p.epoch < cfg.epochs and not p.done:
            waited, epoch_start = time.perf_counter(), p.rows_in_epoch
            loader = self._loader(p.epoch, epoch_start)
            self.stats["data_wait_s"] += time.perf_counter() - waited
            if p.epoch + 1 < cfg.epochs:  # the next epoch's rows are gathered while this one trains
                self._next = (p.epoch + 1, self._prefetcher.submit(self._build_loader, p.epoch + 1, 0))
            micro_total = len(loader)
            batches = iter(loader)
            micro = 0
            while True:
                waited = time.perf_counter()
                batch = next(batches, None)
                self.stats["data_wait_s"] += time.perf_counter() - waited
                if batch is None:
                    break
                micro += 1
                numeric, categorical, target = (t.to(self.rt.device, non_blocking=True) for t in batch)
                boundary = micro % cfg.grad_accum_steps == 0 or micro == micro_total
                sync = contextlib.nullcontext() if boundary or self.net is self.model else self.net.no_sync()
                with sync:
                    with self._autocast():
                        out = self.net(numeric, categorical)
                    loss = self.criterion(out.float(), target)
                    scaled = loss / (self.micro_batch * cfg.grad_accum_steps)
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                value = float(loss.detach())
                p.epoch_loss[0] += value
                p.epoch_loss[1] += len(target)
                interval["loss"] += value
                interval["rows"] += len(target)
                self.stats["rows"] += len(target)
                if not boundary:
                    continue
                self._optimizer_step()
                p.step += 1
                self.stats["steps"] += 1
                p.rows_in_epoch = min(epoch_start + micro * self.micro_batch * self.rt.world, len(self.train_t[2]))
                if p.step % cfg.report_every_steps == 0:
                    self._report_progress(interval)
                if cfg.max_steps and p.step >= cfg.max_steps:
                    p.done, p.stop_reason = True, f"max_steps {cfg.max_steps}"
                    break
                if self.stats["steps"] == 1:
                    self.log(f"first step of this attempt: step {p.step}, "
                             f"{time.perf_counter() - PROCESS_STARTED:.1f}s after the process started")
                # (The epoch's end checkpoints anyway.) Step counts are the same on every rank; clocks
                # and signals are not, so those are agreed on by all ranks (every SYNC_EVERY steps).
                mid = micro < micro_total
                step_due = mid and bool(cfg.checkpoint_every_steps and p.step % cfg.checkpoint_every_steps == 0)
                time_due = mid and bool(cfg.checkpoint_every_seconds
                                        and time.monotonic() - last_save >= cfg.checkpoint_every_seconds)
                if self.rt.world == 1:
                    stopping = stop.requested
                elif p.step % SYNC_EVERY == 0 or step_due:
                    stopping, time_due = self._flags(stop.requested, time_due)
                else:
                    continue
                due = step_due or time_due
                if stopping:
                    self._preempt(stop)
                if due:
                    self.checkpoint()
                    last_save = time.monotonic()
            if p.done and micro < micro_total:
                break
            self._end_epoch()
            # An epoch's end is a natural resume point, but not worth a checkpoint of its own when the
            # spec sets an interval that is not due yet (small epochs would checkpoint constantly).
            periodic = cfg.checkpoint_every_steps or cfg.checkpoint_every_seconds
            due = (p.done or not periodic
                   or bool(cfg.checkpoint_every_steps and p.step - self._last_saved_step >= cfg.checkpoint_every_steps)
                   or bool(cfg.checkpoint_every_seconds and time.monotonic() - last_save >= cfg.checkpoint_every_seconds))
            if self.rt.world > 1:
                _, due = self._flags(False, due)
            if due:
                self.checkpoint()
                last_save = time.monotonic()
        self.stats["loop_s"] += time.perf_counter() - loop_started
        if self._last_saved_step != p.step:
            self.checkpoint()
        self.ckpt.wait()

    def _build_loader(self, epoch: int, start: int):
        sampler = ResumableSampler(self.train_t[2], num_replicas=self.rt.world, rank=self.rt.rank, seed=self.cfg.seed)
        sampler.set_epoch(epoch)
        sampler.set_start(start)
        return make_loader(self.train_t, sampler, self.micro_batch, num_workers=self.cfg.num_workers,
                           pin_memory=self.cfg.pin_memory, prefetch_factor=self.cfg.prefetch_factor)

    def _loader(self, epoch: int, start: int):
        if self._next is not None and self._next[0] == epoch and start == 0:
            loader = self._next[1].result()
        else:
            loader = self._build_loader(epoch, start)
        self._next = None
        return loader

    def _optimizer_step(self) -> None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.grad_clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _report_progress(self, interval: dict) -> None:
        loss, rows = self._reduce([interval["loss"], interval["rows"]])
        now = time.perf_counter()
        steps = self.progress.step - interval["step"]
        rate = rows / max(now - interval["t"], 1e-9)
        eta = (self.total_steps - self.progress.step) * (now - interval["t"]) / max(steps, 1)
        if self.rt.master:
            lr = self.scheduler.get_last_lr()[0]
            self.log(f"step {self.progress.step}/{self.total_steps}  epoch {self.progress.epoch + 1}  loss {loss / rows:.4f}  "
                     f"{rate:,.0f} samples/s  lr {lr:.2e}  ETA {eta:.0f}s")
            self.report({"kind": "progress", "step": self.progress.step, "epoch": self.progress.epoch + 1,
                         "loss": loss / rows, "samples_per_s": rate, "lr": lr, "eta_s": eta, "time": time.time()})
        interval.update(loss=0.0, rows=0.0, t=now, step=self.progress.step)

    def _end_epoch(self) -> None:
        p, cfg = self.progress, self.cfg
        loss, rows = self._reduce(p.epoch_loss) if self.rt.world > 1 else p.epoch_loss
        val = self.validate()
        p.history.append({"epoch": p.epoch + 1, "step": p.step, "train_loss": loss / max(rows, 1), "val_loss": val})
        improved = p.best_val_loss is None or val < p.best_val_loss - cfg.early_stopping_min_delta
        if improved:
            p.best_val_loss, p.best_epoch, p.bad_epochs = val, p.epoch + 1, 0
            if self.rt.master:
                self.ckpt.save_best(self.model.state_dict(), {"epoch": p.epoch + 1, "step": p.step, "val_loss": val,
                                                              "fingerprint": p.fingerprint})
        else:
            p.bad_epochs += 1
        self.log(f"epoch {p.epoch + 1}/{cfg.epochs}  train_loss {loss / max(rows, 1):.4f}  val_loss {val:.4f}"
                 + ("  (best)" if improved else f"  ({p.bad_epochs} without improvement)"))
        if cfg.epoch_log and self.rt.master:
            with open(cfg.epoch_log, "a", encoding="utf-8") as fh:  # one line, flushed on close
                fh.write(json.dumps(p.history[-1]) + "\n")
        p.epoch += 1
        p.rows_in_epoch = 0
        p.epoch_loss = [0.0, 0.0]
        if cfg.early_stopping_patience and p.bad_epochs >= cfg.early_stopping_patience:
            p.done, p.stop_reason = True, f"early stopping: {p.bad_epochs} epochs without improvement"
            self.log(p.stop_reason + f"; best val_loss {p.best_val_loss:.4f} at epoch {p.best_epoch}")
        elif p.epoch >= cfg.epochs:
            p.done, p.stop_reason = True, f"{cfg.epochs} epochs"

    def _preempt(self, stop: StopSignal) -> None:
        started = time.perf_counter()
        self.checkpoint(blocking=True)
        seconds = time.perf_counter() - started
        if processes.orphaned():  # the parent-death signal (ml_assets.processes): nobody reads the report
            stop.signal_name += " (the torchrun agent is gone)"
        self.log(f"{stop.signal_name or 'stop requested'}: checkpoint at step {self.progress.step} written in "
                 f"{seconds:.2f}s; exiting with code {EXIT_PREEMPTED} so the step can be retried")
        self.report({"kind": "preempted", "step": self.progress.step, "checkpoint_seconds": seconds,
                     "signal": stop.signal_name})
        raise Preempted()

    # -- result ------------------------------------------------------------------------------------
    def final_weights(self) -> tuple[dict[str, torch.Tensor], str]:
        """With early stopping on, the best epoch's weights; otherwise the last."""
        if self.cfg.early_stopping_patience:
            best = self.ckpt.load_best()
            if best is not None:
                return best[0], f"best validation loss (epoch {best[1]['epoch']})"
        return self.model.state_dict(), "last step"

    def accounting(self, wall: float) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s, = self._reduce([usage.ru_utime + usage.ru_stime])
        loop = max(self.stats["loop_s"], 1e-9)
        rows, = self._reduce([float(self.stats["rows"])])
        gpus = self.rt.world if self.rt.device.type == "cuda" else 0
        return {
            "samples_per_s": rows / loop, "data_wait_fraction": self.stats["data_wait_s"] / loop,
            "checkpoint_stall_s": self.stats["checkpoint_stall_s"], "checkpoints_written": self.stats["checkpoints"],
            "cpu_hours": cpu_s / 3600, "gpu_hours": gpus * wall / 3600, "wall_s": wall,
            "steps_this_attempt": self.stats["steps"],
        }


def run(cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
        warn: Callable[[str], None]) -> dict:
    started = time.perf_counter()
    # The data first (a bad input fails before anything is written), then the lease, before any
    # checkpoint is read or written.
    trainer = Trainer(cfg, rt, log, report, warn)
    lease = None
    try:
        try:
            lease = trainer.ckpt.lease = take_lease(cfg, rt, log, warn)
            stop = StopSignal(cfg.preemption_grace_seconds, warn)
            trainer.resume()
            trainer.run(stop)
        finally:
            trainer._prefetcher.shutdown(cancel_futures=True)
            trainer.ckpt.close()
        # Still under the lease: the best weights are read from the checkpoint directory.
        weights, which = trainer.final_weights()
        result = {"trainer": trainer, "accounting": trainer.accounting(time.perf_counter() - started),
                  "weights_from": which}
        if rt.master:
            p = trainer.progress
            meta = {
                "model": cfg.model, "task": cfg.task, **({"classes": cfg.classes} if cfg.classes else {}),
                "model_config": trainer.model_config.to_dict(),
                "history": p.history, "stop_reason": p.stop_reason, "steps": p.step, "best_val_loss": p.best_val_loss,
                "weights_from": which, "train_rows": len(trainer.train_t[2]), "val_rows": len(trainer.val_t[2]),
                "world_size": rt.world, "torch_version": torch.__version__, "config_fingerprint": p.fingerprint,
                "train_files": [ref.__dict__ for ref in cfg.train_files],
                "val_files": [ref.__dict__ for ref in cfg.val_files],
                "accounting": result["accounting"], "resumed_from_step": trainer.resumed_from,
            }
            result["export"] = export_model(cfg.output_dir, weights, meta, read_verified(cfg.feature_state))
    finally:
        if lease is not None:
            lease.release()
    if lease is not None:
        result["lease"] = {**lease.summary(), "released_at": time.time()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="path of the training config JSON")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.from_json(args.config)
    except (ValueError, TypeError) as exc:
        print(f"[trainer] {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    # (python -m ml_assets.trainer already did this before importing torch; now with the config's grace.)
    processes.follow_parent(grace_seconds=cfg.orphan_grace_seconds)
    rt = compute_init()
    # Only rank 0 may talk to Dagster: if every rank reported, the step would see several results.
    pipes = open_dagster_pipes() if rt.master and PipesEnvVarParamsLoader().is_dagster_pipes_process() else None
    code, result = 0, None

    def log(message: str) -> None:
        if rt.master:
            pipes.log.info(message) if pipes is not None else print(f"[trainer] {message}", file=sys.stderr, flush=True)

    def warn(message: str) -> None:
        if rt.master:
            pipes.log.warning(message) if pipes is not None else print(f"[trainer] WARNING {message}", file=sys.stderr, flush=True)

    def report(payload: dict) -> None:
        if pipes is not None:
            pipes.report_custom_message(payload)

    try:
        try:
            result = run(cfg, rt, log, report, warn)
        except Preempted:
            code = EXIT_PREEMPTED
            stop_the_agent()
        except LeaseUnavailable as exc:
            # Not a crash: a restart would only wait again. Rank 0 says why, the agent stops.
            warn(str(exc))
            report({"kind": "lease_held", "message": str(exc)})
            code = EXIT_LEASE
            stop_the_agent()
        except BaseException as exc:
            if pipes is not None and restarts_left():
                # torchrun will start this rank again and it resumes; closing Pipes now would make
                # Dagster drop everything the restarted rank 0 reports. Leave the session open.
                warn(f"rank 0 failed ({type(exc).__name__}: {exc}); torchrun restarts it "
                     f"({restarts_left()} restart(s) left) and it resumes from the last checkpoint")
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            if pipes is not None:
                pipes.__exit__(type(exc), exc, exc.__traceback__)  # Dagster shows the error
                pipes = None
            raise
        else:
            if rt.master:
                saved, trainer, acct = result["export"], result["trainer"], result["accounting"]
                log(f"exported {saved['uri']} sha256 {saved['sha256'][:12]} ({result['weights_from']}); "
                    f"{acct['samples_per_s']:,.0f} samples/s, data wait {100 * acct['data_wait_fraction']:.1f}%")
                report_meta = result_metadata(cfg, rt, trainer, saved, acct, result["weights_from"], result.get("lease"))
                # Beside the export, with or without Dagster: what a run by hand (or a reproduction)
                # reports, in the same form Pipes carries it.
                write_report(cfg.output_dir, report_meta, saved["sha256"])
                if pipes is not None:
                    pipes.report_asset_materialization(metadata=report_meta, data_version=saved["sha256"])
        if pipes is not None:
            pipes.close()
    finally:
        # DDP's reducer and the optimizer go before the process group: a DDP object collected after
        # destroy_process_group can leave a rank hanging at exit.
        result = None
        gc.collect()
        compute_cleanup()
    return code




if __name__ == "__main__":
    sys.exit(main())
