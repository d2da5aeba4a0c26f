"""Evaluation plots as PNG files: one fresh Agg figure per call, so no pyplot state is shared.

Each function writes ``path`` (creating its folder) and returns it as a Path. ``preds`` map a
label shown in the legend (e.g. "challenger v5", "champion v3") to that model's predictions.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from sklearn.metrics import precision_recall_curve, roc_curve  # noqa: E402

from ml_assets.evaluation.metrics import (  # noqa: E402
    ECE_BINS,
    MetricError,
    _binary,
    _both_classes,
    _ece,
    _multiclass,
    _pair,
    _pr_auc,
    _predicted,
    _probabilities,
    _roc_auc,
)

FIGSIZE = (6.0, 4.5)
DPI = 100
MAX_SLICES = 40  # bars beyond this are unreadable at this size


def _figure(height: float = FIGSIZE[1]) -> tuple[Figure, object]:
    fig = Figure(figsize=(FIGSIZE[0], height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=DPI)
    return path


def _models(preds: dict[str, np.ndarray]) -> None:
    if not preds:
        raise MetricError("no model predictions to plot; pass at least one {label: predictions}")


def _classified(y, p, label: str) -> tuple[np.ndarray, np.ndarray]:
    y, p = _pair(y, p, f"predictions of {label!r}")
    y, p = _binary(y), _probabilities(p)
    _both_classes(y, "ROC and PR curves are", "held-out rows")
    return y, p


def roc_curve_png(y, preds: dict[str, np.ndarray], path) -> Path:
    """ROC curve of each model, with its AUC in the legend and the chance diagonal."""
    _models(preds)
    fig, ax = _figure()
    for label, p in preds.items():
        yy, pp = _classified(y, p, label)
        fpr, tpr, _ = roc_curve(yy, pp)
        ax.plot(fpr, tpr, label=f"{label} (AUC {_roc_auc(yy, pp):.3f})")
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="chance")
    ax.set(title="ROC curve", xlabel="false positive rate", ylabel="true positive rate",
           xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def pr_curve_png(y, preds: dict[str, np.ndarray], path) -> Path:
    """Precision-recall curve of each model, average precision in the legend, base-rate line."""
    _models(preds)
    fig, ax = _figure()
    base = None
    for label, p in preds.items():
        yy, pp = _classified(y, p, label)
        precision, recall, _ = precision_recall_curve(yy, pp)
        ax.step(recall, precision, where="post", label=f"{label} (AP {_pr_auc(yy, pp):.3f})")
        base = float(yy.mean())
    ax.axhline(base, linestyle="--", color="grey", linewidth=1, label=f"base rate {base:.3f}")
    ax.set(title="Precision-recall curve", xlabel="recall", ylabel="precision",
           xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower left", fontsize="small")
    return _save(fig, path)


def _reliability(ax, label: str, yy: np.ndarray, pp: np.ndarray, bins: int) -> None:
    idx = np.minimum((pp * bins).astype(int), bins - 1)
    counts = np.bincount(idx, minlength=bins)
    used = counts > 0  # empty bins have no rate to show
    mean_p = np.bincount(idx, pp, minlength=bins)[used] / counts[used]
    rate = np.bincount(idx, yy, minlength=bins)[used] / counts[used]
    ax.plot(mean_p, rate, marker="o", label=f"{label} (ECE {_ece(yy, pp, bins):.3f})")


def calibration_png(y, preds: dict[str, np.ndarray], path, bins: int = ECE_BINS) -> Path:
    """Reliability diagram: observed positive rate vs mean predicted probability per bin.
    Multiclass predictions (rows x classes) are drawn top-label: how often the predicted class is
    right vs its probability, the curve behind the multiclass ECE."""
    _models(preds)
    if bins < 1:
        raise MetricError(f"bins must be at least 1; got {bins}")
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="perfectly calibrated")
    multiclass = False
    for label, p in preds.items():
        if np.ndim(p) == 2:
            multiclass = True
            yy, pp = _multiclass(y, p)
            _reliability(ax, label, (_predicted(pp) == yy).astype(float), pp.max(axis=1), bins)
            continue
        yy, pp = _pair(y, p, f"predictions of {label!r}")
        _reliability(ax, label, _binary(yy), _probabilities(pp), bins)
    ax.set(title=f"Calibration ({bins} equal-width bins{', top label' if multiclass else ''})",
           xlabel="mean predicted probability" + (" of the predicted class" if multiclass else ""),
           ylabel="observed accuracy" if multiclass else "observed positive rate", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def confusion_matrix_png(y, preds: dict[str, np.ndarray], classes: list[str], path) -> Path:
    """Multiclass: per model, the share of each true class's rows predicted as each class (rows sum
    to 1, so a rare class reads as clearly as a common one), with the row counts on the axis."""
    _models(preds)
    k = len(classes)
    size = max(FIGSIZE[1], 1.5 + 0.6 * k)
    fig = Figure(figsize=(size * len(preds), size), dpi=DPI)
    FigureCanvasAgg(fig)
    for i, (label, p) in enumerate(preds.items()):
        yy, pp = _multiclass(y, p)
        if pp.shape[1] != k:
            raise MetricError(f"{k} class names for predictions of {pp.shape[1]} classes by {label!r}")
        counts = np.zeros((k, k))
        np.add.at(counts, (yy, _predicted(pp)), 1)
        actual = counts.sum(axis=1)
        share = np.divide(counts, actual[:, None], out=np.zeros_like(counts), where=actual[:, None] > 0)
        ax = fig.add_subplot(1, len(preds), i + 1)
        ax.imshow(share, vmin=0, vmax=1, cmap="Blues")
        for t in range(k):
            for q in range(k):
                ax.text(q, t, f"{share[t, q]:.2f}", ha="center", va="center", fontsize="small",
                        color="white" if share[t, q] > 0.5 else "black")
        ax.set_xticks(range(k), classes, rotation=45, ha="right", fontsize="small")
        ax.set_yticks(range(k), [f"{c} (n={int(n)})" for c, n in zip(classes, actual, strict=True)],
                      fontsize="small")
        ax.set(title=f"{label}: accuracy {np.trace(counts) / len(yy):.3f}", xlabel="predicted class",
               ylabel="true class")
    return _save(fig, path)


def loss_curves_png(history: list[dict], path) -> Path:
    """Training and validation loss per epoch (entries without a loss are left out)."""
    if not history:
        raise MetricError("no training history to plot; the model logged no epochs")
    fig, ax = _figure()
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        points = [(h["epoch"], h[key]) for h in history if h.get(key) is not None]
        if points:
            epochs, losses = zip(*sorted(points), strict=True)
            ax.plot(epochs, losses, marker="o" if len(points) < 30 else None, label=label)
    ax.set(title="Loss per epoch", xlabel="epoch", ylabel="loss")
    ax.legend(fontsize="small")
    return _save(fig, path)


def slice_metrics_png(rows: list[dict], metric: str, path) -> Path:
    """Horizontal bars of a metric per slice (rows from slice_metrics); slices without one skipped.

    Rows carrying a "champion" value are drawn as challenger and champion bars side by side.
    """
    shown = [r for r in rows if r.get("metric") is not None]
    total = len(shown)
    shown = shown[:MAX_SLICES]
    paired = any(r.get("champion") is not None for r in shown)
    fig, ax = _figure(max(FIGSIZE[1], 1.0 + 0.28 * len(shown) * (1.6 if paired else 1)))
    if not shown:
        ax.text(0.5, 0.5, "no slice has a defined metric", ha="center", va="center")
        ax.set_axis_off()
    else:
        pos = np.arange(len(shown))[::-1].astype(float)  # first row at the top
        values = [float(r["metric"]) for r in shown]
        if paired:
            champion = [np.nan if r.get("champion") is None else float(r["champion"])
                        for r in shown]
            ax.barh(pos + 0.2, values, height=0.4, label="challenger")
            ax.barh(pos - 0.2, champion, height=0.4, label="champion")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize="small")
        else:
            ax.barh(pos, values, height=0.7)
        ax.set_yticks(pos, [f"{r['column']}={r['value']} (n={r['rows']})" for r in shown],
                        fontsize="small")
        ax.set_xlabel(metric)
    more = f" (first {len(shown)} of {total})" if total > len(shown) else ""
    ax.set_title(f"{metric} by slice{more}")
    return _save(fig, path)


def residuals_png(y, preds: dict[str, np.ndarray], path) -> Path:
    """Regression: predicted against actual for each model, with the y = x line."""
    _models(preds)
    fig, ax = _figure()
    low, high = np.inf, -np.inf
    for label, pred in preds.items():
        yy, pp = _pair(y, pred, f"predictions of {label!r}")
        rmse = float(np.sqrt(np.mean((pp - yy) ** 2)))
        ax.scatter(yy, pp, s=8, alpha=0.4, label=f"{label} (RMSE {rmse:.3g})")
        low, high = min(low, yy.min(), pp.min()), max(high, yy.max(), pp.max())
    ax.plot([low, high], [low, high], "--", color="grey", linewidth=1, label="perfect")
    ax.set(title="Predicted vs actual", xlabel="actual", ylabel="predicted")
    ax.legend(fontsize="small")
    return _save(fig, path)
