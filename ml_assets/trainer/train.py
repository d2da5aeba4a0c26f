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
import gc
import sys
import time
import traceback
from collections.abc import Callable

import torch

from ml_assets import processes
from ml_assets.trainer.boost import TrackerError
from ml_assets.trainer.channel import Channel
from ml_assets.trainer.code_pin import ModelContractError
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import read_verified
from ml_assets.trainer.faults import permanent_fault
from ml_assets.trainer.report import result_metadata, write_report
from ml_assets.trainer.runtime import (
    EXIT_CONFIG,
    EXIT_LEASE,
    EXIT_PREEMPTED,
    EXIT_STORAGE,
    LeaseUnavailable,
    Preempted,
    Runtime,
    StopSignal,
    compute_cleanup,
    compute_init,
    stop_the_agent,
    take_lease,
)


def run(cfg: TrainConfig, rt: Runtime, log: Callable[[str], None], report: Callable[[dict], None],
        warn: Callable[[str], None]) -> dict:
    # A network's modules only (DCP among them, about a second of a rank's start): a booster's rank
    # never imports them.
    from ml_assets.trainer.checkpoint import export_model
    from ml_assets.trainer.loop import Trainer

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
                **trainer.model_rebuild,
                "history": p.history, "stop_reason": p.stop_reason, "steps": p.step, "best_val_loss": p.best_val_loss,
                "weights_from": which, "train_rows": trainer.train_rows, "val_rows": len(trainer.val_t[2]),
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
        result["lease"] = lease.summary()
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
    channel = Channel(rt.master)
    code, result = 0, None
    try:
        try:
            result = _train(cfg)(cfg, rt, channel.log, channel.report, channel.warn)
        except Preempted:
            code = EXIT_PREEMPTED
            stop_the_agent()
        except (ModelContractError, TrackerError) as exc:
            # The same on every restart: say why once and stop, with nothing written.
            channel.warn(str(exc))
            channel.report({"kind": "refused", "message": str(exc)})
            code = EXIT_CONFIG
            stop_the_agent()
        except LeaseUnavailable as exc:
            # Not a crash: a restart would only wait again. Rank 0 says why, the agent stops.
            channel.warn(str(exc))
            channel.report({"kind": "lease_held", "message": str(exc)})
            code = EXIT_LEASE
            stop_the_agent()
        except BaseException as exc:
            if (fault := permanent_fault(exc)) is None:
                channel.failed(exc)
                raise
            traceback.print_exc()  # the detail, for whoever reads the rank's log
            channel.refuse(fault, rt.rank)
            code = EXIT_STORAGE
            stop_the_agent(any_rank=True)
        else:
            if rt.master:
                _report_export(cfg, rt, result, channel)
        channel.close()
    finally:
        # DDP's reducer and the optimizer go before the process group: a DDP object collected after
        # destroy_process_group can leave a rank hanging at exit.
        result = None
        gc.collect()
        compute_cleanup()
    return code


def _train(cfg: TrainConfig) -> Callable[..., dict]:
    """The loop a config trains with: boosting rounds (ml_assets.trainer.boost) or the network's steps."""
    if cfg.family == "xgboost":
        from ml_assets.trainer.boost import run as boost

        return boost
    return run


def _report_export(cfg: TrainConfig, rt: Runtime, result: dict, channel: Channel) -> None:
    """Rank 0, after a training that finished: the export's line in the log, report.json, and the
    materialization Pipes carries to Dagster."""
    saved, trainer, acct = result["export"], result["trainer"], result["accounting"]
    channel.log(f"exported {saved['uri']} sha256 {saved['sha256'][:12]} ({result['weights_from']}); "
                f"{acct['samples_per_s']:,.0f} samples/s, data wait {100 * acct['data_wait_fraction']:.1f}%")
    report_meta = result_metadata(cfg, rt, trainer, saved, acct, result["weights_from"], result.get("lease"))
    # Beside the export, with or without Dagster: what a run by hand (or a reproduction)
    # reports, in the same form Pipes carries it.
    write_report(cfg.output_dir, report_meta, saved["sha256"])
    if channel.pipes is not None:
        channel.pipes.report_asset_materialization(metadata=report_meta, data_version=saved["sha256"])


__all__ = ["main", "run"]


if __name__ == "__main__":
    sys.exit(main())
