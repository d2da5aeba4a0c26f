"""``ml-assets``: the project's command line.

    ml-assets demo [--model flights_delay] [--day 2013-03-15]   the bundled demo, on embedded defaults
    ml-assets backfill MODEL --start D --end D [--force]        ingest, validate and featurize a window of days
    ml-assets lineage MODEL [--version N | --alias A | --partition D | --predictions FILE] [--json]
                                                                walk a model back to its source bytes
    ml-assets calibrate MODEL --start D --end D [--target-rate R] | --show
                                                                drift limits fitted on the source's own history
    ml-assets replay-checks MODEL --start D --end D [--json] [--ignore-waivers]
                                                                the snapshot's checks over past source days
    ml-assets promote MODEL VERSION --reason TEXT                make VERSION the champion (its gate must have passed)
    ml-assets rollback MODEL --reason TEXT                       the previous champion back
    ml-assets audit MODEL [--version N] [--format md|json]      evidence, data checks, promotions, pins
    ml-assets card MODEL [--version N] [--format md|html] [--output FILE]
                                                                the version's model card, from its records
    ml-assets reproduce MODEL --version N [--registered-code] [--chain]    retrain from the records; compare weights
    ml-assets status [MODEL] [--format table|json]              each champion's age, the last decision and refusal,
                                                                days since a full training, 7 days' compute
    ml-assets usage [--team T] [--model M] [--since DAY] [--format table|json]
                                                                what each team spent: trainings, trials, scoring
    ml-assets verify [MODEL] [--repair] [--json]                every object of main's history, version and alias whole;
                                                                --repair rebuilds what sources and records can
    ml-assets paths                                             where the local home keeps everything
    ml-assets schema [--output DIR]                             the spec's JSON schemas, for editors
    ml-assets instance [--production] [--force]                 the package's dagster.yaml into DAGSTER_HOME
    ml-assets doctor                                            every production service checked before a run: stores,
                                                                MLflow and its credentials, the Dagster database
    ml-assets mlflow-server [--host H] [--port P]               the production MLflow server, with authentication
    ml-assets mlflow-users create-platform | create-user NAME | grant-platform
                                                                its identities, as its admin (docs/deployment.md)

Inside a Dagster project (a pyproject.toml with [tool.dg]), MODEL is one of its model components and
the home is the project's; ML_ASSETS_MODELS_DIR names a directory of specs instead.

Exit codes: 0 done, 1 refused or failed (the message says why), 2 bad model name, version or input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from ml_assets import cli_project
from ml_assets.cli_project import refuse
from ml_assets.deploy import mlflow_users
from ml_assets.project import ProjectError
from ml_assets.promotion import status_command
from ml_assets.runs import prepare_home
from ml_assets.settings import Settings, SettingsError, load_settings
from ml_assets.usage import command as usage_command
from ml_assets.validation import command as validation_command
from ml_assets.verification import command as verify_command


def version_store(settings: Settings):
    """The store the definitions use (same settings), without loading Dagster."""
    if settings.version_store == "lakefs":
        from ml_assets.settings import LAKEFS_VARIABLES
        from ml_assets.versioning.lakefs_backend import LakeFSVersionStore

        missing = [name for name in LAKEFS_VARIABLES if not os.environ.get(name)]
        if missing:
            raise SystemExit(f"ml-assets: ML_ASSETS_VERSION_STORE=lakefs needs {', '.join(missing)}")
        return LakeFSVersionStore(*(os.environ[name] for name in LAKEFS_VARIABLES))
    from ml_assets.versioning import LocalVersionStore

    return LocalVersionStore(settings.version_store_root, objects_url=settings.objects_url)


def lineage(model: str, version: str | None, alias: str | None, partition: str | None, as_json: bool,
            predictions: str | None = None) -> int:
    """Exit 0 when every reachable hash matches, 1 on a mismatch, 2 when the model, version or
    predictions file does not exist."""
    from ml_assets import lineage as lin
    from ml_assets.names import InvalidName, check_model_name

    settings = load_settings()
    client, store = _client(settings), version_store(settings)
    try:
        paths = _object_paths(settings, model)
        if predictions:
            result = lin.trace_predictions(client, store, check_model_name(model), predictions, paths)
        else:
            result = lin.trace(client, store, model, version, alias, partition, paths)
    except (lin.LineageError, InvalidName) as exc:
        print(f"ml-assets lineage: {exc}", file=sys.stderr)
        return 2
    print(lin.as_json(result) if as_json else lin.render(result))
    for check in result.mismatches:
        print(f"MISMATCH: {check.what}: expected {check.expected}, found {check.actual} at {check.where}", file=sys.stderr)
    return 1 if result.mismatches else 0


def _object_paths(settings: Settings, model: str):
    """The day's object paths from the spec, or None (the store is listed) when the spec is gone."""
    from ml_assets.layout import Layout
    from ml_assets.model_files import load_declared_spec
    from ml_assets.names import InvalidName, check_model_name
    from ml_assets.spec import SpecError

    try:
        spec = load_declared_spec(settings, check_model_name(model))
    except (SpecError, InvalidName):
        return None
    return lambda day: list(Layout.of(spec).object_paths(dt.date.fromisoformat(day)).values())


