"""One training rank, as torchrun starts it: ``python -m ml_assets.trainer --config train_config.json``
(ml_assets.trainer.train says what it does)."""

import sys

from ml_assets import processes

# Before torch is imported (seconds, while the agent may already be gone): a rank whose torchrun
# agent dies at any moment from here on dies with it, or checkpoints first once it can.
processes.follow_parent()

from ml_assets.trainer.train import main  # noqa: E402

sys.exit(main())
