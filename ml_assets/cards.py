"""Model cards (Mitchell et al. 2019, "Model Cards for Model Reporting"), one per registered
version, generated from the records rather than written by hand: the spec (intended use, owner,
features, the card section), the version's tags (training window, data commits, pins, how it was
trained: full, or fine-tuned along a chain of versions), its
evaluation report (metrics with intervals, baselines, the champion then, slices, the gate), the
promotion log (decisions and history) and the evaluation's plots.

Markdown for the Dagster UI and the terminal; HTML with the plots embedded (data URIs, no external
resource) for an auditor's browser. Both are logged to the version's MLflow run under ``card/``:
when it is registered and again when a promotion or rollback involves it.
"""

from __future__ import annotations

import base64
import html
import math
import tempfile
from pathlib import Path
from typing import Any

from ml_assets.evaluation.document import EvaluationReport
from ml_assets.layout import MLFLOW_EVALUATION, MLFLOW_PLOTS
from ml_assets.registry.record import VersionTags
from ml_assets.spec import ModelSpec

MLFLOW_CARD = "card"
MARKDOWN_FILE = "model_card.md"
HTML_FILE = "model_card.html"
CARD_TAG = "model_card"
"""The model version's tag naming its card: ``runs:/<run>/card/model_card.html``."""
PLOTS = ("roc.png", "precision_recall.png", "calibration.png", "confusion_matrix.png", "residuals.png", "slices.png",
         "loss_curves.png")
"""The evaluation's plots a card shows, in this order, where the task has them."""


