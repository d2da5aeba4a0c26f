"""The evaluation report: the new model and the champion on the same held-out rows.

Pure of Dagster: given the checkpoint's record, the test days' files and an MLflow client, returns
the report (ml_assets.evaluation.document: metrics, interval, threshold, slices, champion, deltas,
the gate's decision) and, apart from it, the predictions the plots draw.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ml_assets.evaluation import metrics as M
from ml_assets.evaluation.document import (
    Baselines,
    BaselineSample,
    Champion,
    ClassScore,
    EvaluationReport,
    SliceRegression,
    SliceScore,
    TestFile,
)
from ml_assets.evaluation.errors import EvaluationError
from ml_assets.evaluation.policy import decide
from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.evaluation.rival import score_rival
from ml_assets.registry.record import VersionTags
from ml_assets.serving.predict import predict
from ml_assets.spec import HIGHER_IS_BETTER, ModelSpec
from ml_assets.trainer.config import DataRef
from ml_assets.training.record import CheckpointRecord


def _ref(record: dict) -> DataRef:
    fields = {f.name for f in dataclasses.fields(DataRef)}
    return DataRef(**{k: v for k, v in record.items() if k in fields})


def _scores(spec: ModelSpec, y: np.ndarray, pred: np.ndarray, threshold: float | None,
            slices: dict[str, np.ndarray]) -> tuple[dict[str, float], tuple[SliceScore, ...]]:
    task, ev = spec.target.task, spec.evaluation
    values = M.compute_metrics(task, y, pred, threshold, top_k=ev.top_k)
    fn = M.metric_function(task, spec.promotion.primary_metric, threshold, top_k=ev.top_k)
    return values, tuple(SliceScore.from_dict(s) for s in M.slice_metrics(slices, y, pred, fn,
                                                                          min_size=ev.min_slice_size))


def _per_class(spec: ModelSpec, y: np.ndarray, pred: np.ndarray) -> dict[str, Any]:
    """Multiclass: each class's share of the test rows, and the precision and recall of predicting
    it (reported, not gated on); nothing for the other tasks."""
    classes = spec.target.classes
    if spec.target.task != "multiclass_classification" or classes is None:
        return {}
    return {"classes": list(classes), "class_rates": dict(zip(classes, M.class_rates(y, len(classes)), strict=True)),
            "per_class": tuple(ClassScore.from_dict(c) for c in M.per_class_metrics(y, pred, classes))}


def sample_rows(refs: list[DataRef], rows: int, seed: int) -> tuple[pl.DataFrame, BaselineSample]:
    """At most ``rows`` rows of the pinned files (each checked against its sha256), drawn uniformly
    without replacement with ``seed`` and kept in file order; all of them when they hold no more.
    Read on polars' streaming engine: a window larger than memory is never collected whole."""
    from ml_assets.features.window import scan_verified

    with tempfile.TemporaryDirectory(prefix="ml_assets-baseline-") as cache:
        scan = scan_verified(refs, cache)
        total = scan.select(pl.len()).collect(engine="streaming").item()
        if total <= rows:
            return scan.collect(engine="streaming"), BaselineSample(rows=total, window_rows=total, seed=seed)
        keep = np.sort(np.random.default_rng(seed).choice(total, size=rows, replace=False))
        index = pl.Series("keep", keep).cast(pl.get_index_type())
        frame = (scan.with_row_index("__row").filter(pl.col("__row").is_in(index.implode())).drop("__row")
                 .collect(engine="streaming"))
    return frame, BaselineSample(rows=frame.height, window_rows=total, seed=seed)


def baseline_days(ckpt: CheckpointRecord, loaded) -> list[DataRef]:
    """The training days the baselines are fitted on: the model's own; for a fine-tune (which
    trained on the newest days, starting from a model that learned the rest) the whole window's,
    as a full training of the partition would have seen them."""
    if ckpt.decision_kind == "fine_tune":
        days = set(ckpt.train_days)
        return [ref for ref in ckpt.feature_files if ref.day in days]
    return [_ref(r) for r in loaded.meta["train_files"]]


