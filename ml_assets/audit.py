"""What ``ml-assets audit`` and ``ml-assets reproduce`` read and check: a registered version's
lineage, how it was trained (full, or fine-tuned along a chain back to a full training), its
evaluation evidence, the checks each of its data days passed, its promotion history, the
candidates the promotion gate refused, and the pins that rebuild it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_assets import lineage as lin
from ml_assets.evaluation.document import EvaluationReport
from ml_assets.evaluation.refusals import SHOWN, line, refusals
from ml_assets.layout import META_FILE, MLFLOW_EVALUATION, WEIGHTS_FILE, Layout, weights_file
from ml_assets.names import repo_for_model
from ml_assets.processes import child_env
from ml_assets.promotion import moves as promotion
from ml_assets.registry import versions as registry
from ml_assets.registry.record import VersionTags
from ml_assets.trainer import code_pin


def collect(client, store, model: str, version: str | None, object_paths=None) -> dict[str, Any]:
    """Everything the audit shows, as one JSON-able dict (raises LineageError/RegistryError)."""
    if version is not None:
        registry.get_version(client, model, version)
    trace = lin.trace(client, store, model, version, None, None, object_paths)
    chain = trace.chain
    mv = client.get_model_version(model, chain["version"])
    tags = VersionTags.from_tags(mv.tags)
    gate = tags.gate
    found = registry.run_json(client, mv.run_id, f"{MLFLOW_EVALUATION}/evaluation_report.json")
    report = EvaluationReport.from_dict(found) if found else None
    config = registry.run_json(client, mv.run_id, "training/train_config.json")
    records = promotion.history(store, model)
    champion = registry.by_alias(client, model, registry.CHAMPION)
    return {
        "model": model, "version": chain["version"], "aliases": chain["aliases"],
        "is_champion": champion is not None and str(champion.version) == chain["version"],
        "registered": {"source": mv.source, "mlflow_run_id": mv.run_id, "partition": tags.partition,
                       "dagster_run_id": tags.dagster_run_id, "dagster_run_url": tags.dagster_run_url},
        "training": {**training_chain(client, model, chain["version"]), **_fine_tune(chain.get("decision") or {})},
        "evidence": {
            "gate": gate and gate.gate, "gate_reason": gate and gate.gate_reason,
            "compared_with_champion": gate and gate.gate_champion_version,
            "report_uri": gate and gate.evaluation_report_uri, "report_sha256": gate and gate.evaluation_report_sha256,
            **_report_evidence(report),
        },
        "data_days": [{"day": d["day"], "role": d["role"], "snapshot_commit": d.get("snapshot_commit"),
                       "checks_passed": (d.get("published") or {}).get("checks_passed"),
                       "published_by_dagster_run": (d.get("published") or {}).get("by_dagster_run"),
                       "drift_calibration": (d.get("published") or {}).get("calibration")}
                      for d in chain.get("days", [])],
        "promotions": [r for r in records if chain["version"] in (r["version"], r["previous"])],
        "promotion_log": f"{repo_for_model(model)}@main:{promotion.log_path(model)}",
        "refused": refusals(store, model),
        "refusals_log": refusals_log(model),
        "pins": {
            "data_commit": tags.data_commit, "data_commits": tags.data_commits, "skipped_days": tags.skipped_days,
            "code_version": tags.code_version, "torch_version": tags.torch_version,
            "world_size": tags.world_size, "seed": (config or {}).get("seed", tags.seed),
            "hyperparameters_source": tags.hyperparameters_source,
            "checkpoint_sha256": tags.checkpoint_sha256, "checkpoint_uri": tags.checkpoint_uri,
            "feature_state_sha256": tags.feature_state_sha256,
            "training_config": config,
        },
        "lineage_checks": [{"what": c.what, "status": c.status, "where": c.where} for c in trace.checks],
        "mismatches": len(trace.mismatches),
    }


def training_chain(client, model: str, version: str) -> dict[str, Any]:
    """How a version was trained (full or fine_tune, and why; a version from before decisions was a full
    training) and the chain its weights went through, oldest (the full training) first: each version's
    partition, decision and weights, and whether it started from its parent's registered weights (its
    ``parent_checkpoint_sha256`` tag against the parent's ``checkpoint_sha256``); then every training
    day's data commit along the chain, with the versions whose window held it. A chain whose parent cannot be
    found is the version alone, and ``broken`` says why."""
    mv = registry.get_version(client, model, version)
    try:
        versions, broken = chain_of(client, model, str(mv.version)), None
    except registry.RegistryError as exc:
        versions, broken = [mv], str(exc)
    links: list[dict[str, Any]] = []
    days: dict[tuple[str, str], list[str]] = {}
    parent: VersionTags | None = None
    for link in versions:
        tags = VersionTags.from_tags(link.tags)
        links.append({"version": str(link.version), "partition": tags.partition,
                      "decision": tags.training_decision or "full", "reason": tags.training_decision_reason,
                      "weights_sha256": tags.checkpoint_sha256, "parent_version": tags.parent_version or None,
                      "started_from_sha256": tags.parent_checkpoint_sha256 or None,
                      "started_from_parent_weights": None if parent is None
                      else tags.parent_checkpoint_sha256 == parent.checkpoint_sha256})
        for day, commit in tags.data_commits.items():
            days.setdefault((day, commit), []).append(str(link.version))
        parent = tags
    own = links[-1]
    return {"decision": own["decision"], "reason": own["reason"],
            "recorded": bool(VersionTags.from_tags(mv.tags).training_decision), "chain": links, "broken": broken,
            "data_commits": [{"day": d, "commit": c, "versions": v} for (d, c), v in sorted(days.items())]}


def _fine_tune(decision: dict[str, Any]) -> dict[str, Any]:
    """What a fine-tune trained on, from its registered training/decision.json (None for a full training)."""
    if decision.get("kind") != "fine_tune" or "fine_tune_days" not in decision:
        return {"fine_tune": None}
    return {"fine_tune": {"days": decision["fine_tune_days"], "epochs": decision.get("epochs"),
                          "learning_rate": decision.get("learning_rate"),
                          "replay_rows": (decision.get("replay") or {}).get("rows", 0)}}


def render_training(t: dict[str, Any]) -> list[str]:
    """The audit's "Training" section: the decision and, for a fine-tune, its chain and data commits."""
    if t["decision"] != "fine_tune":
        why = t["reason"].rstrip(".") if t["recorded"] else "registered before training decisions were recorded"
        return ["## Training: full", "", f"A full training, from scratch: {why}."]
    parent = t["chain"][-1]["parent_version"] or "(none recorded)"
    out = ["## Training: fine_tune", "", f"Fine-tuned from version {parent}: {t['reason'].rstrip('.')}."]
    if ft := t["fine_tune"]:
        out.append(f"It trained {ft['epochs']} epoch(s) at learning rate {ft['learning_rate']} on "
                   f"{', '.join(ft['days'])}, with {ft['replay_rows']} replayed row(s) of older days.")
    if t["broken"]:
        out += ["", f"**Its chain cannot be followed**: {t['broken']}"]
    out += ["", "Its weights went through these trainings, oldest first (the chain back to the last full training):",
            "", "| version | partition | decision | weights sha256 | started from the parent's registered weights |",
            "|---|---|---|---|---|"]
    for link in t["chain"]:
        same = link["started_from_parent_weights"]
        started = ("-" if same is None else "yes" if same else
                   f"**NO**: started from {(link['started_from_sha256'] or 'unrecorded')[:16]}")
        out.append(f"| {link['version']} | {link['partition']} | {link['decision']} | "
                   f"`{link['weights_sha256'][:16]}` | {started} |")
    out += ["", "Every training day's data commit along the chain (each version's window, its data_commits tag):",
            "", "| day | main commit | in the window of versions |", "|---|---|---|"]
    out += [f"| {d['day']} | {d['commit'][:12]} | {', '.join(d['versions'])} |" for d in t["data_commits"]]
    return out


