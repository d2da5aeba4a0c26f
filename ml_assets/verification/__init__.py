"""Proving a model's stores whole (``check``), rebuilding what was lost (``repair``), ``ml-assets
verify`` (``command``) and its daily job (``job``)."""
