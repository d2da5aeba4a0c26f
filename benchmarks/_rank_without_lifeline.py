"""A training rank without its lifeline: the platform's trainer exactly as it ran before
``ml_assets.processes`` (the baseline of ``benchmarks.orphans``). torchrun runs this file in place of
``-m ml_assets.trainer``."""

import runpy

from ml_assets import processes

processes.follow_parent = lambda **_: None
runpy.run_module("ml_assets.trainer.train", run_name="__main__")
