"""``ml-assets mlflow-users``: the MLflow server's identities, made by its admin (docs/deployment.md,
"Who can do what").

    ml-assets mlflow-users create-platform    the platform's identity, as the Dagster processes carry it
                                              (MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD); then
                                              grant-platform
    ml-assets mlflow-users create-user NAME   a team's user, its password from ML_ASSETS_NEW_USER_PASSWORD
    ml-assets mlflow-users grant-platform     MANAGE for the platform's identity on every registered model
                                              and on the experiment of the same name

It acts as the admin the server was first started with (MLFLOW_AUTH_ADMIN_USERNAME, default admin,
and MLFLOW_AUTH_ADMIN_PASSWORD) against MLFLOW_TRACKING_URI, through MLflow's auth REST API. Names
are checked before they reach the API; passwords come from the environment only, never argv.
Exit codes: 0 done, 1 MLflow refused or failed (the message says why), 2 a bad name or environment.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ml_assets.deploy.services import (
    ADMIN_PASSWORD_VARIABLE,
    ADMIN_USERNAME_VARIABLE,
    DEFAULT_ADMIN,
    MIN_PASSWORD,
)
from ml_assets.names import InvalidName, check_mlflow_user_name

USERNAME_VARIABLE = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"
NEW_PASSWORD_VARIABLE = "ML_ASSETS_NEW_USER_PASSWORD"
ACTIONS = ("create-platform", "create-user", "grant-platform")


class UsersError(Exception):
    """A bad name or environment (``code`` 2), or MLflow refused (``code`` 1); the message says which."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], user_variable: str, password_variable: str,
                         default_user: str | None = None) -> Credentials:
        username = (environ.get(user_variable) or default_user or "").strip()
        if not username:
            raise UsersError(f"set {user_variable}")
        try:
            check_mlflow_user_name(username)
        except InvalidName as exc:
            raise UsersError(f"{user_variable}: {exc}") from None
        return cls(username, checked_password(environ, password_variable))


def checked_password(environ: Mapping[str, str], variable: str) -> str:
    password = environ.get(variable) or ""
    if len(password) < MIN_PASSWORD:
        raise UsersError(f"set {variable} to a password of at least {MIN_PASSWORD} characters (MLflow's rule)")
    return password


@contextmanager
def acting_as(who: Credentials) -> Iterator[None]:
    """MLflow's clients read these two variables at each request: this process speaks as ``who``."""
    saved = {name: os.environ.get(name) for name in (USERNAME_VARIABLE, PASSWORD_VARIABLE)}
    os.environ[USERNAME_VARIABLE], os.environ[PASSWORD_VARIABLE] = who.username, who.password
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def create_user(tracking_uri: str, admin: Credentials, user: Credentials) -> bool:
    """Create ``user``; False when it exists already (its password is left as it is)."""
    from mlflow.exceptions import MlflowException

    check_mlflow_user_name(user.username)
    with acting_as(admin):
        try:
            _auth_client(tracking_uri).create_user(user.username, user.password)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_ALREADY_EXISTS":
                return False
            raise
    return True


