"""production_model: the champion alias, moved by the promotion job (sensor or CLI), audited."""