def _report_evidence(report: EvaluationReport | None) -> dict[str, Any]:
    """What the audit shows of the evaluation report, as JSON (None where there is no report)."""
    if report is None:
        return dict.fromkeys(("metrics", "primary_metric", "primary_interval", "champion_metrics", "primary_delta",
                              "test_rows", "test_data_commit", "test_days", "gate_clauses"))
    return {"metrics": report.metrics, "primary_metric": report.primary_metric,
            "primary_interval": list(report.primary_interval),
            "champion_metrics": report.champion.metrics if report.champion else None,
            "primary_delta": list(report.primary_delta) if report.primary_delta else None,
            "test_rows": report.test_rows, "test_data_commit": report.test_data_commit,
            "test_days": list(report.test_days),
            "gate_clauses": [c.to_dict() for c in report.gate.clauses] if report.gate else None}


def render_markdown(a: dict[str, Any]) -> str:
    ev, pins = a["evidence"], a["pins"]
    aliases = ", ".join(f"@{x}" for x in a["aliases"]) or "no alias"
    out = [f"# Audit: {a['model']} version {a['version']} ({aliases})", "",
           f"Registered from partition {a['registered']['partition']} by Dagster run "
           f"{a['registered']['dagster_run_id']} ({a['registered']['dagster_run_url']}); MLflow run "
           f"{a['registered']['mlflow_run_id']}.", "", *render_training(a["training"]), "", "## Evidence", "",
           f"Promotion gate: **{ev['gate']}** against champion {ev['compared_with_champion']}: {ev['gate_reason']}", ""]
    if ev["metrics"]:
        primary = ev["primary_metric"]
        lo, hi = ev["primary_interval"]
        tested = ev["test_days"] or []
        out.append(f"{primary} {ev['metrics'][primary]:.4f} (interval {lo:.4f}..{hi:.4f}) on {ev['test_rows']} "
                   f"held-out rows" + (f" of {', '.join(tested)}" if tested else "")
                   + f" (data commit {ev['test_data_commit']})")
        if ev["primary_delta"]:
            d, dlo, dhi = ev["primary_delta"]
            out.append(f"change over the champion then: {d:+.4f} (interval {dlo:+.4f}..{dhi:+.4f})")
        out += ["", "| metric | value |" + (" champion |" if ev["champion_metrics"] else ""),
                "|---|---|" + ("---|" if ev["champion_metrics"] else "")]
        for m, v in ev["metrics"].items():
            champ = f" {ev['champion_metrics'][m]:.4f} |" if ev["champion_metrics"] else ""
            out.append(f"| {m} | {v:.4f} |{champ}")
        for c in ev["gate_clauses"] or []:
            out.append(f"- {'ok' if c['ok'] else 'FAILED'}: {c['detail'] or c['name']}")
    out += ["", f"Evaluation report: {ev['report_uri']} (sha256 {ev['report_sha256']})", "",
            "## Data: checks each day passed before reaching main", "",
            "| day | role | main commit | checks passed | published by run |", "|---|---|---|---|---|"]
    for d in a["data_days"]:
        out.append(f"| {d['day']} | {d['role']} | {(d['snapshot_commit'] or '')[:12]} | {d['checks_passed']} | "
                   f"{d['published_by_dagster_run']} |")
    calibrations = sorted({d["drift_calibration"] for d in a["data_days"] if d.get("drift_calibration")})
    if calibrations:
        out += ["", f"Drift judged with the calibrated limits of: {'; '.join(calibrations)} (ml-assets calibrate "
                f"{a['model']} --show)"]
    skipped = pins["skipped_days"]
    out += ["", f"Days skipped (training.missing_days: skip): {len(skipped)}"]
    out += [f"- {day}: {why}" for day, why in sorted(skipped.items())]
    out += _history(a)
    cfg = pins["training_config"] or {}
    out += ["", "## Reproducibility pins", "",
            f"- data commit (newest training day): {pins['data_commit']}",
            *[f"  - {day}: {commit}" for day, commit in sorted(pins["data_commits"].items())],
            f"- code version: {pins['code_version']}; torch {pins['torch_version']}",
            f"- world size {pins['world_size']}, seed {pins['seed']}, config: "
            + ", ".join(f"{k}={cfg[k]}" for k in ("family", "epochs", "batch_size", "learning_rate",
                                                  "hidden_sizes", "dropout") if k in cfg),
            f"- hyperparameters from: {pins['hyperparameters_source'] or 'spec'}",
            f"- weights sha256 {pins['checkpoint_sha256']} ({pins['checkpoint_uri']})",
            f"- feature state sha256 {pins['feature_state_sha256']}",
            f"- rebuild: ml-assets reproduce {a['model']} --version {a['version']}", "",
            f"## Lineage: {sum(c['status'] == 'ok' for c in a['lineage_checks'])} of {len(a['lineage_checks'])} "
            f"hashes verified, {a['mismatches']} mismatch(es)"]
    out += [f"- {c['status']}: {c['what']}" for c in a["lineage_checks"] if c["status"] != "ok"]
    return "\n".join(out)


