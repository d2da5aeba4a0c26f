"""Exercise the trainer's CUDA paths on a machine with a GPU, and print what each run measured.

    # on any machine with the project installed: the bundled model's real features, 60 days
    python scripts/gpu_check.py prepare /tmp/gpu-inputs --days 60
    # on the GPU machine (the inputs folder copied there; the trainer's own imports installed)
    python scripts/gpu_check.py run /tmp/gpu-inputs --json results.json

Each case is one training under ``ml_assets.trainer.agent`` (torchrun) with one rank per GPU, as the
``trained_checkpoint`` asset runs it: nccl, bf16 autocast (``precision: auto``), fp16 with a
GradScaler, fp32, pinned memory with DataLoader workers, streaming windows, FSDP2, a large
residual MLP, the FT-Transformer example, deterministic runs compared bit for bit, and an exact
resume after SIGKILL compared with the same training uninterrupted. The first case runs on the CPU
of the same machine (gloo, fp32) as the baseline. A case that fails is reported with its last log
lines and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ft_transformer"
FT = {"model_factory": "ft_transformer.model:build", "model_code_path": str(EXAMPLE),
      "model_params": {"d_token": 32, "n_blocks": 2, "n_heads": 4, "attention_dropout": 0.2, "ffn_dropout": 0.1}}
RECIPE = {"epochs": 4, "batch_size": 256, "learning_rate": 3e-3, "report_every_steps": 50,
          "checkpoint_every_seconds": 0.0}
CPU = {"CUDA_VISIBLE_DEVICES": ""}

# (name, TrainConfig fields over RECIPE, extra environment)
CASES: list[tuple[str, dict, dict]] = [
    ("cpu_fp32", {"precision": "fp32"}, CPU),
    ("cuda_auto", {"precision": "auto"}, {}),
    ("cuda_fp16_gradscaler", {"precision": "fp16"}, {}),
    ("cuda_fp32", {"precision": "fp32"}, {}),
    ("cuda_auto_pinned_workers", {"pin_memory": True, "num_workers": 2}, {}),
    ("cuda_auto_streaming", {"data_mode": "streaming"}, {}),
    ("cuda_auto_batch4096", {"batch_size": 4096, "learning_rate": 1e-2}, {}),
    ("cuda_fsdp_bf16", {"strategy": "fsdp", "fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32"}, {}),
    ("cuda_residual_2048x3", {"family": "residual_mlp", "hidden_sizes": [2048, 2048, 2048], "batch_size": 1024,
                              "learning_rate": 1e-3, "epochs": 2}, {}),
    ("cpu_residual_2048x3", {"family": "residual_mlp", "hidden_sizes": [2048, 2048, 2048], "batch_size": 1024,
                             "learning_rate": 1e-3, "epochs": 2, "precision": "fp32", "max_steps": 40}, CPU),
    ("cuda_ft_transformer", {**FT, "epochs": 2}, {}),
    ("cuda_deterministic_a", {"deterministic": True, "precision": "fp32"}, {}),
    ("cuda_deterministic_b", {"deterministic": True, "precision": "fp32"}, {}),
]
CASE_TIMEOUT_S = 150
STEP = re.compile(r"step (\d+)/\d+ ")


def prepare(folder: Path, days: int) -> None:
    from benchmarks._training import bundled_inputs

    inputs = bundled_inputs(folder, days)
    names = {"train_files": [Path(r.uri).name for r in inputs["train_files"]],
             "val_files": [Path(r.uri).name for r in inputs["val_files"]],
             "feature_state": Path(inputs["feature_state"].uri).name, "model": inputs["model"], "task": inputs["task"]}
    (folder / "inputs.json").write_text(json.dumps(names, indent=1))
    print(f"{folder}: {days} days of features; copy the folder to the GPU machine")


def inputs_of(folder: Path) -> dict:
    import hashlib

    from ml_assets.trainer.config import DataRef

    names = json.loads((folder / "inputs.json").read_text())

    def ref(name: str) -> DataRef:
        return DataRef(uri=str(folder / name), sha256=hashlib.sha256((folder / name).read_bytes()).hexdigest())

    return {"model": names["model"], "task": names["task"], "train_files": [ref(n) for n in names["train_files"]],
            "val_files": [ref(n) for n in names["val_files"]], "feature_state": ref(names["feature_state"])}


def command(config: Path) -> list[str]:
    return [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", "--nproc_per_node=1",
            "--max-restarts=0", "-m", "ml_assets.trainer", "--config", str(config)]


def start(inputs: dict, fields: dict, env: dict, work: Path, log: Path) -> subprocess.Popen:
    from ml_assets.trainer.config import TrainConfig

    cfg = TrainConfig(**inputs, output_dir=str(work / "out"), **{**RECIPE, **fields})
    (work / "config.json").write_text(cfg.to_json())
    return subprocess.Popen(command(work / "config.json"), stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, **env}, cwd=ROOT)


def finish(proc: subprocess.Popen, work: Path, log: Path, started: float) -> dict:
    try:
        code = proc.wait(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = f"killed after {CASE_TIMEOUT_S} s"
    wall = time.perf_counter() - started
    if code != 0:
        return {"ok": False, "exit": code, "wall_s": round(wall, 1), "log_tail": log.read_text()[-3000:]}
    meta = json.loads((work / "out" / "meta.json").read_text())
    report = json.loads((work / "out" / "report.json").read_text())["metadata"]
    value = {k: (v["raw_value"] if isinstance(v, dict) and "raw_value" in v else v) for k, v in report.items()}
    acct = meta["accounting"]
    return {"ok": True, "wall_s": round(wall, 1), "device": value.get("device"), "backend": value.get("backend"),
            "precision": value.get("precision"), "samples_per_s": round(acct["samples_per_s"]),
            "data_wait_pct": round(100 * acct["data_wait_fraction"], 2), "steps": meta["steps"],
            "best_val_loss": meta["best_val_loss"], "weights_sha256": meta["weights_sha256"],
            "gpu_hours": acct["gpu_hours"], "resumed_from_step": meta["resumed_from_step"],
            "precision_log": [line for line in log.read_text().splitlines() if "precision" in line.lower()][:2]}


def run_case(inputs: dict, fields: dict, env: dict, tmp: Path, name: str) -> dict:
    work = tmp / name
    work.mkdir()
    log = work / "log.txt"
    started = time.perf_counter()
    return finish(start(inputs, fields, env, work, log), work, log, started)


def resume_case(inputs: dict, tmp: Path, kill_at: int = 150) -> dict:
    """SIGKILL the whole tree after step ``kill_at``, start the same config again, and compare its
    weights with an uninterrupted deterministic run's."""
    fields = {"deterministic": True, "precision": "fp32", "checkpoint_every_steps": 50, "report_every_steps": 10}
    work = tmp / "cuda_kill_resume"
    work.mkdir()
    log = work / "log.txt"
    started = time.perf_counter()
    proc = start(inputs, fields, {}, work, log)
    deadline = time.monotonic() + CASE_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        steps = [int(s) for s in STEP.findall(log.read_text())]
        if steps and max(steps) >= kill_at:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        return {"ok": False, "why": "finished or failed before the kill", "log_tail": log.read_text()[-3000:]}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(int(s) for s in STEP.findall(log.read_text()))
    result = finish(start(inputs, fields, {}, work, log), work, log, started)
    result["killed_after_step"] = killed_at
    return result