def _baselines(spec: ModelSpec, loaded, train: list[DataRef], frame: pl.DataFrame, val_frame: pl.DataFrame,
               y: np.ndarray, pred: np.ndarray, threshold: float | None) -> Baselines:
    """The baselines fitted on a seeded sample of ``train`` (at most baseline.SAMPLE_ROWS rows)
    through the model's feature state, scored on the test rows beside it."""
    from ml_assets.evaluation import baseline as B
    from ml_assets.features.state import transform

    state, ev = loaded.feature_state, spec.evaluation
    rows, sample = sample_rows(train, B.SAMPLE_ROWS, B.SAMPLE_SEED)
    fitted = B.fit_baselines(spec.target.task, transform(rows, state), state, len(spec.target.classes or []))
    scored = B.score_baselines(
        spec.target.task, spec.promotion.primary_metric, fitted, transform(frame, state), y, pred, threshold,
        transform(val_frame, state), top_k=ev.top_k, bootstrap_samples=ev.bootstrap_samples,
        confidence_level=ev.confidence_level)
    return Baselines.from_dict({**scored, "sample": sample.to_dict()})


@dataclass(frozen=True)
class Predictions:
    """The test rows' labels and each model's predictions on them (for the plots; never stored)."""

    y: np.ndarray
    by_model: dict[str, np.ndarray]


def evaluate(spec: ModelSpec, day: str, ckpt: CheckpointRecord, tests: list[DataRef], client,
             skipped: dict[str, str] | None = None) -> tuple[EvaluationReport, Predictions]:
    """``tests``: the features of the test days (each with its day and data commit), oldest first;
    ``skipped``: test days left out for want of features, with why."""
    from ml_assets.trainer.checkpoint import load_checkpoint
    from ml_assets.trainer.data import read_frame
    from ml_assets.training.window import TooFewRows, check_rows

    task, ev, primary = spec.target.task, spec.evaluation, spec.promotion.primary_metric
    loaded = load_checkpoint(ckpt.weights, ckpt.meta, spec.model.code_path or "")
    frame = read_frame(tests)
    try:
        check_rows(spec, frame, "test days", tuple(dt.date.fromisoformat(str(r.day)) for r in tests),
                   "evaluation.min_test_rows", ev.min_test_rows, "evaluation.test_days", ev.test_days)
    except TooFewRows as exc:
        raise EvaluationError(str(exc)) from None
    y = frame[spec.target.name].to_numpy().astype(np.float64)
    slices = {c: frame[c].cast(pl.String).fill_null("(missing)").to_numpy() for c in ev.slice_columns}
    try:
        pred = predict(loaded, frame)
        threshold = None
        val_frame = read_frame([_ref(r) for r in loaded.meta["val_files"]])
        if task == "binary_classification":
            # Precision, recall and F1 need a cut: chosen on the validation days, never on the test rows.
            threshold = M.choose_threshold(val_frame[spec.target.name].to_numpy().astype(np.float64),
                                           predict(loaded, val_frame))
        values, slice_rows = _scores(spec, y, pred, threshold, slices)
        per_class = _per_class(spec, y, pred)
        fn = M.metric_function(task, primary, threshold, top_k=ev.top_k)
        lo, hi = M.bootstrap_ci(y, pred, fn, n=ev.bootstrap_samples, level=ev.confidence_level, seed=0)
        baseline = _baselines(spec, loaded, baseline_days(ckpt, loaded), frame, val_frame, y, pred, threshold)
    except M.MetricError as exc:
        raise EvaluationError(str(exc)) from None
    report = EvaluationReport(
        model=spec.name, partition=day, task=task, test_rows=len(y),
        positive_rate=float(y.mean()) if task == "binary_classification" else None, **per_class,
        threshold=threshold, metrics=values, primary_metric=primary, primary_interval=(lo, hi),
        confidence_level=ev.confidence_level, bootstrap_samples=ev.bootstrap_samples, slices=slice_rows,
        checkpoint_sha256=ckpt.result.checkpoint_sha256, test_days=tuple(str(r.day) for r in tests),
        validation_days=tuple(r["day"] for r in loaded.meta["val_files"]),
        # Days of the window (from the checkpoint) and test days left out for want of features.
        skipped_days=dict(sorted({**ckpt.skipped_days, **(skipped or {})}.items())),
        test_files=tuple(TestFile(day=str(r.day), uri=r.uri, sha256=r.sha256, data_commit=r.commit) for r in tests),
        # main only moves forward: the newest test day's commit holds every test day's rows.
        test_data_commit=tests[-1].commit, baseline=baseline, history=ckpt.result.history)
    predictions = Predictions(y, {"this model": pred})
    report = _champion(spec, report, predictions, client, frame, slices)
    report = dataclasses.replace(report, rival=score_rival(spec, report, predictions.by_model, client, frame, y))
    return dataclasses.replace(report, gate=decide(spec.promotion, report, ckpt.decision).as_gate()), predictions


