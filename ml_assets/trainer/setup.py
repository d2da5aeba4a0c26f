"""What one training rank builds before its first step: the data as tensors, the model (wrapped
for DDP or FSDP by ml_assets.trainer.parallel), the optimizer and its warmup-cosine
schedule, the precision, the loss and the checkpoint manager; and the few collectives the rest of
the trainer agrees through (a sum, a max of flags). Building fails on bad input before anything
is written."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

from ml_assets.trainer.build import build, load_parent
from ml_assets.trainer.checkpoint import CheckpointManager
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.contract import SAMPLE_ROWS
from ml_assets.trainer.data import check_class_indices, read_frame, read_state, to_tensors
from ml_assets.trainer.parallel import wrap
from ml_assets.trainer.progress import Progress
from ml_assets.trainer.runtime import Runtime, choose_precision, steady_allocator
from ml_assets.trainer.stream import StreamedWindow


def warmup_cosine(warmup: int, total: int, floor: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        span = max(total - warmup, 1)
        progress = min(max(step - warmup, 0) / span, 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class TrainerSetup:
    """One rank's data, model, optimizer, schedule and precision, and the collectives over its ranks."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
                 warn: Callable[[str], None] | None = None) -> None:
        self.cfg, self.rt, self.log, self.report = cfg, rt, log, report
        self.warn = warn or log
        steady_allocator()  # before the window's rows and the model take their memory
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.deterministic:
            if rt.device.type == "cuda":
                # cuBLAS picks reduction orders per stream workspace unless told a fixed one; torch
                # refuses its matmuls under deterministic algorithms without this (read when this
                # process's first cuBLAS handle is made, which is after this point).
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(cfg.seed)
        self.state = read_state(cfg.feature_state)
        # Streaming: no training row is held; each epoch's are read as they are trained (stream.py).
        self.stream = StreamedWindow(cfg, self.state, rt.rank, rt.world) if cfg.data_mode == "streaming" else None
        self.train_t = to_tensors(read_frame(cfg.train_files), self.state) if self.stream is None else None
        self.train_rows = self.stream.rows if self.stream is not None else len(self.train_t[2])
        if self.stream is not None:
            log(self.stream.describe())
        self.val_t = to_tensors(read_frame(cfg.val_files), self.state)
        if cfg.task == "multiclass_classification":
            if self.train_t is not None:
                check_class_indices(self.train_t[2], cfg.classes, "training")
            check_class_indices(self.val_t[2], cfg.classes, "validation")
        # The factory's module is tried on real rows: the validation rows, in memory in either data mode.
        built = build(cfg, self.state, (self.val_t[0][:SAMPLE_ROWS], self.val_t[1][:SAMPLE_ROWS]))
        if cfg.init_weights is not None:  # before FSDP shards it: each rank keeps its share of the parent's
            load_parent(built.model, cfg.init_weights)
            log(f"fine-tuning from the parent's weights {cfg.init_weights.uri} (sha256 {cfg.init_weights.sha256[:12]})")
        self.model, self.model_rebuild, self.model_name = built.model.to(rt.device), built.rebuild, built.name
        self.param_names = [name for name, _ in self.model.named_parameters()]
        self.net = wrap(self.model, cfg, rt, log)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.micro_batch = max(1, cfg.batch_size // (rt.world * cfg.grad_accum_steps))
        steps = [math.ceil(math.ceil(math.ceil(self.epoch_rows(e) / rt.world) / self.micro_batch)
                           / cfg.grad_accum_steps) for e in range(cfg.epochs)]
        self.steps_per_epoch, self.total_steps = max(steps), sum(steps)
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio))
        self.autocast_dtype, use_scaler = choose_precision(cfg.precision, rt.device, log)
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.criterion = built.criterion
        self.ckpt = CheckpointManager(cfg.checkpoint_root, rank=rt.rank, world=rt.world, mode=cfg.checkpoint_async,
                                      keep_last=cfg.keep_last, log=log, warn=self.warn)
        self.progress = Progress(fingerprint=cfg.fingerprint(), world_size=rt.world)
        self.stats = {"data_wait_s": 0.0, "loop_s": 0.0, "checkpoint_stall_s": 0.0, "checkpoints": 0,
                      "rows": 0, "steps": 0}
        self.resumed_from: int | None = None
        self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="next-epoch")
        self._next: tuple[int, Future] | None = None
        self._last_saved_step = 0
        self._last_save_time = time.monotonic()

    @property
    def val_rows(self) -> int:
        return len(self.val_t[2])

    @property
    def device_type(self) -> str:
        return self.rt.device.type

    @property
    def precision_name(self) -> str:
        return str(self.autocast_dtype or torch.float32).replace("torch.", "")

    def epoch_rows(self, epoch: int) -> int:
        """Rows of an epoch over all ranks (streaming: with padding; its epochs' lengths differ)."""
        if self.stream is not None:
            return self.stream.plan(epoch).rows * self.rt.world
        return self.train_rows

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

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.rt.device.type, dtype=self.autocast_dtype)