def accepts(tracking_uri: str, user: Credentials) -> bool:
    """Whether MLflow takes ``user``'s password (a user that existed may have another one)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    with acting_as(user):
        try:
            MlflowClient(tracking_uri).search_experiments(max_results=1)
        except MlflowException as exc:
            if exc.get_http_status_code() == 401:
                return False
            raise
    return True


def grant_platform(tracking_uri: str, admin: Credentials, platform: str) -> list[str]:
    """MANAGE for ``platform`` on every registered model and its experiment (named after it) that
    lacks it: models created before authentication was on, or by another identity. Returns what
    was granted, as "registered_model NAME" / "experiment ID (NAME)"."""
    from mlflow.tracking import MlflowClient

    check_mlflow_user_name(platform)
    granted = []
    with acting_as(admin):
        auth, client = _auth_client(tracking_uri), MlflowClient(tracking_uri, tracking_uri)
        token = None
        while True:
            page = client.search_registered_models(max_results=200, page_token=token)
            for model in page:
                if _grant_manage(auth, platform, "registered_model", model.name):
                    granted.append(f"registered_model {model.name}")
                experiment = client.get_experiment_by_name(model.name)
                if experiment is not None and _grant_manage(auth, platform, "experiment", experiment.experiment_id):
                    granted.append(f"experiment {experiment.experiment_id} ({model.name})")
            token = page.token
            if not token:
                return granted


def _auth_client(tracking_uri: str):
    # Importing MLflow's server package warns of a deprecation inside it (Starlette's, a UserWarning):
    # nothing an admin running this command can act on, printed above the command's own lines.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow.server.auth.client import AuthServiceClient
    return AuthServiceClient(tracking_uri)


def _grant_manage(auth, user: str, resource_type: str, resource_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    if auth.get_user_permission(user, resource_type, resource_id).permission == "MANAGE":
        return False
    try:
        auth.grant_user_permission(user, resource_type, resource_id, "MANAGE")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        # A weaker grant of the user's own is there (MLflow adds none on top of it): replace it.
        auth.revoke_user_permission(user, resource_type, resource_id)
        auth.grant_user_permission(user, resource_type, resource_id, "MANAGE")
    return True


def add_parser(sub) -> None:
    users = sub.add_parser("mlflow-users", help="the MLflow server's identities, as its admin (docs/deployment.md)")
    users.add_argument("action", choices=ACTIONS,
                       help=f"create-platform: {USERNAME_VARIABLE}/{PASSWORD_VARIABLE}'s user, then grant-platform; "
                            f"create-user NAME: a team's user (password: {NEW_PASSWORD_VARIABLE}); "
                            "grant-platform: MANAGE for the platform on every registered model and experiment")
    users.add_argument("name", nargs="?", help="the user to create (create-user)")


def run(action: str, name: str | None, environ: Mapping[str, str] | None = None) -> int:
    """The command; what it did on stdout, a refusal as one line on stderr."""
    from mlflow.exceptions import MlflowException

    env = os.environ if environ is None else environ
    try:
        uri = (env.get("MLFLOW_TRACKING_URI") or "").strip()
        if not uri.startswith(("http://", "https://")):
            raise UsersError("set MLFLOW_TRACKING_URI to the MLflow server's http(s):// address")
        admin = Credentials.from_environment(env, ADMIN_USERNAME_VARIABLE, ADMIN_PASSWORD_VARIABLE, DEFAULT_ADMIN)
        try:
            _act(action, name, uri, admin, env)
        except MlflowException as exc:
            raise UsersError(_refused(exc, admin), code=1) from None
    except UsersError as exc:
        print(f"ml-assets mlflow-users {action}: {exc}", file=sys.stderr)
        return exc.code
    return 0


def _act(action: str, name: str | None, uri: str, admin: Credentials, env: Mapping[str, str]) -> None:
    if action == "create-user":
        try:
            user = Credentials(check_mlflow_user_name(name or ""), checked_password(env, NEW_PASSWORD_VARIABLE))
        except InvalidName as exc:
            raise UsersError(str(exc)) from None
        made = create_user(uri, admin, user)
        print(f"MLflow user {user.username!r} " + ("created (READ on every model and experiment)" if made else
                                                   "exists already; its password was left as it is"))
        return
    if action == "create-platform":
        platform = Credentials.from_environment(env, USERNAME_VARIABLE, PASSWORD_VARIABLE)
        made = create_user(uri, admin, platform)
        print(f"MLflow user {platform.username!r} " + ("created" if made else "exists already"))
        if not accepts(uri, platform):
            raise UsersError(f"MLflow user {platform.username!r} exists with another password than "
                             f"{PASSWORD_VARIABLE}: set it there, or change it in MLflow", code=1)
    try:
        platform_user = check_mlflow_user_name((env.get(USERNAME_VARIABLE) or "").strip())
    except InvalidName as exc:
        raise UsersError(f"{USERNAME_VARIABLE} (the platform's identity): {exc}") from None
    for what in grant_platform(uri, admin, platform_user):
        print(f"MANAGE for {platform_user!r} on {what}")
    print(f"{platform_user!r} holds MANAGE on every registered model and its experiment")


def _refused(exc, admin: Credentials) -> str:
    status = exc.get_http_status_code()
    if status == 401:
        return (f"MLflow does not accept the admin's credentials (HTTP 401): {ADMIN_USERNAME_VARIABLE} "
                f"({admin.username!r}) and {ADMIN_PASSWORD_VARIABLE} must be those the server was first started with")
    if status == 403:
        return f"MLflow user {admin.username!r} is not an admin (HTTP 403)"
    return f"the request to MLflow failed: {str(exc).splitlines()[0]}"
