"""Validation of names that come from users before they reach a path or an API."""

from __future__ import annotations

import datetime as dt
import re

MODEL_NAME = re.compile(r"^[a-z][a-z0-9_]{1,62}$")
# lakeFS branch ids: a word character first, then word characters and dashes.
BRANCH_NAME = re.compile(r"^\w[-\w]{0,254}$", re.ASCII)
TEAM_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
REPO_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
OBJECT_PATH = re.compile(r"^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$")
# MLflow user names: HTTP basic auth splits at the first ":", and a name goes into URLs and logs.
MLFLOW_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{1,63}")


class InvalidName(ValueError):
    pass


def check_model_name(name: str) -> str:
    if not MODEL_NAME.match(name):
        raise InvalidName(
            f"model name {name!r} is invalid: use 2-63 characters, lowercase letters, digits and "
            "underscores, starting with a letter (it becomes an asset key prefix, a group name, "
            "a version-store repository and a registry name)"
        )
    return name


def check_team_name(name: str) -> str:
    if not isinstance(name, str) or not TEAM_NAME.match(name):
        raise InvalidName(
            f"team name {name!r} is invalid: use 2-63 characters, lowercase letters, digits and '-', "
            "starting with a letter (it becomes a run tag the queue limits, an MLflow tag and a "
            "storage prefix)"
        )
    return name


def check_mlflow_user_name(name: str) -> str:
    if not isinstance(name, str) or not MLFLOW_USER_NAME.fullmatch(name):  # "$" would let "name\n" through
        raise InvalidName(
            f"MLflow user name {name!r} is invalid: use 2-64 characters, letters, digits, '.', '_', '@' "
            "and '-', starting with a letter or digit (no ':', no spaces: it is half of an HTTP basic-auth "
            "credential)"
        )
    return name


def check_partition_key(key: str) -> dt.date:
    try:
        day = dt.date.fromisoformat(key)
    except (TypeError, ValueError):
        raise InvalidName(f"partition {key!r} is not a day in YYYY-MM-DD form") from None
    if day.isoformat() != key:
        raise InvalidName(f"partition {key!r} is not a day in YYYY-MM-DD form")
    return day


def check_branch_name(name: str) -> str:
    if not BRANCH_NAME.match(name):
        raise InvalidName(
            f"branch name {name!r} is invalid: letters, digits, '_' and '-', starting with a "
            "letter, digit or '_'"
        )
    return name


def check_repo_name(name: str) -> str:
    if not REPO_NAME.match(name):
        raise InvalidName(
            f"repository name {name!r} is invalid: 3-63 lowercase letters, digits and '-'"
        )
    return name


def check_object_path(path: str) -> str:
    if not OBJECT_PATH.match(path) or any(part in (".", "..") for part in path.split("/")):
        raise InvalidName(f"object path {path!r} is invalid")
    return path


def sanitize_branch_part(text: str) -> str:
    """Turn free text (a run id, a partition key) into a safe branch-name fragment."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")
    return cleaned or "x"


def repo_for_model(model: str) -> str:
    """The version-store repository of a model (lakeFS repository ids allow no underscores)."""
    return check_repo_name(check_model_name(model).replace("_", "-"))


def load_callable(target: str):
    """The function named 'package.module:function' (custom checks, custom transforms); ValueError
    saying why when it cannot be imported or is not callable."""
    import importlib

    module_name, attr = target.split(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot be loaded: {exc}") from None
    if not callable(fn):
        raise ValueError("is not a function")
    return fn