def collect(client, spec: ModelSpec, version: str, promotions: list[dict[str, Any]],
            refused: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Everything a card shows of one version (``report``: its EvaluationReport, None without one). ``promotions``: the promotion log's records
    (ml_assets.promotion.moves.history); those naming this version are kept. ``refused``: the refused
    candidates (ml_assets.evaluation.refusals); the newest held against this version are kept."""
    from ml_assets.audit import training_chain
    from ml_assets.evaluation.refusals import SHOWN
    from ml_assets.registry import versions as registry

    mv = registry.get_version(client, spec.name, version)
    registry.check_loadable(client, mv)  # a card describes a model that can be served, or none
    tags = VersionTags.from_tags(mv.tags)
    champion = registry.by_alias(client, spec.name, registry.CHAMPION)
    found = registry.run_json(client, mv.run_id, f"{MLFLOW_EVALUATION}/evaluation_report.json")
    report = EvaluationReport.from_dict(found) if found else None
    config = registry.run_json(client, mv.run_id, "training/train_config.json") or {}
    return {
        "model": spec.name, "version": str(mv.version), "aliases": sorted(getattr(mv, "aliases", []) or []),
        "is_champion": champion is not None and str(champion.version) == str(mv.version),
        "description": spec.description, "owner": spec.owner, "team": spec.team,
        "card": spec.card.model_dump(mode="json"), "task": spec.target.task,
        "target": {"name": spec.target.name, "expression": spec.target.expression, "classes": spec.target.classes},
        "architecture": tags.model_factory or spec.model.family_name,
        "source": spec.source.kind, "partition": tags.partition, "registered_at": mv.creation_timestamp,
        "data_commits": tags.data_commits, "skipped_days": tags.skipped_days,
        "training": training_chain(client, spec.name, str(mv.version)),
        "hyperparameters": {
            k: config[k] for k in ("epochs", "batch_size", "learning_rate", "weight_decay", "hidden_sizes", "dropout",
                                   "model_params") if config.get(k) not in (None, {}, [])},
        "features": {"numeric": spec.features.numeric_names, "categorical": spec.features.categorical_names},
        "report": report, "mlflow_run_id": mv.run_id,
        "pins": {"weights_sha256": tags.checkpoint_sha256, "feature_state_sha256": tags.feature_state_sha256,
                 "code_version": tags.code_version, "torch_version": tags.torch_version,
                 "model_code_sha256": tags.model_code_sha256, "dagster_run_url": tags.dagster_run_url},
        "promotions": [r for r in promotions if str(version) in (str(r.get("version")), str(r.get("previous")))],
        "refused": [r for r in refused if str(r.get("champion_version")) == str(mv.version)][-SHOWN:],
    }


def limits(card: dict[str, Any]) -> list[str]:
    """What the evaluation found that a user of the model should know, in plain sentences."""
    report: EvaluationReport | None = card["report"]
    found = _evaluation_limits(report) if report else []
    if card["skipped_days"]:
        found.append(f"trained without {len(card['skipped_days'])} day(s) of its window: "
                     + "; ".join(f"{d} ({why})" for d, why in sorted(card["skipped_days"].items())))
    for clause in report.gate.clauses if report and report.gate else ():
        if not clause.ok:
            found.append(f"failed at registration: {clause.detail or clause.name}")
    found += _chain_limits(card.get("training"))
    found += card["card"]["considerations"]
    return found


def _chain_limits(training: dict[str, Any] | None) -> list[str]:
    """A fine-tune whose chain is broken, or one of whose trainings did not start from its parent's
    registered weights."""
    if not training or training["decision"] != "fine_tune":
        return []
    if training["broken"]:
        return [f"its chain of trainings cannot be followed: {training['broken']}"]
    chain = training["chain"]
    return [f"version {child['version']} started from weights (sha256 {(child['started_from_sha256'] or '?')[:16]}) "
            f"that are not version {parent['version']}'s registered weights ({parent['weights_sha256'][:16]})"
            for parent, child in zip(chain, chain[1:], strict=False) if child["started_from_parent_weights"] is False]


def _evaluation_limits(report: EvaluationReport) -> list[str]:
    found, primary = [], report.primary_metric
    lo, hi = report.primary_interval
    if primary and not math.isnan(lo):
        found.append(f"{primary} is known only to within {lo:.4f}..{hi:.4f} ({report.confidence_level:.0%} "
                     f"interval, {report.test_rows} held-out rows of {', '.join(report.test_days)})")
    slices = [s for s in report.slices if s.metric is not None]
    if primary and slices and (value := report.metrics.get(primary)) is not None:
        worst = min(slices, key=lambda s: s.metric)
        found.append(f"weakest slice: {worst.column}={worst.value} ({worst.rows} rows), {primary} "
                     f"{worst.metric:.4f} against {value:.4f} overall")
    too_small = [f"{s.column}={s.value}" for s in report.slices if s.reason]
    if too_small:
        found.append(f"{len(too_small)} slice(s) too small to judge: {', '.join(too_small[:8])}"
                     + (" ..." if len(too_small) > 8 else ""))
    for regression in report.slice_regressions:
        found.append(f"worse than the champion on a slice: {regression.to_dict()}")
    ece = report.metrics.get("ece")
    if ece is not None:
        found.append(f"calibration: expected calibration error {ece:.4f} (a probability of p means about p, "
                     f"give or take this much)")
    return found


def training_lines(card: dict[str, Any]) -> list[str]:
    """How the version was trained, in a few lines: full (and why), or the fine-tune of which parent
    (and why) and the chain of trainings its weights carry, back to the last full one."""
    t = card["training"]
    if t["decision"] != "fine_tune":
        why = t["reason"].rstrip(".") if t["recorded"] else "registered before training decisions were recorded"
        return [f"**Training**: a full training, from scratch: {why}."]
    chain = t["chain"]
    parent = chain[-2] if len(chain) > 1 else {"version": chain[-1]["parent_version"], "partition": "?"}
    out = [f"**Training**: fine-tuned from version {parent['version']} (partition {parent['partition']}), "
           f"starting from its weights: {t['reason'].rstrip('.')}."]
    if t["broken"]:
        return [*out, "", f"Its chain cannot be followed: {t['broken']}."]
    steps = [f"version {link['version']} ({'a full training' if link['decision'] != 'fine_tune' else 'a fine-tune'}"
             f" for {link['partition']})" for link in chain]
    steps[-1] = steps[-1].replace("(", "(this one: ", 1)
    return [*out, "", f"Its weights carry {len(chain)} trainings, back to the last full one: {' → '.join(steps)}. "
            f"`ml-assets audit {card['model']} --version {card['version']}` lists each day they trained on with "
            f"its data commit; `ml-assets reproduce {card['model']} --version {card['version']} --chain` rebuilds "
            "them in order."]


def render_markdown(card: dict[str, Any]) -> str:
    report, pins = card["report"], card["pins"]
    aliases = ", ".join(f"@{a}" for a in card["aliases"]) or "no alias"
    status = "in production (@champion)" if card["is_champion"] else aliases
    out = [f"# Model card: {card['model']} version {card['version']}", "",
           f"**Status**: {status}. **Owner**: {card['owner']} (team {card['team']}). **Trained for** partition {card['partition']}.", "",
           *training_lines(card), "",
           "## Intended use", "", card["card"]["intended_use"] or card["description"] or "(the spec says nothing)"]
    if card["card"]["out_of_scope"]:
        out += ["", "Not for:", *[f"- {x}" for x in card["card"]["out_of_scope"]]]
    target = card["target"]
    out += ["", "## Model", "",
            f"- task: {card['task']}; predicts `{target['name']}` = `{target['expression']}`"
            + (f" (classes {', '.join(target['classes'])})" if target["classes"] else ""),
            f"- architecture: {card['architecture']}; hyperparameters: "
            + ", ".join(f"{k}={v}" for k, v in card["hyperparameters"].items()),
            f"- features ({len(card['features']['numeric'])} numeric, {len(card['features']['categorical'])} "
            f"categorical): {', '.join(card['features']['numeric'] + card['features']['categorical'])}",
            "", "## Training data", "",
            f"Source: {card['source']}. {len(card['data_commits'])} day(s) of rows, each read from the main commit "
            "that published it after its checks:", "", "| day | main commit |", "|---|---|"]
    out += [f"| {day} | `{commit[:16]}` |" for day, commit in sorted(card["data_commits"].items())]
    out += ["", "## Evaluation", ""]
    out += _evaluation_section(report) if report else [
        "(no evaluation report was found in the version's MLflow run)"]
    gate = report.gate if report else None
    out += ["", "## Promotion", "",
            f"Gate at registration: **{'passed' if gate is None or gate.passed else 'failed'}**"
            + (f" ({gate.reason})" if gate and gate.reason else "")]
    out += [f"- {'ok' if c.ok else 'FAILED'}: {c.detail or c.name}" for c in gate.clauses] if gate else []
    out += ["", "History:" if card["promotions"] else "Never promoted."]
    out += [f"- {r.get('time', '')}: {r.get('decision', r.get('action'))}, version {r.get('version')} over "
            f"{r.get('previous') or 'none'}, by {r.get('actor')}: {r.get('reason')}" for r in card["promotions"]]
    if card["refused"]:
        from ml_assets.evaluation.refusals import line

        out += ["", f"Candidates refused while this version was champion (the newest {len(card['refused'])}):"]
        out += [f"- {line(r)}" for r in card["refused"]]
    out += ["", "## Limits the evaluation found", "", *[f"- {x}" for x in limits(card)]]
    out += ["", "## Reproduce and trace", "",
            f"- weights sha256 `{pins['weights_sha256']}`; feature state sha256 `{pins['feature_state_sha256']}`",
            f"- code version {pins['code_version']}, torch {pins['torch_version']}"
            + (f", model code sha256 `{pins['model_code_sha256']}`" if pins["model_code_sha256"] else ""),
            f"- `ml-assets reproduce {card['model']} --version {card['version']}`; "
            f"`ml-assets lineage {card['model']} --version {card['version']}`",
            f"- trained by {pins['dagster_run_url'] or 'a Dagster run'}; MLflow run {card['mlflow_run_id']}"]
    return "\n".join(out) + "\n"


def _evaluation_section(report: EvaluationReport) -> list[str]:
    primary, metrics = report.primary_metric, report.metrics
    lo, hi = report.primary_interval
    out = [f"Held-out days {', '.join(report.test_days)} ({report.test_rows} rows, data "
           f"commit `{report.test_data_commit[:16]}`). Primary metric **{primary}** "
           f"{metrics.get(primary, float('nan')):.4f}, interval {lo:.4f}..{hi:.4f}.", ""]
    baselines = {b.name: b.metrics for b in report.baseline.baselines} if report.baseline else {}
    champion = (report.champion.metrics if report.champion else None) or {}
    head = ["metric", "this model", *baselines, *(["champion then"] if champion else [])]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, value in metrics.items():
        cells = [f"{value:.4f}", *[_num(b.get(name)) for b in baselines.values()],
                 *([_num(champion.get(name))] if champion else [])]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    judged = [s for s in report.slices if s.metric is not None]
    if judged:
        out += ["", f"Slices ({primary}):", "", "| slice | rows | value |", "|---|---|---|"]
        out += [f"| {s.column}={s.value} | {s.rows} | {s.metric:.4f} |" for s in sorted(judged, key=lambda s: s.metric)]
    return out


def _num(value) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else "-"


def render_html(card: dict[str, Any], markdown_text: str, plots: dict[str, bytes]) -> str:
    """One self-contained page: the card's markdown as HTML, then the plots as data URIs. Raw HTML in
    the markdown (a spec's description, a reason someone typed) is shown as text, never run."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    figures = "".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption>{html.escape(name.removesuffix('.png').replace('_', ' '))}</figcaption></figure>"
        for name, data in plots.items())
    title = html.escape(f"Model card: {card['model']} version {card['version']}")
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}"
             "code{background:#f4f4f4}figure{display:inline-block;margin:.5rem;max-width:28rem}"
             "img{max-width:100%}figcaption{text-align:center;color:#555}")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{style}</style></head><body>{body}"
            + (f"<h2>Plots</h2>{figures}" if figures else "") + "</body></html>\n")


