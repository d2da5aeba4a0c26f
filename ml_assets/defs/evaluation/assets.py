import json

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    daily_partitions,
    partition_day,
    upstream_metadata,
)
from ml_assets.resources import ArtifactStoreResource
from ml_assets.spec import HIGHER_IS_BETTER, ModelSpec
from ml_assets.trainer.config import DataRef


def build_evaluation_report(spec: ModelSpec) -> dg.AssetsDefinition:
    ckpt_key, features_key = asset_key(spec, "trained_checkpoint"), asset_key(spec, "features")
    version = code_version(spec, ("evaluation", "target"), "ml_assets.defs.evaluation.metrics",
                           "ml_assets.trainer.checkpoint")

    @dg.asset(
        key=asset_key(spec, "evaluation_report"),
        deps=[ckpt_key, features_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch", "scikitlearn"},
        code_version=version,
        description=f"{spec.name} metrics on the partition's own day, held out in time from training.",
    )
    def evaluation_report(context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource) -> dg.MaterializeResult:
        # torch and scikit-learn are imported when an evaluation runs, not when definitions load.
        from ml_assets.defs.evaluation import metrics
        from ml_assets.trainer.checkpoint import load_checkpoint
        from ml_assets.trainer.data import read_frame

        day = partition_day(context).isoformat()
        ckpt, test = upstream_metadata(context, ckpt_key, day), upstream_metadata(context, features_key, day)
        loaded = load_checkpoint(DataRef(uri=str(ckpt["checkpoint_uri"]), sha256=ckpt["checkpoint_sha256"]),
                                 DataRef(uri=str(ckpt["meta_uri"]), sha256=ckpt["meta_sha256"]))
        frame = read_frame([DataRef(uri=str(test["uri"]), sha256=test["sha256"], day=day)])
        y = frame[spec.target.name].to_numpy()
        try:
            values = metrics.compute_metrics(spec.target.task, y, metrics.predict(loaded, frame), spec.evaluation.metrics)
        except metrics.MetricError as exc:
            raise dg.Failure(description=f"model {spec.name}, partition {day}: {exc}") from None
        floors = {m: (values[m] >= t if HIGHER_IS_BETTER[m] else values[m] <= t)
                  for m, t in spec.evaluation.thresholds.items()}
        report = {
            "model": spec.name, "partition": day, "test_rows": len(y), "metrics": values,
            "positive_rate": float(y.mean()) if spec.target.task == "binary_classification" else None,
            "thresholds": spec.evaluation.thresholds, "meets_thresholds": floors,
            "checkpoint_sha256": ckpt["checkpoint_sha256"], "test_features_sha256": test["sha256"],
            "test_data_commit": test["data_commit"],
        }
        ref = artifacts.put(f"{spec.name}/evaluation/date={day}", json.dumps(report, indent=1, sort_keys=True).encode(), ".json")
        context.log.info(f"evaluation_report {day}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
        summary = "\n".join(["| metric | value |", "|---|---|", *[f"| {k} | {v:.4f} |" for k, v in values.items()]])
        return dg.MaterializeResult(
            metadata={
                **{name: dg.MetadataValue.float(v) for name, v in values.items()},
                "test_rows": len(y), "test_day": day, "repository": spec.repository,
                "test_data_commit": test["data_commit"], "test_features_uri": dg.MetadataValue.path(str(test["uri"])),
                "test_features_sha256": test["sha256"], "test_features_bytes": test["bytes"],
                "positive_rate": report["positive_rate"] if report["positive_rate"] is not None else dg.MetadataValue.null(),
                "checkpoint_sha256": ckpt["checkpoint_sha256"],
                "meets_thresholds": dg.MetadataValue.json(floors),
                "report_uri": dg.MetadataValue.path(ref.uri), "report_sha256": ref.sha256, "report_bytes": ref.size,
                "summary": dg.MetadataValue.md(summary),
            },
        )

    return evaluation_report