def _client(settings: Settings):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)


def move_champion(command: str, model: str, version: str | None, reason: str) -> int:
    """Promote or roll back through the promotion job (the same audited path the sensor uses)."""
    import getpass

    from ml_assets.model_files import load_declared_spec
    from ml_assets.names import InvalidName, check_model_name
    from ml_assets.registry import versions as registry
    from ml_assets.spec import SpecError

    settings = load_settings()
    try:
        spec = load_declared_spec(settings, check_model_name(model))
        if not reason.strip():
            raise ValueError("--reason must say why (it goes into the audit record)")
        client = _client(settings)
        if version is not None:
            registry.get_version(client, model, version)
        # Before the run: an identity MLflow does not let move @champion is told so in one message,
        # and no Dagster run, pending record or log line is written for it.
        registry.check_can_set_alias(client, model, registry.CHAMPION)
    except registry.PermissionDenied as exc:
        print(f"ml-assets {command}: {exc}", file=sys.stderr)
        return 1
    except (InvalidName, SpecError, registry.RegistryError, ValueError) as exc:
        return refuse(command, str(exc).splitlines()[0])
    prepare_home(settings)
    import dagster as dg

    from ml_assets.pipeline.graph import ModelGraph, Stage
    from ml_assets.promotion.config import promotion_run_config
    from ml_assets.promotion.record import PromotionRecord
    from ml_assets.runs import in_process_tags, model_defs, report_failure

    graph = ModelGraph(spec)
    job = model_defs(settings, spec).resolve_job_def(graph.promote_job)
    actor = f"cli {getpass.getuser()}"
    result = job.execute_in_process(
        run_config=promotion_run_config(spec, command, version or "", reason, actor),
        instance=dg.DagsterInstance.get(), raise_on_error=False,
        tags={"ml_assets/model": spec.name, "ml_assets/promotion": command, **in_process_tags(f"ml-assets {command}")},
    )
    if not result.success:
        return report_failure(result, f"of {graph.promote_job}", f"ml-assets {command}")
    materialization = result.asset_materializations_for_node(graph.key(Stage.PRODUCTION_MODEL).to_python_identifier())[-1]
    done = PromotionRecord.from_metadata(materialization.metadata)
    print(f"{spec.name}: @champion is version {done.champion_version} ({done.outcome}: {done.decision}; "
          f"previous {done.previous_version}); recorded in {done.promotions_log} and the version's MLflow tags")
    return 0


def audit(model: str, version: str | None, fmt: str) -> int:
    import json

    from ml_assets import audit as aud
    from ml_assets import lineage as lin
    from ml_assets.evaluation.refusals import refusals
    from ml_assets.names import InvalidName
    from ml_assets.registry import versions as registry

    settings = load_settings()
    try:
        found = aud.collect(_client(settings), version_store(settings), model, version,
                            _object_paths(settings, model))
    except (lin.LineageError, registry.RegistryError) as exc:
        # A model whose every candidate was refused has no version to audit, but its refusals are
        # still the record an auditor needs.
        refused = refusals(version_store(settings), model)
        if refused:
            print("\n".join(aud.render_refusals(refused, aud.refusals_log(model))))
        return refuse("audit", str(exc) + (f"; {len(refused)} candidate(s) refused, listed above" if refused else ""))
    except InvalidName as exc:
        return refuse("audit", str(exc))
    print(json.dumps(found, indent=1, default=str) if fmt == "json" else aud.render_markdown(found))
    return 1 if found["mismatches"] else 0


