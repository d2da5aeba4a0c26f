"""Train a gradient-boosted tree model (``model.family: xgboost``) on one rank of a torchrun job.

The launcher, the config, the lease, the checkpoint directory, Pipes and the export's place are the
PyTorch families' (ml_assets.trainer.train dispatches here); what differs is the loop:

- The collective. With several ranks, rank 0 starts XGBoost's tracker (``RabitTracker``) on
  MASTER_ADDR, sends its port to the other ranks over the torch process group, and every rank joins
  through ``xgboost.collective.CommunicatorContext`` with its rank as task id (what Kubeflow
  Trainer's XGBoost runtime does with the ``DMLC_*`` variables). Each rank trains on its shard; the
  histograms are all-reduced, so every rank holds the same booster. A tracker that cannot start
  (its port taken) fails every rank with the reason.
- Rounds. One ``Booster.update`` per boosting round, the validation loss after each (all-reduced),
  early stopping on it (``training.early_stopping.patience`` rounds; the best round is kept).
- Checkpoints. The booster's UBJSON every ``training.checkpoint.every_steps`` rounds (or at the
  first round after ``every_seconds``), written in the background by rank 0
  (ml_assets.trainer.booster_checkpoint); SIGTERM checkpoints and exits 75.
- Exact resume. XGBoost keeps the random state of its sampling in the running process, never in a
  saved model. The rows (``subsample``) and each tree's columns (``colsample_bytree``) are therefore
  drawn here, from the seed and the round alone (ml_assets.trainer.booster_sampling), so a booster
  loaded from any checkpoint goes on exactly as the first run did, and every round can be a resume
  point. The per-level and per-node column samples (``colsample_bylevel``, ``colsample_bynode``)
  stay XGBoost's: with those, training runs in segments of ``SEGMENT_ROUNDS``, each starting from a
  booster loaded from the previous segment's bytes and seeded with ``seed + first round``, and only
  a segment's end is a checkpoint (the reload re-predicts every earlier tree: slower, still exact).
- Fine-tunes (``init_weights``: the champion's booster). The rounds of ``model_params`` are added to
  the parent's trees, numbered after them, once ml_assets.trainer.booster_parent found that both
  read the same inputs through the same objective; checkpoints hold the whole booster, so a resume
  is exact as above, and early stopping keeps the parent's trees and the best of the new ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from ml_assets.trainer import booster_parent, boosting
from ml_assets.trainer.booster_checkpoint import BoosterCheckpoints
from ml_assets.trainer.booster_data import (
    Shard,
    feature_names,
    feature_types,
    max_categories,
    memory_shard,
    row_range,
)
from ml_assets.trainer.booster_sampling import Sampler
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import read_state, read_verified
from ml_assets.trainer.progress import Progress
from ml_assets.trainer.runtime import EXIT_PREEMPTED, Preempted, Runtime, StopSignal, take_lease

SEGMENT_ROUNDS = 25
"""Rounds per segment with colsample_bylevel or colsample_bynode: each segment's end is a checkpoint."""


class TrackerError(RuntimeError):
    """XGBoost's tracker could not start, or a rank could not join it."""