def plots(client, run_id: str | None) -> dict[str, bytes]:
    """The evaluation's plots logged to the run, by file name (those the task has)."""
    from mlflow.exceptions import MlflowException

    found: dict[str, bytes] = {}
    if not run_id:
        return found
    with tempfile.TemporaryDirectory(prefix="ml_assets-card-") as tmp:
        try:
            local = Path(client.download_artifacts(run_id, MLFLOW_PLOTS, tmp))
        except (MlflowException, OSError):
            return {}
        for name in PLOTS:
            if (local / name).exists():
                found[name] = (local / name).read_bytes()
    return found


def build(client, spec: ModelSpec, version: str, promotions: list[dict[str, Any]],
          refused: list[dict[str, Any]] = ()) -> tuple[str, str]:
    """The card of ``version`` as (markdown, html)."""
    card = collect(client, spec, version, promotions, refused)
    text = render_markdown(card)
    return text, render_html(card, text, plots(client, card["mlflow_run_id"]))


def publish(client, spec: ModelSpec, version: str, promotions: list[dict[str, Any]],
            refused: list[dict[str, Any]] = ()) -> str:
    """Build the card and log it to the version's MLflow run (``card/``); returns the markdown. A
    version registered by hand without a run gets no logged card (``ml-assets card`` still builds it)."""
    from ml_assets.registry import versions as registry

    text, page = build(client, spec, version, promotions, refused)
    run_id = registry.get_version(client, spec.name, version).run_id
    if not run_id:
        return text
    with tempfile.TemporaryDirectory(prefix="ml_assets-card-") as tmp:
        (Path(tmp) / MARKDOWN_FILE).write_text(text, encoding="utf-8")
        (Path(tmp) / HTML_FILE).write_text(page, encoding="utf-8")
        client.log_artifacts(run_id, tmp, MLFLOW_CARD)
    # The version itself points at its card (the MLflow UI shows version tags).
    client.set_model_version_tag(spec.name, version, CARD_TAG, f"runs:/{run_id}/{MLFLOW_CARD}/{HTML_FILE}")
    return text
