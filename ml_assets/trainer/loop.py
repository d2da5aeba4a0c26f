"""The training loop of one rank: epochs of micro-batches with gradient accumulation, an optimizer
step at each accumulation boundary, progress reports, checkpoints every N steps / M seconds / epoch
end, validation and early stopping at each epoch's end, and a stop request turned into a
checkpoint and ``Preempted``. Every rank runs the same steps; rank 0 alone logs and reports."""

from __future__ import annotations

import json
import resource
import time

import torch

from ml_assets import processes
from ml_assets.trainer.data import ResumableSampler, make_loader
from ml_assets.trainer.parallel import accumulation, full_state_dict, sharded
from ml_assets.trainer.runtime import EXIT_PREEMPTED, Preempted, StopSignal
from ml_assets.trainer.state import CheckpointedTrainer

SYNC_EVERY = 8
"""With several ranks, how often (in optimizer steps) they agree whether to stop or checkpoint: an
all-reduce per step would cost more than the step itself for a small tabular model."""
PROCESS_STARTED = time.perf_counter()


class Trainer(CheckpointedTrainer):
    """Trains one rank from wherever its progress stands to the end (or a stop request)."""

    def run(self, stop: StopSignal) -> None:
        cfg, p = self.cfg, self.progress
        if p.done:
            self.log("the checkpoint says training already finished; exporting")
            return
        self.log(f"training {cfg.model} ({self.model_name}): {self.train_rows} rows, {len(self.val_t[2])} validation rows, "
                 f"{self.rt.world} rank(s) on {self.rt.device}, {cfg.epochs} epochs x {self.steps_per_epoch} steps, "
                 f"micro-batch {self.micro_batch} x {cfg.grad_accum_steps} accumulation, precision "
                 f"{self.autocast_dtype or torch.float32}")
        self.model.train()
        self._last_save_time = time.monotonic()
        interval = {"loss": 0.0, "rows": 0.0, "t": time.perf_counter(), "step": p.step}
        loop_started = time.perf_counter()
        while p.epoch < cfg.epochs and not p.done:
            if not self._train_epoch(stop, interval):
                break
            self._end_epoch()
            self._checkpoint_at_epoch_end()
        self.stats["loop_s"] += time.perf_counter() - loop_started
        if self._last_saved_step != p.step:
            self.checkpoint()
        self.ckpt.wait()

    def _train_epoch(self, stop: StopSignal, interval: dict) -> bool:
        """Train the rest of the current epoch; False when training ended inside it (max_steps)."""
        cfg, p = self.cfg, self.progress
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
            boundary = micro % cfg.grad_accum_steps == 0 or micro == micro_total
            self._forward_backward(batch, boundary, interval)
            if not boundary:
                continue
            self._optimizer_step()
            p.step += 1
            self.stats["steps"] += 1
            p.rows_in_epoch = min(epoch_start + micro * self.micro_batch * self.rt.world, self.epoch_rows(p.epoch))
            if p.step % cfg.report_every_steps == 0:
                self._report_progress(interval)
            if cfg.max_steps and p.step >= cfg.max_steps:
                p.done, p.stop_reason = True, f"max_steps {cfg.max_steps}"
                break
            if self.stats["steps"] == 1:
                self.log(f"first step of this attempt: step {p.step}, "
                         f"{time.perf_counter() - PROCESS_STARTED:.1f}s after the process started")
            self._checkpoint_if_due(stop, mid=micro < micro_total)
        return not (p.done and micro < micro_total)

    def _forward_backward(self, batch, boundary: bool, interval: dict) -> None:
        """One micro-batch; gradients are reduced across ranks only at an accumulation boundary."""
        cfg, p = self.cfg, self.progress
        numeric, categorical, target = (t.to(self.rt.device, non_blocking=True) for t in batch)
        with accumulation(self.net, boundary):
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

    def _checkpoint_if_due(self, stop: StopSignal, *, mid: bool) -> None:
        """After an optimizer step: stop (checkpoint, then ``Preempted``) or checkpoint when due."""
        cfg, p = self.cfg, self.progress
        # (The epoch's end checkpoints anyway.) Step counts are the same on every rank; clocks
        # and signals are not, so those are agreed on by all ranks (every SYNC_EVERY steps).
        step_due = mid and bool(cfg.checkpoint_every_steps and p.step % cfg.checkpoint_every_steps == 0)
        time_due = mid and bool(cfg.checkpoint_every_seconds
                                and time.monotonic() - self._last_save_time >= cfg.checkpoint_every_seconds)
        if self.rt.world == 1:
            stopping = stop.requested
        elif p.step % SYNC_EVERY == 0 or step_due:
            stopping, time_due = self._flags(stop.requested, time_due)
        else:
            return
        due = step_due or time_due
        if stopping:
            self._preempt(stop)
        if due:
            self.checkpoint()
            self._last_save_time = time.monotonic()

    def _checkpoint_at_epoch_end(self) -> None:
        cfg, p = self.cfg, self.progress
        # An epoch's end is a natural resume point, but not worth a checkpoint of its own when the
        # spec sets an interval that is not due yet (small epochs would checkpoint constantly).
        periodic = cfg.checkpoint_every_steps or cfg.checkpoint_every_seconds
        due = (p.done or not periodic
               or bool(cfg.checkpoint_every_steps and p.step - self._last_saved_step >= cfg.checkpoint_every_steps)
               or bool(cfg.checkpoint_every_seconds
                       and time.monotonic() - self._last_save_time >= cfg.checkpoint_every_seconds))
        if self.rt.world > 1:
            _, due = self._flags(False, due)
        if due:
            self.checkpoint()
            self._last_save_time = time.monotonic()

    # -- the pieces of a step --------------------------------------------------------------------
    def _build_loader(self, epoch: int, start: int):
        if self.stream is not None:
            return self.stream.loader(epoch, start, self.micro_batch)
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

    # -- an epoch's end: validation, the best weights, early stopping ---------------------------
    def validate(self) -> float:
        numeric, categorical, target = (t[self.rt.rank::self.rt.world].to(self.rt.device) for t in self.val_t)
        self.model.eval()
        total = 0.0
        with torch.no_grad(), self._autocast():
            # Under FSDP the forward gathers the parameters with every rank, so a rank without
            # validation rows runs it too, on none.
            if len(target) or sharded(self.model):
                out = self.model(numeric, categorical).float()
                total = float(self.criterion(out, target)) if len(target) else 0.0
        self.model.train()
        loss, rows = self._reduce([total, float(len(target))])
        return loss / rows

    def _end_epoch(self) -> None:
        p, cfg = self.progress, self.cfg
        loss, rows = self._reduce(p.epoch_loss) if self.rt.world > 1 else p.epoch_loss
        val = self.validate()
        p.history.append({"epoch": p.epoch + 1, "step": p.step, "train_loss": loss / max(rows, 1), "val_loss": val})
        improved = p.best_val_loss is None or val < p.best_val_loss - cfg.early_stopping_min_delta
        if improved:
            p.best_val_loss, p.best_epoch, p.bad_epochs = val, p.epoch + 1, 0
            weights = full_state_dict(self.model)  # every rank: under FSDP, a gather to rank 0
            if self.rt.master:
                self.ckpt.save_best(weights, {"epoch": p.epoch + 1, "step": p.step, "val_loss": val,
                                              "fingerprint": p.fingerprint})
        else:
            p.bad_epochs += 1
        self.log(f"epoch {p.epoch + 1}/{cfg.epochs}  train_loss {loss / max(rows, 1):.4f}  val_loss {val:.4f}"
                 + ("  (best)" if improved else f"  ({p.bad_epochs} without improvement)"))
        if cfg.epoch_log and self.rt.master:
            with open(cfg.epoch_log, "a", encoding="utf-8") as fh:  # one line, flushed on close
                # The device too: a tuning trial pruned before its end has no report to say it.
                fh.write(json.dumps({**p.history[-1], "device": self.rt.device.type}) + "\n")
        p.epoch += 1
        p.rows_in_epoch = 0
        p.epoch_loss = [0.0, 0.0]
        if cfg.early_stopping_patience and p.bad_epochs >= cfg.early_stopping_patience:
            p.done, p.stop_reason = True, f"early stopping: {p.bad_epochs} epochs without improvement"
            self.log(p.stop_reason + f"; best val_loss {p.best_val_loss:.4f} at epoch {p.best_epoch}")
        elif p.epoch >= cfg.epochs:
            p.done, p.stop_reason = True, f"{cfg.epochs} epochs"

    # -- a stop request -----------------------------------------------------------------------------
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
        """With early stopping on, the best epoch's weights; otherwise the last. Called on every
        rank; under FSDP only rank 0's are the whole model (the others get an empty dict)."""
        if self.cfg.early_stopping_patience:
            gather = sharded(self.model) and self.rt.world > 1
            best = self.ckpt.load_best() if self.rt.master or not gather else None
            # The other ranks follow rank 0's answer: with none, they must join the gather below.
            found = self._flags(best is not None, False)[0] if gather else best is not None
            if found:
                which = f"best validation loss (epoch {best[1]['epoch']})" if best else "best validation loss"
                return (best[0] if best else {}), which
        return full_state_dict(self.model), "last step"

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
            "steps_this_attempt": self.stats["steps"], "samples": int(rows),
        }