def card(model: str, version: str | None, fmt: str, output: str | None) -> int:
    """Print (or write) a version's model card, built from its records now; 2 on a bad model or version."""
    from ml_assets import cards
    from ml_assets.evaluation.refusals import refusals
    from ml_assets.model_files import load_declared_spec
    from ml_assets.names import InvalidName, check_model_name
    from ml_assets.promotion import moves as promotion
    from ml_assets.registry import versions as registry
    from ml_assets.spec import SpecError

    settings = load_settings()
    client = _client(settings)
    try:
        spec = load_declared_spec(settings, check_model_name(model))
        if version is None:
            found = (registry.by_alias(client, model, registry.CHAMPION)
                     or registry.by_alias(client, model, registry.CHALLENGER))
            if found is None:
                return refuse("card", f"model {model!r} has no @champion or @challenger: give --version")
            version = str(found.version)
        store = version_store(settings)
        text, page = cards.build(client, spec, version, promotion.history(store, model), refusals(store, model))
    except (registry.RegistryError, InvalidName, SpecError) as exc:
        return refuse("card", str(exc))
    content = page if fmt == "html" else text
    if output:
        Path(output).write_text(content, encoding="utf-8")
        print(f"wrote the model card of {model} version {version} to {output}")
    else:
        print(content, end="")
    return 0


def reproduce(model: str, version: str, workdir: str | None, registered_code: bool = False,
              chain: bool = False) -> int:
    from ml_assets import audit as aud
    from ml_assets.code_version import package_code_version
    from ml_assets.names import InvalidName
    from ml_assets.registry import versions as registry

    settings = load_settings()
    where = Path(workdir) if workdir else settings.home / "reproduce"
    try:
        client = _client(settings)
        if chain:
            results = aud.reproduce_chain(client, model, version, where, package_code_version(), registered_code)
        else:
            results = [aud.reproduce(client, model, version, where, package_code_version(), registered_code)]
    except (registry.RegistryError, InvalidName) as exc:
        return refuse("reproduce", str(exc))
    for result in results:
        start = f"; started from {result.started_from}" if result.started_from else ""
        if result.identical:
            print(f"{model} version {result.version}: reproduced bit for bit; weights sha256 {result.actual_sha256} "
                  f"(in {result.output_dir}){start}")
            continue
        print(f"{model} version {result.version}: NOT reproduced: expected weights sha256 {result.expected_sha256}, "
              f"got {result.actual_sha256}{start}", file=sys.stderr)
        for reason in result.reasons:
            print(f"  reason: {reason}", file=sys.stderr)
        if chain and result.version != str(version):
            print(f"  the chain stops here: version {version} starts from this version's weights", file=sys.stderr)
        return 1
    return 0