def run(folder: Path, out: Path | None, only: list[str]) -> int:
    import torch

    inputs = inputs_of(folder)
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda,
             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
             "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(), "cpus": os.cpu_count(),
             "train_rows": None}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ml_assets-gpu-") as tmp:
        for name, fields, env in CASES:
            if only and name not in only:
                continue
            results[name] = run_case(inputs, fields, env, Path(tmp), name)
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "log_tail"}), flush=True)
            if not results[name]["ok"]:
                print(results[name]["log_tail"], flush=True)
        if not only or "cuda_kill_resume" in only:
            results["cuda_kill_resume"] = resume_case(inputs, Path(tmp))
            print("cuda_kill_resume", json.dumps({k: v for k, v in results["cuda_kill_resume"].items()
                                                  if k != "log_tail"}), flush=True)
    a, b, k = (results.get(n, {}) for n in ("cuda_deterministic_a", "cuda_deterministic_b", "cuda_kill_resume"))
    if a.get("ok") and b.get("ok"):
        facts["deterministic_runs_identical"] = a["weights_sha256"] == b["weights_sha256"]
    if a.get("ok") and k.get("ok"):
        facts["resume_identical_to_uninterrupted"] = a["weights_sha256"] == k["weights_sha256"]
    print("facts", json.dumps(facts), flush=True)
    if out:
        out.write_text(json.dumps({"facts": facts, "results": results}, indent=1))
    return 0 if all(r.get("ok") for r in results.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="write the bundled model's features for the check")
    p.add_argument("folder", type=Path)
    p.add_argument("--days", type=int, default=60)
    r = sub.add_parser("run", help="train each case on this machine")
    r.add_argument("folder", type=Path)
    r.add_argument("--json", type=Path, default=None, help="write every case's figures here")
    r.add_argument("--only", nargs="*", default=[], help="case names (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.verb == "prepare":
        prepare(args.folder.resolve(), args.days)
        return 0
    return run(args.folder.resolve(), args.json, args.only)


if __name__ == "__main__":
    sys.exit(main())
