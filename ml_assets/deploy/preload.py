"""Imported by the multiprocess executor's fork server (ML_ASSETS_EXECUTOR=multiprocess; first of
``ml_assets.definitions.STEP_PRELOAD``): builds the code location once per run, so each step
process forks with the definitions already built instead of importing and building them again
(seconds of CPU per step)."""

import ml_assets

ml_assets.code_location  # noqa: B018 (the attribute access builds and caches the definitions)
