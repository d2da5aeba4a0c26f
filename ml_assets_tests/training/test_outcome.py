"""How the training step reads torchrun's outcome: which endings are retried (a preemption, whose
checkpoint the retry resumes) and which fail the step with the reason."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import dagster as dg
import pytest

from ml_assets.step import Step
from ml_assets.training.launch import check_outcome
from ml_assets.training.launcher import TrainingOutcome, TrainingPreempted
from ml_assets_tests.helpers import model_spec

STEP = Step(model_spec(), "2013-03-04", "run-1", "")
CFG = SimpleNamespace(checkpoint_root="/checkpoints/flights_delay")
PREEMPTED = {"kind": "preempted", "step": 40, "signal": "SIGTERM"}


def test_a_preemption_torchrun_survived_is_retried():
    # A rank got SIGTERM, checkpointed and stopped the agent, which exits 1 (torchrun's SignalException).
    with pytest.raises(TrainingPreempted, match="checkpointed at step 40"):
        check_outcome(STEP, TrainingOutcome(1, None, [PREEMPTED]), CFG)


def test_torchrun_killed_by_sigkill_fails_the_step_even_when_its_orphaned_ranks_checkpointed():
    # The ranks' lifeline turns the agent's death into their SIGTERM: they checkpoint and say
    # "preempted". The step still fails (an OOM-killed agent is no preemption), naming the step saved.
    with pytest.raises(dg.Failure) as failed:
        check_outcome(STEP, TrainingOutcome(-signal.SIGKILL, None, [PREEMPTED]), CFG)
    assert not failed.value.allow_retries
    assert "torchrun was killed by SIGKILL; its ranks checkpointed at step 40" in failed.value.description
    assert "/checkpoints/flights_delay" in failed.value.description


def test_torchrun_killed_before_any_checkpoint_fails_the_step():
    with pytest.raises(dg.Failure, match="ranks checkpointed if they could"):
        check_outcome(STEP, TrainingOutcome(-signal.SIGKILL, None, []), CFG)


def test_a_crashed_trainer_fails_the_step_pointing_at_its_log():
    with pytest.raises(dg.Failure, match="exited with code 1 .*its log above says why"):
        check_outcome(STEP, TrainingOutcome(1, None, []), CFG)
