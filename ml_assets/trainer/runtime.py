"""How one training rank lives, apart from what it trains: its process group and device, its
precision, the signals that stop it, the checkpoint directory's lease, and its exit codes.
Pure PyTorch, like the rest of the trainer (ml_assets.trainer.train runs it)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ml_assets import processes
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.lease import Holder, Lease, LeaseError, lease_store

EXIT_PREEMPTED = 75
"""Exit code after SIGTERM once the checkpoint is written (EX_TEMPFAIL: try again later)."""
EXIT_CONFIG = 2
EXIT_LEASE = 73
"""The checkpoint directory's lease is held by another training, or was lost (EX_CANTCREAT)."""
EXIT_STORAGE = 74
"""A storage fault a restart cannot fix (EX_IOERR; ml_assets.trainer.faults)."""


@dataclass(frozen=True)
class Runtime:
    rank: int
    world: int
    device: torch.device
    backend: str

    @property
    def master(self) -> bool:
        return self.rank == 0


def compute_init() -> Runtime:
    """Join the process group torchrun describes (gloo on CPU, nccl on CUDA)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return Runtime(rank, world, torch.device("cuda", local), backend)
    return Runtime(rank, world, torch.device("cpu"), backend)


MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
"""glibc's allocator settings for a training process (``steady_allocator``): blocks up to 32 MiB come
from the heap, and the heap gives memory back to the system once 64 MiB lie free at its top."""


def steady_allocator() -> bool:
    """Fix glibc malloc's thresholds for the life of the process; True when set.

    By default glibc moves its mmap threshold as blocks are freed, so whether a step's activations
    (a few MiB each for an attention layer over a batch) come from a fresh mmap, page-faulted and
    zeroed on every step, or from the heap depends on the process's allocation history: two processes running
    the same loop can differ several times over in page faults, and by several percent in
    samples/s (python -m benchmarks.custom_overhead shows both). Fixed thresholds make a training
    step cost the same in every process. A user's own MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is
    left alone, as is a C library without ``mallopt`` (musl's is a no-op, macOS has none)."""
    if any(os.environ.get(name) for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, TRIM_THRESHOLD))


def compute_cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def cpu_supports_bf16() -> bool:
    """Native bf16 arithmetic (AVX512-BF16 or AMX); elsewhere bf16 autocast is slower than fp32."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def choose_precision(requested: str, device: torch.device, log: Callable[[str], None]) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether a GradScaler is needed)."""
    if device.type == "cuda":
        if requested == "fp32":
            return None, False
        if requested in ("auto", "bf16") and torch.cuda.is_bf16_supported():
            return torch.bfloat16, False
        if requested == "bf16":
            log("precision bf16 requested but this GPU lacks bf16: using fp16 with a GradScaler")
        return torch.float16, True
    if requested in ("auto", "bf16"):
        if cpu_supports_bf16():
            return torch.bfloat16, False
        log(f"precision {requested}: this CPU has no native bf16 (AVX512-BF16/AMX), where bf16 autocast is "
            "slower than fp32; training in fp32")
    elif requested == "fp16":
        log("precision fp16 is for CUDA; training in fp32 on the CPU")
    return None, False


class Preempted(Exception):
    pass


class StopSignal:
    """SIGTERM (and SIGINT) set a flag; the loop checks it between optimizer steps. A watchdog ends
    the process after the grace period if the checkpoint cannot be finished in time."""

    def __init__(self, grace: float, warn: Callable[[str], None]) -> None:
        self.requested = False
        self.grace, self.warn = grace, warn
        self.signal_name = ""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame) -> None:
        if self.requested:
            return
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        timer = threading.Timer(self.grace, self._give_up)
        timer.daemon = True
        timer.start()

    def _give_up(self) -> None:
        self.warn(f"{self.signal_name}: no checkpoint within the {self.grace:.0f}s grace period; exiting without it "
                  "(the previous checkpoint stays the resume point)")
        os._exit(EXIT_PREEMPTED)


class LeaseUnavailable(Exception):
    """This training may not write its checkpoint directory (another one holds its lease)."""


def take_lease(cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], warn: Callable[[str], None]) -> Lease | None:
    """Rank 0 takes the checkpoint directory's lease, waiting up to ``lease_wait_seconds`` for another
    training of the same config to release it; every rank learns the verdict (the others get None)."""
    lease, problem = None, ""
    if rt.master:
        try:
            lease = Lease(lease_store(cfg.checkpoint_root), Holder.this_process(cfg.owner),
                          ttl_seconds=cfg.lease_ttl_seconds, log=log, warn=warn)
            lease.acquire(cfg.lease_wait_seconds)
        except LeaseError as exc:
            lease, problem = None, str(exc)
    failed = bool(problem)
    if rt.world > 1:
        verdict = torch.tensor([float(failed)], device=rt.device)
        dist.broadcast(verdict, src=0)
        failed = bool(verdict.item())
    if failed:
        raise LeaseUnavailable(problem or "rank 0 could not take the checkpoint directory's lease")
    if lease is not None:
        if lease.took_over or lease.waited_seconds >= 1:
            log(f"checkpoint lease {lease.store.location} taken after {lease.waited_seconds:.1f}s")

        def lost(exc: LeaseError) -> None:
            # Another trainer owns the directory now: writing on would interleave two trainings.
            warn(f"{exc}; stopping without writing anything more")
            os._exit(EXIT_LEASE)

        lease.start_renewing(lost)
        if (line := processes.lifeline()) is not None:
            line.before_exit.append(lease.release)  # an orphan ended by its lifeline frees it at once
    return lease


def restarts_left() -> int:
    """Under torchrun: how many more times the agent will restart this worker group."""
    try:
        return int(os.environ["TORCHELASTIC_MAX_RESTARTS"]) - int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    except (KeyError, ValueError):
        return 0


def stop_the_agent(any_rank: bool = False) -> None:
    """A preempted worker must not be restarted in place (the node is going away and the retry will
    resume elsewhere), nor one that may not write its checkpoints: ask the local torchrun agent, our
    parent (a forked rank's client's), to shut down. One rank per node (``any_rank``: the rank that met
    a fault the others may not have); never once the agent is gone (the parent is then init or a
    subreaper)."""
    if (os.environ.get("LOCAL_RANK") != "0" and not any_rank) or "TORCHELASTIC_RUN_ID" not in os.environ \
            or processes.orphaned():
        return
    if (agent := processes.launcher()) > 1:
        os.kill(agent, signal.SIGTERM)
