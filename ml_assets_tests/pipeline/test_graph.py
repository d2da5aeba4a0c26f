"""The graph's one declaration: deps and partition mappings come from it, and a stage cannot read a
record over an edge it does not declare."""

import dagster as dg
import pytest

from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.ingest.record import RawRecord
from ml_assets.pipeline.graph import ModelGraph, Stage, edges
from ml_assets.registry.record import RegisteredRecord
from ml_assets_tests.helpers import model_spec


def test_the_training_window_is_the_mapping_of_its_features_dep():
    spec = model_spec(training={"window_days": 10}, evaluation={"test_days": 3})
    [features, tuning] = ModelGraph(spec).wiring(Stage.TRAINED_CHECKPOINT).deps
    assert features.asset_key == dg.AssetKey(["flights_delay", "features"])
    mapping = features.partition_mapping
    assert isinstance(mapping, dg.TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == (-12, -3)  # D-W-T+1 .. D-T
    assert tuning.asset_key == dg.AssetKey(["flights_delay", "hyperparameters"]) and tuning.partition_mapping is None


def test_a_record_read_over_an_undeclared_edge_is_refused_before_anything_is_read():
    wiring = ModelGraph(model_spec()).wiring(Stage.FEATURES)
    with pytest.raises(TypeError, match="features has no edge from raw_data"):
        wiring.read(None, RawRecord, "2013-01-05")  # the context is never reached
    with pytest.raises(TypeError, match="features has no edge from evaluation_report"):
        wiring.find(None, EvaluationRecord, "2013-01-05")


def test_a_lineage_only_edge_is_not_read():
    wiring = ModelGraph(model_spec()).wiring(Stage.PRODUCTION_MODEL)
    with pytest.raises(TypeError, match="lineage only"):
        wiring.find(None, RegisteredRecord, None)


def test_every_stage_is_declared_and_keys_are_given_only_over_declared_edges():
    declared = edges(model_spec())
    assert set(declared) == set(Stage)
    wiring = ModelGraph(model_spec()).wiring(Stage.EVALUATION_REPORT)
    assert wiring.key_of(Stage.FEATURES) == dg.AssetKey(["flights_delay", "features"])
    with pytest.raises(TypeError, match="evaluation_report has no edge from raw_data"):
        wiring.key_of(Stage.RAW_DATA)