def _reproduce_parser(sub) -> None:
    rep = sub.add_parser("reproduce", help="retrain a version from its records and compare the weights' sha256")
    rep.add_argument("model")
    rep.add_argument("--version", required=True)
    rep.add_argument("--workdir", help="where to train (default: <home>/reproduce)")
    rep.add_argument("--registered-code", action="store_true",
                     help="a model factory's code: the copy registered with the version, not its recorded directory")
    rep.add_argument("--chain", action="store_true",
                     help="a fine-tuned version: rebuild every training of its chain from the last full one, each "
                          "from its parent's reproduction")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ml-assets", description="ml_assets command line")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="materialize the bundled model for a short window of days")
    run.add_argument("--model", default="flights_delay")
    run.add_argument("--day", help="the partition to train (default: the first day with a full window)")
    trace = sub.add_parser("lineage", help="walk a registered model back to the bytes it learned from")
    trace.add_argument("model")
    which = trace.add_mutually_exclusive_group()
    which.add_argument("--version", help="a model version number")
    which.add_argument("--alias", help="a model alias, e.g. champion or challenger")
    which.add_argument("--partition", help="the version trained for this day (YYYY-MM-DD)")
    which.add_argument("--predictions", metavar="FILE", help="a predictions file (path or URL): the version that "
                       "scored it and the rows it scored")
    trace.add_argument("--json", action="store_true", help="print the chain and checks as JSON")
    validation_command.add_parsers(sub)
    promote = sub.add_parser("promote", help="make a version the champion (its promotion gate must have passed)")
    promote.add_argument("model")
    promote.add_argument("version")
    promote.add_argument("--reason", required=True, help="why; recorded in the audit log")
    back = sub.add_parser("rollback", help="put the previous champion back")
    back.add_argument("model")
    back.add_argument("--reason", required=True, help="why; recorded in the audit log")
    aud = sub.add_parser("audit", help="evidence, data checks, promotions and reproducibility pins of a version")
    aud.add_argument("model")
    aud.add_argument("--version", help="a version number (default: the champion)")
    aud.add_argument("--format", choices=("md", "json"), default="md")
    crd = sub.add_parser("card", help="a version's model card, from its records (markdown, or HTML with its plots)")
    crd.add_argument("model")
    crd.add_argument("--version", help="a version number (default: the champion, else the challenger)")
    crd.add_argument("--format", choices=("md", "html"), default="md")
    crd.add_argument("--output", metavar="FILE", help="write it to FILE instead of printing it")
    _reproduce_parser(sub)
    usage_command.add_parser(sub)
    status_command.add_parser(sub)
    verify_command.add_parser(sub)
    cli_project.add_parsers(sub)
    server = sub.add_parser("mlflow-server", help="the production MLflow server (PostgreSQL + S3; docs/deployment.md)")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=5000)
    server.add_argument("--workers", type=int, default=2)
    server.add_argument("--allowed-host", action="append", default=[], dest="allowed_hosts",
                        help="another host:port clients reach the server by (repeatable)")
    mlflow_users.add_parser(sub)
    sub.add_parser("doctor", help="check every production service a run needs, naming the variable to fix")
    args = parser.parse_args(argv)
    try:
        _dispatch(args)
    except (SettingsError, ProjectError) as exc:  # a bad environment: one line naming the variable, not a traceback
        print(f"ml-assets: {exc}", file=sys.stderr)
        sys.exit(2)


def _dispatch(args: argparse.Namespace) -> None:
    if args.command == "mlflow-server":
        from ml_assets.deploy.services import run_mlflow_server

        sys.exit(run_mlflow_server(args.host, args.port, args.workers, args.allowed_hosts))
    if args.command == "doctor":
        from ml_assets.deploy.doctor import run as doctor

        sys.exit(doctor())
    if args.command == "mlflow-users":
        sys.exit(mlflow_users.run(args.action, args.name))
    if args.command in ("promote", "rollback"):
        sys.exit(move_champion(args.command, args.model, getattr(args, "version", None), args.reason))
    if args.command == "audit":
        sys.exit(audit(args.model, args.version, args.format))
    if args.command == "card":
        sys.exit(card(args.model, args.version, args.format, args.output))
    if args.command == "reproduce":
        sys.exit(reproduce(args.model, args.version, args.workdir, args.registered_code, args.chain))
    if (code := validation_command.dispatch(args)) is not None:
        sys.exit(code)
    if args.command == "demo":
        from ml_assets.demo import demo

        sys.exit(demo(args.model, args.day))
    if args.command == "usage":
        sys.exit(usage_command.usage(args.team, args.model, args.since, args.format))
    if args.command == "status":
        sys.exit(status_command.status(args.model, args.format, _client, version_store))
    if args.command == "verify":
        sys.exit(verify_command.verify(args.model, args.repair, args.json, _client, version_store))
    if args.command == "lineage":
        sys.exit(lineage(args.model, args.version, args.alias, args.partition, args.json, args.predictions))
    sys.exit(cli_project.dispatch(args))


if __name__ == "__main__":
    main()