def _champion(spec, report: EvaluationReport, predictions: Predictions, client, frame, slices) -> EvaluationReport:
    """The report with the current champion, if any, beside the new model (and its predictions added)."""
    from ml_assets.registry import versions as registry

    mv = registry.by_alias(client, spec.name, registry.CHAMPION)
    if mv is None:
        return report
    tags = VersionTags.from_tags(mv.tags)
    champion = Champion(version=str(mv.version), checkpoint_sha256=tags.checkpoint_sha256, partition=tags.partition,
                        same_weights=tags.checkpoint_sha256 == report.checkpoint_sha256)
    if champion.same_weights:
        return dataclasses.replace(report, champion=champion)
    return _compare(spec, report, champion, mv, client, frame, predictions, slices)


def _compare(spec, report: EvaluationReport, champion: Champion, mv, client, frame, predictions: Predictions,
             slices) -> EvaluationReport:
    """The champion on the exact same rows (same file, same sha256, same data commit)."""
    from ml_assets.registry import versions as registry

    task, ev, primary = spec.target.task, spec.evaluation, spec.promotion.primary_metric
    y, pred = predictions.y, predictions.by_model["this model"]
    try:
        loaded = registry.load_version(client, mv)
        old = predict(loaded, frame)
    except (registry.RegistryError, ValueError) as exc:
        raise EvaluationError(f"the champion (version {mv.version}) cannot be scored on the same rows, so the "
                              f"promotion gate cannot compare the two: {exc}") from None
    if loaded.meta.get("classes") != spec.target.classes:
        raise EvaluationError(f"the champion (version {mv.version}) predicts the classes "
                              f"{loaded.meta.get('classes')}, this model {spec.target.classes}: their metrics "
                              "cannot be compared (promote by hand, or retire the champion)")
    # The champion keeps the cut it was registered with (chosen on its own validation day).
    gate = VersionTags.from_tags(mv.tags).gate
    recorded = gate.decision_threshold if gate else ""
    threshold = float(recorded) if recorded else report.threshold
    try:
        values, slice_rows = _scores(spec, y, old, threshold, slices)
        fn = M.metric_function(task, primary, report.threshold, top_k=ev.top_k)
        delta = M.paired_bootstrap_delta(y, pred, old, fn, n=ev.bootstrap_samples, level=ev.confidence_level, seed=0)
    except M.MetricError as exc:
        raise EvaluationError(f"comparing with the champion: {exc}") from None
    predictions.by_model[f"champion v{mv.version}"] = old
    regressions = M.slice_regressions([s.to_dict() for s in report.slices], [s.to_dict() for s in slice_rows],
                                      HIGHER_IS_BETTER[primary])
    return dataclasses.replace(
        report, champion=dataclasses.replace(champion, metrics=values, threshold=threshold, slices=slice_rows),
        deltas={m: report.metrics[m] - values[m] for m in values}, primary_delta=tuple(delta),
        slice_regressions=tuple(SliceRegression.from_dict(r) for r in regressions))


