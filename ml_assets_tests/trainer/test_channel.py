"""A rank other than rank 0 that stops the training for a fault no restart fixes is heard by the step:
its reason reaches the step's real Pipes session (and so the step's failure), not only its own log."""

import os
import subprocess
import sys

import dagster as dg

from ml_assets.training.launcher import TrainingOutcome

RANK_1 = ("from ml_assets.trainer.channel import Channel; "
          "Channel(False).refuse('a storage fault at /ckpt/step-40/__1_0.distcp: no space left on the device', 1)")


def test_rank_1s_refusal_reaches_the_steps_pipes_session_and_its_own_log():
    heard: list[dict] = []

    @dg.asset
    def trained(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        with dg.open_pipes_session(context=context, context_injector=dg.PipesTempFileContextInjector(),
                                   message_reader=dg.PipesTempFileMessageReader()) as session:
            rank = subprocess.run([sys.executable, "-c", RANK_1], env={**os.environ, **session.get_bootstrap_env_vars()},
                                  capture_output=True, text=True, check=True)
        heard.extend(session.get_custom_messages())
        return dg.MaterializeResult(metadata={"stderr": rank.stderr})

    result = dg.materialize([trained])
    refused = TrainingOutcome(1, None, heard).refused
    assert refused == {"kind": "refused", "message": "rank 1: a storage fault at /ckpt/step-40/__1_0.distcp: no space "
                                                      "left on the device"}
    stderr = result.asset_materializations_for_node("trained")[0].metadata["stderr"].value
    assert stderr.startswith("[trainer rank 1] a storage fault at /ckpt/step-40/")


def test_outside_a_dagster_step_rank_1s_refusal_is_only_its_log_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES_")}
    rank = subprocess.run([sys.executable, "-c", RANK_1], env=env, capture_output=True, text=True, check=True)
    assert rank.stderr == ("[trainer rank 1] a storage fault at /ckpt/step-40/__1_0.distcp: no space left on the "
                           "device\n")
