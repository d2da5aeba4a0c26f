"""A model factory tried in the Dagster process before torchrun starts, so that a factory that
cannot be imported, rejects its hyperparameters, returns no module or gives outputs of the wrong
shape fails the step with the spec field, the import path and the shapes, before any process is
launched or any checkpoint directory is touched (the trainer checks again on the real rows)."""

from __future__ import annotations

from ml_assets.trainer.config import TrainConfig


def check_model(cfg: TrainConfig) -> None:
    """Raises ModelContractError (a ValueError) saying what is wrong; a built-in family passes."""
    if not cfg.model_factory:
        return
    from ml_assets.trainer.contract import ModelInputs, factory_loss, make_custom
    from ml_assets.trainer.data import read_state

    inputs = ModelInputs.from_state(read_state(cfg.feature_state), cfg.task, cfg.classes)
    _, factory = make_custom(cfg.model_factory, cfg.model_params, inputs, cfg.model_code_path)
    factory_loss(factory, cfg.model_factory, inputs)


def check_parent(cfg: TrainConfig) -> str:
    """A fine-tune's model built (on the validation rows' first few) and its parent's weights loaded
    into it, or a boosted parent's inputs, objective and classes compared with this model's, before
    anything is launched: what does not fit, or "" when they fit. A parent whose bytes no longer
    match their sha256 raises IntegrityError."""
    from ml_assets.storage import read_verified
    from ml_assets.trainer.build import build, load_parent
    from ml_assets.trainer.code_pin import ModelContractError
    from ml_assets.trainer.contract import SAMPLE_ROWS
    from ml_assets.trainer.data import read_frame, read_state, to_tensors

    raw = read_verified(cfg.init_weights.uri, cfg.init_weights.sha256)  # IntegrityError names both hashes
    state = read_state(cfg.feature_state)
    if cfg.family == "xgboost":
        return _booster_problem(cfg, raw, state)
    numeric, categorical, _ = to_tensors(read_frame(cfg.val_files[:1]).head(SAMPLE_ROWS), state)
    try:
        load_parent(build(cfg, state, (numeric, categorical)).model, cfg.init_weights)
    except ModelContractError as exc:
        return str(exc)
    return ""


def _booster_problem(cfg: TrainConfig, raw: bytes, state: dict) -> str:
    from ml_assets.trainer import booster_parent, boosting
    from ml_assets.trainer.booster_data import feature_names, feature_types
    from ml_assets.trainer.code_pin import ModelContractError

    params = boosting.booster_params(cfg.model_params, cfg.task, len(cfg.classes), seed=cfg.seed, threads=1,
                                     device="cpu")
    try:
        booster_parent.check(raw, cfg.init_weights, feature_names=feature_names(state),
                             feature_types=feature_types(state), objective=params["objective"],
                             num_class=int(params.get("num_class", 0)))
    except ModelContractError as exc:
        return str(exc)
    return ""
