"""The evaluation report in words: the markdown the Dagster UI shows for an evaluation_report."""

from __future__ import annotations

import base64
from pathlib import Path

from ml_assets.evaluation.document import EvaluationReport
from ml_assets.spec import ModelSpec


def _days(days: tuple[str, ...]) -> str:
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]} ({len(days)} days)"


def _header(spec: ModelSpec, report: EvaluationReport) -> list[str]:
    lines = [f"**{spec.name}, partition {report.partition}**: tested on {_days(report.test_days)} "
             f"({report.test_rows} held-out rows"
             + (f", positive rate {report.positive_rate:.3f}" if report.positive_rate is not None else "")
             + (f", cut {report.threshold:.3f} chosen on the validation days" if report.threshold is not None
                else "") + f"); validated on {_days(report.validation_days)}", ""]
    if report.skipped_days:
        lines += ["Days skipped (no features): " + ", ".join(
            f"{d} ({why})" for d, why in report.skipped_days.items()), ""]
    lo, hi = report.primary_interval
    lines.append(f"{report.primary_metric}: **{report.primary_value:.4f}**, {report.confidence_level:.0%} interval "
                 f"[{lo:.4f}, {hi:.4f}] ({report.bootstrap_samples} bootstrap resamples)")
    return [*lines, ""]


def _metrics_table(spec: ModelSpec, report: EvaluationReport) -> list[str]:
    shown = [*spec.evaluation.metrics, *[m for m in report.metrics if m not in spec.evaluation.metrics]]
    baselines = report.baseline.baselines if report.baseline else ()
    columns = [("this model", report.metrics), *[(f"baseline: {b.name}", b.metrics) for b in baselines]]
    if report.compared:
        columns.append((f"champion v{report.champion.version}", report.champion.metrics))
    header = " | ".join(name for name, _ in columns) + (" | change over the champion" if report.compared else "")
    lines = [f"| metric | {header} |", "|---" * (len(columns) + 1 + report.compared) + "|"]
    for m in shown:
        cells = " | ".join(f"{values[m]:.4f}" for _, values in columns)
        lines.append(f"| {m} | {cells}" + (f" | {report.deltas[m]:+.4f}" if report.compared else "") + " |")
    return [*lines, ""]


def _comparisons(report: EvaluationReport) -> list[str]:
    primary, level, lines = report.primary_metric, report.confidence_level, []
    baselines = report.baseline.baselines if report.baseline else ()
    sample = report.baseline.sample if report.baseline else None
    fitted = ("the model's training days" if sample is None
              else f"all {sample.window_rows:,} rows of the model's training days" if sample.whole
              else f"{sample.rows:,} of the {sample.window_rows:,} rows of the model's training days "
                   f"(drawn uniformly, seed {sample.seed})")
    for b in baselines:
        lines.append(f"- baseline {b.name}: {b.description}, fitted on {fitted}")
    if baselines:
        point, dlo, dhi = report.baseline.delta
        lines += ["", f"Change of {primary} over the best baseline ({report.baseline.best}): {point:+.4f}, "
                  f"{level:.0%} paired-bootstrap interval [{dlo:+.4f}, {dhi:+.4f}]."]
    champ = report.champion
    if report.compared:
        point, dlo, dhi = report.primary_delta
        lines += ["", f"Change of {primary} over the champion: {point:+.4f}, {level:.0%} paired-bootstrap interval "
                  f"[{dlo:+.4f}, {dhi:+.4f}]."]
    elif champ and champ.same_weights:
        lines += ["", f"These weights are champion version {champ.version}."]
    elif not champ:
        lines += ["", "No champion yet: a first model must beat the best baseline (and reach any floors)."]
    return lines


def summary_markdown(spec: ModelSpec, report: EvaluationReport, plot_urls: dict[str, str]) -> str:
    gate, primary = report.gate, report.primary_metric
    lines = [*_header(spec, report), *_metrics_table(spec, report), *_comparisons(report)]
    if report.per_class:
        lines += ["", "| class | share of rows | precision | recall |", "|---|---|---|---|",
                  *[f"| {c.name} | {c.rate:.3f} | {c.precision:.4f} | {c.recall:.4f} |" for c in report.per_class]]
    lines += ["", f"**Promotion gate: {'accepted' if gate.passed else 'refused'}** ({gate.kind}): {gate.reason}"]
    judged = [s for s in report.slices if s.metric is not None]
    if judged:
        lines += ["", f"Slices ({len(judged)} of {len(report.slices)} with at least "
                  f"{spec.evaluation.min_slice_size} rows and both classes):", "",
                  f"| slice | rows | {primary} |", "|---|---|---|",
                  *[f"| {s.column}={s.value} | {s.rows} | {s.metric:.4f} |" for s in judged[:20]]]
    if plot_urls:
        lines += ["", "Plots (MLflow artifacts: `mlflow ui` on the tracking URI `ml-assets paths` prints):", ""]
        lines += [f"- [{name}]({url})" for name, url in plot_urls.items()]
        lines += ["", *[f"![{name}]({url})" for name, url in plot_urls.items()]]
    return "\n".join(lines)


def plots_markdown(images: dict[str, bytes]) -> str:
    """The plots as one markdown value with each PNG embedded (a data URI), as Dagster's docs embed
    a plot in metadata: the UI shows them with no MLflow server running."""
    return "\n\n".join(f"**{Path(name).stem.replace('_', ' ')}**\n\n"
                       f"![{Path(name).stem}](data:image/png;base64,{base64.b64encode(data).decode()})"
                       for name, data in images.items())
