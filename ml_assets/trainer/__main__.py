"""One training rank, as torchrun starts it: ``python -m ml_assets.trainer --config train_config.json``
(ml_assets.trainer.train says what it does)."""

import os
import signal
import sys

from ml_assets import processes

EXIT_BACKSTOP_SECONDS = 30
"""How long the interpreter's own exit may take before the kernel ends the rank (SIGALRM)."""

# Before torch is imported (seconds, while the agent may already be gone): a rank whose torchrun
# agent dies at any moment from here on dies with it, or checkpoints first once it can.
processes.follow_parent()

from ml_assets.trainer.runtime import EXIT_PREEMPTED  # noqa: E402
from ml_assets.trainer.train import main  # noqa: E402

code = main()
processes.report_exit(code)
sys.stdout.flush()
sys.stderr.flush()
if code == EXIT_PREEMPTED:
    # Stopped (SIGTERM, or its agent or client gone) with its checkpoint committed and its report
    # sent: nothing is left to do, and the interpreter's teardown is where an orphan can hang for
    # good (torch's and gloo's destructors, after the lifeline thread can no longer run), seen as a
    # rank alive long after its training was killed. End now.
    os._exit(code)
# Any other end tears the interpreter down as usual (threads joined, atexit run), with the kernel
# as the backstop should that teardown hang: SIGALRM's default action ends the process.
signal.signal(signal.SIGALRM, signal.SIG_DFL)
signal.alarm(EXIT_BACKSTOP_SECONDS)
sys.exit(code)
