"""Training: trained_checkpoint, the window's weights trained under torchrun, sha256-pinned.

- ``assets``: the trained_checkpoint asset; ``window``: which days a partition trains, validates and
  tests on; ``inputs``: those days' feature records; ``prepare``: the fitted feature state and the
  window's files; ``tuned``: the study whose parameters apply; ``preflight``: a model factory checked
  before launch; ``launch``: the trainer's config and the launch through Dagster Pipes;
- ``trainer_config``: the spec's training sections as the trainer's config;
- ``launcher``: the launcher resource (torchrun as local processes); ``k8s_launch`` and ``k8s_job``:
  the same torchrun in the step's pod, or as an Indexed Job over several nodes;
- ``record``: CheckpointRecord;
- spec sections: ``model``, ``training`` with its ``pods`` (ml_assets.spec.architecture,
  ml_assets.spec.training, ml_assets.spec.pods).

The trainer itself is ml_assets.trainer: pure PyTorch, run by torchrun, importing no dagster.
"""
