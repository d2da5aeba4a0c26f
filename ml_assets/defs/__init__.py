"""Asset builders by lifecycle stage, and what they share (``common``); ``model`` assembles one
model's definitions. Evaluation, registry and promotion keep their assets in their own packages."""