def write_plots(spec: ModelSpec, report: EvaluationReport, predictions: Predictions, out: Path) -> list[str]:
    """PNGs for MLflow: ROC, precision-recall, calibration (binary), confusion matrix and top-label
    calibration (multiclass) or residuals, loss curves, slice metrics. Returns the file names."""
    from ml_assets.evaluation import plots

    out.mkdir(parents=True, exist_ok=True)
    y, preds = predictions.y, predictions.by_model
    written = []
    if spec.target.task == "binary_classification":
        written += [plots.roc_curve_png(y, preds, out / "roc.png").name,
                    plots.pr_curve_png(y, preds, out / "precision_recall.png").name,
                    plots.calibration_png(y, preds, out / "calibration.png").name]
    elif spec.target.task == "multiclass_classification":
        written += [plots.confusion_matrix_png(y, preds, report.classes, out / "confusion_matrix.png").name,
                    plots.calibration_png(y, preds, out / "calibration.png").name]
    else:
        written.append(plots.residuals_png(y, preds, out / "residuals.png").name)
    if report.history:
        written.append(plots.loss_curves_png(report.history, out / "loss_curves.png").name)
    rows = [s.to_dict() for s in report.slices]
    if report.champion and report.champion.slices:
        old = {(s.column, s.value): s.metric for s in report.champion.slices}
        for r in rows:
            r["champion"] = old.get((r["column"], r["value"]))
    if rows:
        written.append(plots.slice_metrics_png(rows, report.primary_metric, out / "slices.png").name)
    return written


def log_metrics(client, run_id: str, report: EvaluationReport) -> None:
    """Test metrics, the primary metric's interval and, when there is a champion, its metrics and
    the deltas, as metrics of the training's MLflow run."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    primary = report.primary_metric
    values = {f"test_{k}": v for k, v in report.metrics.items()}
    values[f"test_{primary}_ci_low"], values[f"test_{primary}_ci_high"] = report.primary_interval
    if report.threshold is not None:
        values["decision_threshold"] = report.threshold
    if report.compared:
        values.update({f"champion_{k}": v for k, v in report.champion.metrics.items()})
        values.update({f"delta_{k}": v for k, v in report.deltas.items()})
        _, lo, hi = report.primary_delta
        values.update({f"delta_{primary}_ci_low": lo, f"delta_{primary}_ci_high": hi})
    for b in report.baseline.baselines if report.baseline else ():
        values.update({f"baseline_{b.name}_{k}": v for k, v in b.metrics.items()})
    values["promotion_gate_passed"] = float(report.gate.passed)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in sorted(values.items())])


def one_line(report: EvaluationReport) -> str:
    lo, hi = report.primary_interval
    text = f"{report.primary_metric} {report.primary_value:.4f} [{lo:.4f}, {hi:.4f}] on {report.test_rows} rows"
    if report.compared:
        point, dlo, dhi = report.primary_delta
        text += f"; vs champion v{report.champion.version}: {point:+.4f} [{dlo:+.4f}, {dhi:+.4f}]"
    return text


def evaluation_record(spec: ModelSpec, report: EvaluationReport, ref, run_id: str, run_url: str,
                      plot_urls: dict[str, str], plots_inline: str | None = None) -> EvaluationRecord:
    """The evaluation_report asset's record of a stored ``report`` (``ref``: its artifact)."""
    from ml_assets.evaluation.summary import summary_markdown

    doc, champ = report.to_dict(), report.champion
    return EvaluationRecord(
        primary_metric=report.primary_metric, metrics=report.metrics, primary_interval=list(report.primary_interval),
        test_rows=report.test_rows, repository=spec.repository, test_days=list(report.test_days),
        validation_days=list(report.validation_days), skipped_days=report.skipped_days,
        test_data_commit=report.test_data_commit, test_files=doc["test_files"], positive_rate=report.positive_rate,
        decision_threshold=report.threshold, class_rates=report.class_rates, per_class=doc.get("per_class"),
        checkpoint_sha256=report.checkpoint_sha256, champion_version=champ.version if champ else None,
        gate_passed=report.gate.passed, gate_reason=report.gate.reason, slices=doc["slices"],
        baseline=doc["baseline"], report_uri=ref.uri, report_sha256=ref.sha256, report_bytes=ref.size,
        mlflow_run_id=run_id, mlflow_run_url=run_url, plots=plot_urls,
        primary_delta=list(report.primary_delta) if report.compared else None,
        champion_metrics=champ.metrics if report.compared else None,
        summary=summary_markdown(spec, report, plot_urls), plots_inline=plots_inline)