def _history(a: dict[str, Any]) -> list[str]:
    """The audit's promotions of this version, then the model's refused candidates."""
    out = ["", f"## Promotions ({a['promotion_log']})", ""]
    if not a["promotions"]:
        out.append("never promoted")
    for r in a["promotions"]:
        out.append(f"- {r['time']} {r['decision']} version {r['version']} (previous {r['previous']}) by "
                   f"{r['actor']}: {r['reason']}")
    return [*out, "", *render_refusals(a["refused"], a["refusals_log"])]


def refusals_log(model: str) -> str:
    return f"{repo_for_model(model)}@main:{Layout(model).refusals_log}"


def render_refusals(refused: list[dict[str, Any]], log: str) -> list[str]:
    """The model's refused candidates, newest last: each one's metric, its champion and why."""
    out = [f"## Refused candidates ({len(refused)}; {log})", ""]
    if not refused:
        return [*out, "none"]
    if len(refused) > SHOWN:
        out.append(f"the newest {SHOWN} (`--format json` lists them all):")
    return out + [f"- {line(r)}" for r in refused[-SHOWN:]]


def _train(config: Path, world: int) -> tuple[list[str], subprocess.CompletedProcess]:
    """The trainer under torchrun with ``world`` processes, as a plain run (not a Dagster Pipes child)."""
    from ml_assets.training.launcher import TorchrunLauncher

    command = TorchrunLauncher().command(str(config), world, 0)
    env = child_env({**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for name in list(env):
        if name.startswith("DAGSTER_PIPES"):
            env.pop(name)
    return command, subprocess.run(command, env=env)


def _parent_weights(client, mv, tags: VersionTags, recorded: dict, out: Path, given: Path | None) -> tuple[dict, str]:
    """A fine-tune's starting weights for its reproduction, checked against the sha256 it was trained
    from: ``given`` (a reproduced parent), else the parent version's registered weights."""
    expected = recorded["sha256"]
    if given is not None:
        actual = hashlib.sha256(given.read_bytes()).hexdigest()
        if actual != expected:
            raise registry.RegistryError(f"{mv.name} version {mv.version} started from weights {expected}, but the "
                                         f"reproduced parent's are {actual}: the parent was not reproduced bit for bit")
        return {**recorded, "uri": str(given)}, f"the reproduced parent ({given})"
    if not tags.parent_version:
        raise registry.RegistryError(f"{mv.name} version {mv.version} was fine-tuned, but records no parent_version")
    parent = registry.get_version(client, mv.name, tags.parent_version)
    from ml_assets.serving.pyfunc import weights_path

    local = out / "parent"
    weights = weights_path(registry.download_model(client, parent, local))
    if VersionTags.from_tags(parent.tags).checkpoint_sha256 != expected:
        raise registry.RegistryError(f"{mv.name} version {mv.version} started from weights {expected}, but its parent "
                                     f"version {parent.version} holds {VersionTags.from_tags(parent.tags).checkpoint_sha256}")
    return {**recorded, "uri": str(weights)}, f"version {parent.version}'s registered weights"


def exported_weights(export_dir: Path) -> Path:
    """The weights file of a trainer's export (``model.safetensors``, or a booster's ``model.ubj``), as
    its meta.json names it; a network's name when there is no meta.json (a training that failed)."""
    meta = export_dir / META_FILE
    return export_dir / (weights_file(json.loads(meta.read_bytes())) if meta.is_file() else WEIGHTS_FILE)


def chain_of(client, model: str, version: str) -> list:
    """The registered versions a version's weights went through, oldest (its chain's full training) first."""
    chain, seen = [registry.get_version(client, model, version)], {str(version)}
    while (tags := VersionTags.from_tags(chain[0].tags)).training_decision == "fine_tune":
        if not tags.parent_version or tags.parent_version in seen:
            raise registry.RegistryError(f"{model} version {chain[0].version} was fine-tuned but names no earlier "
                                         f"parent ({tags.parent_version or 'none'})")
        seen.add(tags.parent_version)
        chain.insert(0, registry.get_version(client, model, tags.parent_version))
    return chain


def reproduce_chain(client, model: str, version: str, workdir: Path, code_version: str,
                    registered_code: bool = False) -> list[Reproduction]:
    """Rebuild every training of a version's chain from its full training on, each fine-tune from
    the weights its parent's reproduction made; stops at the first that is not bit for bit."""
    done: list[Reproduction] = []
    for mv in chain_of(client, model, version):
        parent = exported_weights(Path(done[-1].output_dir)) if done else None
        done.append(reproduce(client, model, str(mv.version), workdir, code_version, registered_code, parent))
        if not done[-1].identical:
            break
    return done


def _factory_code(client, mv, recorded: dict, out: Path, registered_code: bool) -> str:
    """Where the factory's code is read from: the recorded directory, or the registered copy."""
    path = recorded.get("model_code_path") or ""
    if not registered_code and (not path or Path(path).is_dir()):
        return path
    from ml_assets.serving.pyfunc import code_dir

    local = registry.download_model(client, mv, out / "registered")
    return str(code_dir(local / "artifacts" / META_FILE))


@dataclass
class Reproduction:
    identical: bool
    expected_sha256: str
    actual_sha256: str | None
    reasons: list[str] = field(default_factory=list)
    output_dir: str = ""
    version: str = ""
    started_from: str = ""
    """A fine-tune: whose weights it started from (the parent's registered ones, or a reproduction's)."""


def reproduce(client, model: str, version: str, workdir: Path, code_version: str,
              registered_code: bool = False, parent_weights: Path | None = None) -> Reproduction:
    """Retrain a registered version from its records and compare the weights' sha256. A model
    factory's code is the one at its recorded code path, which must still be the pinned code (else
    the changed files are the reason), or with ``registered_code`` the copy registered with it. A
    fine-tune starts from its parent's registered weights, or ``parent_weights`` (a reproduction of
    the parent, ``reproduce_chain``), which must be the same bytes as those it was trained from."""
    import torch

    from ml_assets.trainer.config import TrainConfig

    mv = registry.get_version(client, model, version)
    tags = VersionTags.from_tags(mv.tags)
    recorded = registry.run_json(client, mv.run_id, "training/train_config.json")
    if recorded is None:
        raise registry.RegistryError(f"{model} version {version} has no training/train_config.json in its MLflow run")
    out = workdir / f"{model}-v{mv.version}"
    if out.exists():  # an earlier reproduction: its finished checkpoint would be resumed, not retrained
        shutil.rmtree(out)
    recorded.update(output_dir=str(out / "export"), checkpoint_dir=str(out / "checkpoints"))
    if recorded.get("model_factory"):
        recorded["model_code_path"] = _factory_code(client, mv, recorded, out, registered_code)
    started_from = ""
    if recorded.get("init_weights"):
        recorded["init_weights"], started_from = _parent_weights(client, mv, tags, recorded["init_weights"], out,
                                                                 parent_weights)
    config = TrainConfig.from_dict(recorded)
    if config.model_factory:
        try:
            code_pin.verify(config.model_code, config.model_code_path)
        except code_pin.ModelContractError as exc:
            return Reproduction(False, VersionTags.from_tags(mv.tags).checkpoint_sha256, None, reasons=[
                f"{exc} (`ml-assets reproduce {model} --version {version} --registered-code` retrains with the "
                "code registered with the version)"])
    workdir.mkdir(parents=True, exist_ok=True)
    path = out / "train_config.json"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json())
    world = int(tags.world_size or 1)
    command, done = _train(path, world)
    expected = tags.checkpoint_sha256
    weights = exported_weights(out / "export")
    actual = hashlib.sha256(weights.read_bytes()).hexdigest() if done.returncode == 0 and weights.exists() else None
    result = Reproduction(actual == expected, expected, actual, output_dir=str(out / "export"), version=str(mv.version),
                          started_from=started_from)
    if actual is None:
        result.reasons.append(f"the trainer exited with code {done.returncode}; its log is above")
    if tags.code_version != code_version:
        result.reasons.append(f"the code version differs: registered with {tags.code_version}, "
                              f"this checkout is {code_version}")
    if tags.torch_version and tags.torch_version != torch.__version__:
        result.reasons.append(f"torch differs: {tags.torch_version} then, {torch.__version__} now")
    if not result.identical and actual is not None and not result.reasons:
        result.reasons.append("same code, data, config, seed and world size, yet different weights: "
                              "a nondeterministic kernel (set training.deterministic: true) or different hardware")
    print(f"[reproduce] {sys.executable} ran {' '.join(command[1:4])} ... with {world} process(es)", file=sys.stderr)
    return result