@contextlib.contextmanager
def collective(cfg: TrainConfig, rt: Runtime, log: Callable[[str], None]) -> Iterator[None]:
    """Every rank inside XGBoost's collective (nothing to join with one rank)."""
    if rt.world == 1:
        yield
        return
    from xgboost import collective as xgb_collective
    from xgboost.tracker import RabitTracker

    host = socket.gethostbyname(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    tracker, problem, port = None, "", -1
    if rt.master:
        try:
            tracker = RabitTracker(n_workers=rt.world, host_ip=host, port=cfg.tracker_port, timeout=300)
            tracker.start()
            port = int(tracker.worker_args()["dmlc_tracker_port"])
        except Exception as exc:  # noqa: BLE001 - any failure to listen is the reason the step fails
            problem = f"XGBoost's tracker could not start on {host}:{cfg.tracker_port or 'any port'}: {exc}"
    verdict = torch.tensor([port], dtype=torch.int64)
    dist.broadcast(verdict, src=0)
    if int(verdict[0]) < 0:
        raise TrackerError(problem or "rank 0 could not start XGBoost's tracker")
    log(f"XGBoost tracker on {host}:{int(verdict[0])}, {rt.world} workers")
    with xgb_collective.CommunicatorContext(dmlc_communicator="rabit", dmlc_tracker_uri=host,
                                            dmlc_tracker_port=int(verdict[0]), dmlc_task_id=str(rt.rank)):
        yield
    if tracker is not None:
        tracker.wait_for()


class BoostTrainer:
    """One rank's boosting, from wherever its progress stands to the end (or a stop request)."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
                 warn: Callable[[str], None]) -> None:
        import xgboost

        self.cfg, self.rt, self.log, self.report, self.warn = cfg, rt, log, report, warn
        self.xgb = xgboost
        self.state = read_state(cfg.feature_state)
        from ml_assets.trainer.booster_stream import stream_shard  # XGBoost's external memory

        # The rows first: a bad input fails before the lease is taken or anything is written.
        self.shard: Shard = (stream_shard if cfg.data_mode == "streaming" else memory_shard)(cfg, self.state, rt.rank, rt.world)
        self.train_rows, self.val_rows = self.shard.rows, self.shard.val_rows
        self.total_rounds = boosting.rounds(cfg.model_params)
        self.sampling = boosting.samples(cfg.model_params)
        # Fixed, never from the checkpoint settings: with sampling, where segments start decides the
        # draws, so it must not change with how often a run is asked to checkpoint.
        self.segment = SEGMENT_ROUNDS if self.sampling else 0
        device = "cpu"
        if cfg.model_params.get("device") == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        self.params = boosting.booster_params(cfg.model_params, cfg.task, len(cfg.classes), seed=cfg.seed,
                                              threads=cfg.threads, device=device)
        first, last = row_range(self.train_rows, rt.rank, rt.world)
        self.sampler = Sampler(cfg.model_params, cfg.seed, self.train_rows, first, last, len(feature_names(self.state)))
        self.params.update(self.sampler.xgb_params())
        self.parent_raw, self.base_rounds = None, 0
        if cfg.init_weights is not None:  # a fine-tune: rounds added to the parent's trees, checked first
            self.parent_raw = booster_parent.parent_bytes(cfg.init_weights)
            self.base_rounds = booster_parent.check(
                self.parent_raw, cfg.init_weights, feature_names=feature_names(self.state),
                feature_types=feature_types(self.state), objective=self.params["objective"],
                num_class=int(self.params.get("num_class", 0)))["rounds"]
        self.progress = Progress(cfg.fingerprint())
        self.ckpt = BoosterCheckpoints(cfg.checkpoint_root, rank=rt.rank, world=rt.world, mode=cfg.checkpoint_async,
                                       keep_last=cfg.keep_last, log=log, warn=warn)
        self.booster = None
        self.resumed_from: int | None = None
        self._last_saved = 0
        self.stats = {"loop_s": 0.0, "rounds": 0, "checkpoint_stall_s": 0.0}
        self.xgboost_version = xgboost.__version__
        self.precision_name = "float32"
        self.device_type = "cuda" if device.startswith("cuda") else "cpu"

    # -- data ----------------------------------------------------------------------------------------
    def _options(self) -> dict:
        return {"feature_names": feature_names(self.state), "feature_types": feature_types(self.state),
                "enable_categorical": True, "max_bin": int(self.cfg.model_params.get("max_bin", 256))}

    def sketch(self) -> None:
        """The cuts every rank shares, sketched by each rank alone BEFORE it joins the collective
        (inside it, building a matrix is a collective step), from the same rows on every rank; rows
        holding each category index of each categorical input are added so every category has its
        bin, whatever the sample held. Only that input's own indices (missing elsewhere): categories
        an input cannot take would be bins every split search scans (measured: 35% slower rounds
        on flights_delay_xgb, where one hashed input has 513 indices and others 2 to 17) and
        change the trees."""
        import numpy as np

        from ml_assets.features.state import cardinalities
        from ml_assets.trainer.booster_data import cuts_matrix

        n_num = len(self.state["numeric"])
        extra = np.full((max_categories(self.state), self.shard.sketch.shape[1]), np.nan, dtype=np.float32)
        for j, size in enumerate(cardinalities(self.state)):
            extra[:size, n_num + j] = np.arange(size, dtype=np.float32)
        self.reference = cuts_matrix([self.shard.sketch, extra], self._options())
        self.shard.sketch = extra[:0]  # the sample is not needed once sketched

    def matrices(self) -> None:
        """The shard's training and validation matrices, binned by the shared cuts (inside the
        collective: every rank builds them, in the same order). The reference matrix goes then: the
        two copied its cuts, and it holds the sketch sample's bins (up to SKETCH_ROWS rows')."""
        s, options = self.shard, self._options()
        self.dtrain = s.train_matrix(self.reference, options)  # in memory, or XGBoost's external memory
        self.dval = self.xgb.QuantileDMatrix(s.val_x, s.val_y, ref=self.reference, **options)
        self.reference = None

    # -- resume --------------------------------------------------------------------------------------
    def resume(self) -> None:
        found = self.ckpt.latest(self.progress.fingerprint)
        if found is None:
            self.booster = self._booster(self.parent_raw, 0)
            if self.parent_raw is not None:
                ref = self.cfg.init_weights
                self.log(f"fine-tuning from the parent's booster {ref.uri} (sha256 {ref.sha256[:12]}, "
                         f"{self.base_rounds} rounds): adding up to {self.total_rounds}")
            return
        self.progress = Progress(**found.progress)
        self.booster = self._booster(found.raw, found.round)
        self.resumed_from = self._last_saved = found.round
        self.log(f"resumed from round {found.round} ({self.ckpt.root})")

    def _booster(self, raw: bytes | None, first_round: int):
        """A booster from saved bytes (or a new one) for the rounds from ``first_round``: its
        sampling seeded by that round, so a resumed segment draws what the first run drew."""
        params = {**self.params, "seed": self.cfg.seed + first_round} if self.sampling else self.params
        return self.xgb.Booster(params, [self.dtrain, self.dval],
                                model_file=bytearray(raw) if raw is not None else None)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: StopSignal) -> None:
        p = self.progress
        if p.done:
            self.log("the checkpoint says training already finished; exporting")
            return
        self.log(f"training {self.cfg.model} (xgboost {self.xgboost_version}): {self.train_rows} rows, "
                 f"{self.val_rows} validation rows, {self.rt.world} worker(s), {self.total_rounds} rounds"
                 + (f" in segments of {self.segment}" if self.sampling else ""))
        started, self._last_save = time.perf_counter(), time.monotonic()
        self._interval = (started, p.step)
        try:
            while p.step < self.total_rounds and not p.done:
                if self.sampling and p.step % self.segment == 0 and p.step != self.resumed_from and p.step:
                    self.booster = self._booster(bytes(self.booster.save_raw("ubj")), p.step)
                self.sampler.apply(self.dtrain, p.step)
                self.booster.update(self.dtrain, self.base_rounds + p.step)  # the round's number in the booster
                p.step += 1
                self.stats["rounds"] += 1
                self._end_round()
                self._checkpoint_or_stop(stop)
        finally:
            self.sampler.close()
        if not p.done:
            p.done, p.stop_reason = True, f"{self.total_rounds} rounds"
        self.stats["loop_s"] += time.perf_counter() - started
        self.checkpoint()
        self.ckpt.wait()

    def _end_round(self) -> None:
        cfg, p = self.cfg, self.progress
        reporting = p.step % cfg.report_every_steps == 0 or p.step == self.total_rounds
        if reporting:
            self.sampler.unweighted(self.dtrain)
        sets = [(self.dval, "val"), *([(self.dtrain, "train")] if reporting else [])]
        losses = _parse(self.booster.eval_set(sets, self.base_rounds + p.step - 1))
        val = losses["val"]
        if p.best_val_loss is None or val < p.best_val_loss - cfg.early_stopping_min_delta:
            p.best_val_loss, p.best_epoch, p.bad_epochs = val, p.step, 0
        else:
            p.bad_epochs += 1
        if cfg.early_stopping_patience and p.bad_epochs >= cfg.early_stopping_patience:
            p.done, p.stop_reason = True, f"early stopping: {p.bad_epochs} rounds without improvement"
            reporting = True
            if "train" not in losses:
                self.sampler.unweighted(self.dtrain)
                losses["train"] = _parse(self.booster.eval_set([(self.dtrain, "train")],
                                                               self.base_rounds + p.step - 1))["train"]
        if reporting:
            self._report_round(losses)

    def _report_round(self, losses: dict[str, float]) -> None:
        p = self.progress
        entry = {"epoch": p.step, "step": p.step, "train_loss": losses["train"], "val_loss": losses["val"]}
        p.history.append(entry)
        self.log(f"round {p.step}/{self.total_rounds}  train {losses['train']:.5f}  val {losses['val']:.5f}  "
                 f"(best {p.best_val_loss:.5f} at round {p.best_epoch})")
        now, since = time.perf_counter(), self._interval
        rate = self.train_rows * (p.step - since[1]) / max(now - since[0], 1e-9)
        self._interval = (now, p.step)
        # The keys the PyTorch trainer reports (ml_assets.training.launch reads them): loss is the
        # training loss, lr the shrinkage.
        self.report({"kind": "progress", "step": p.step, "epoch": p.step, "loss": losses["train"],
                     "val_loss": losses["val"], "samples_per_s": rate,
                     "lr": float(self.params.get("learning_rate", 0.3)), "time": time.time()})
        if self.cfg.epoch_log and self.rt.master:
            with open(self.cfg.epoch_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**entry, "device": self.params["device"].split(":")[0]}) + "\n")

    def _checkpoint_or_stop(self, stop: StopSignal) -> None:
        cfg, p = self.cfg, self.progress
        at_boundary = not self.sampling or p.step % self.segment == 0
        step_due = bool(cfg.checkpoint_every_steps and p.step - self._last_saved >= cfg.checkpoint_every_steps)
        time_due = bool(cfg.checkpoint_every_seconds and time.monotonic() - self._last_save >= cfg.checkpoint_every_seconds)
        stopping, time_due = self._agree(stop.requested, time_due)
        if stopping:
            self._preempt(stop, at_boundary)
        # Sampling: every segment's end is checkpointed, the only points a resume can start from.
        if at_boundary and (step_due or time_due or self.sampling) and not p.done:
            self.checkpoint()

    def _agree(self, *flags: bool) -> list[bool]:
        """Signals and clocks differ between ranks: any rank's flag is every rank's."""
        if self.rt.world == 1:
            return list(flags)
        t = torch.tensor([float(f) for f in flags])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v) for v in t.tolist()]

    def checkpoint(self, *, blocking: bool = False) -> None:
        p = self.progress
        raw = bytes(self.booster.save_raw("ubj")) if self.rt.master else b""
        self.stats["checkpoint_stall_s"] += self.ckpt.save(p.step, raw, p.to_dict(), blocking=blocking)
        self._last_save, self._last_saved = time.monotonic(), p.step

    def _preempt(self, stop: StopSignal, at_boundary: bool) -> None:
        started = time.perf_counter()
        if at_boundary:
            self.checkpoint(blocking=True)
        self.ckpt.wait()
        where = f"checkpoint at round {self.progress.step}" if at_boundary else "the last segment's checkpoint"
        self.log(f"{stop.signal_name or 'stop requested'}: {where} is the resume point "
                 f"({time.perf_counter() - started:.2f}s); exiting with code {EXIT_PREEMPTED} so the step can be retried")
        self.report({"kind": "preempted", "step": self.progress.step, "signal": stop.signal_name})
        raise Preempted()

    # -- the result ----------------------------------------------------------------------------------
    def final_booster(self) -> tuple[bytes, str, int]:
        """The booster to export (its UBJSON), which rounds it holds, and how many (a fine-tune's
        count the parent's first: the rounds of this training are numbered after them)."""
        p, base = self.progress, self.base_rounds
        if self.cfg.early_stopping_patience and p.best_epoch and p.best_epoch < p.step:
            best = self.booster[: base + p.best_epoch]
            return bytes(best.save_raw("ubj")), f"best validation loss (round {p.best_epoch})", base + p.best_epoch
        return bytes(self.booster.save_raw("ubj")), "last round", base + p.step

    def accounting(self, wall: float) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = usage.ru_utime + usage.ru_stime
        if self.rt.world > 1:
            t = torch.tensor([cpu_s], dtype=torch.float64)
            dist.all_reduce(t)
            cpu_s = float(t[0])
        loop = max(self.stats["loop_s"], 1e-9)
        rows = self.train_rows * self.stats["rounds"]
        gpus = self.rt.world if self.params["device"].startswith("cuda") else 0
        return {"samples_per_s": rows / loop, "data_wait_fraction": 0.0,
                "checkpoint_stall_s": self.stats["checkpoint_stall_s"], "checkpoints_written": self.ckpt.written,
                "cpu_hours": cpu_s / 3600, "gpu_hours": gpus * wall / 3600, "wall_s": wall,
                "steps_this_attempt": self.stats["rounds"], "samples": int(rows)}


def _parse(line: str) -> dict[str, float]:
    """``[12]\\tval-logloss:0.5\\ttrain-logloss:0.4`` -> {"val": 0.5, "train": 0.4}."""
    out = {}
    for item in line.split("\t")[1:]:
        name, value = item.rsplit(":", 1)
        out[name.split("-", 1)[0]] = float(value)
    return out


def run(cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
        warn: Callable[[str], None]) -> dict:
    """Train, then (rank 0) export; the result train.main reports, as ml_assets.trainer.train.run's."""
    from ml_assets.trainer.export import export_booster

    started = time.perf_counter()
    trainer = BoostTrainer(cfg, rt, log, report, warn)
    trainer.sketch()
    lease = None
    try:
        lease = trainer.ckpt.lease = take_lease(cfg, rt, log, warn)
        stop = StopSignal(cfg.preemption_grace_seconds, warn)
        with collective(cfg, rt, log):
            trainer.matrices()
            trainer.resume()
            trainer.run(stop)
        trainer.ckpt.close()
        raw, which, rounds = trainer.final_booster()
        result = {"trainer": trainer, "accounting": trainer.accounting(time.perf_counter() - started),
                  "weights_from": which}
        if rt.master:
            result["export"] = export_booster(cfg.output_dir, raw, _meta(cfg, rt, trainer, which, rounds, result),
                                              read_verified(cfg.feature_state))
    finally:
        if lease is not None:
            lease.release()
    if lease is not None:
        result["lease"] = lease.summary()
    return result


def _meta(cfg: TrainConfig, rt: Runtime, trainer: BoostTrainer, which: str, rounds: int, result: dict) -> dict:
    """meta.json of the export: what the booster is, how it was trained, and on what."""
    p = trainer.progress
    return {
        "model": cfg.model, "task": cfg.task, **({"classes": cfg.classes} if cfg.classes else {}),
        "family": "xgboost", "xgboost_version": trainer.xgboost_version, "params": trainer.params,
        "feature_names": feature_names(trainer.state), "feature_types": feature_types(trainer.state),
        "rounds": rounds, "rounds_trained": p.step, "parent_rounds": trainer.base_rounds, "history": p.history, "stop_reason": p.stop_reason,
        "steps": p.step, "best_val_loss": p.best_val_loss, "weights_from": which,
        "train_rows": trainer.train_rows, "val_rows": trainer.val_rows, "world_size": rt.world,
        "torch_version": torch.__version__, "config_fingerprint": p.fingerprint,
        "train_files": [ref.__dict__ for ref in cfg.train_files], "val_files": [ref.__dict__ for ref in cfg.val_files],
        "accounting": result["accounting"], "resumed_from_step": trainer.resumed_from,
    }
