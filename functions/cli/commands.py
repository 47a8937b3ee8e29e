"""The command line for people and for task pods.

serve ACTION            run one service (check, get, put, dead-letter, reply-relay, artifacts)
                        under gunicorn
run ACTION …            run one action locally and print the reply (progress on stderr)
demo [--serve]          start the three services locally and show a check/get/put round trip
runs [--since 1h] [--failed]   the runs recorded in STORE_URL lately
logs RUN_ID             a run's stored (redacted) log
versions --type NAME --source JSON|@file   a resource's version history
tekton-controller       the Tekton Custom Task's controller (CustomRuns → requests → status)
send ACTION DATA        post one request event to $K_SINK (a scheduled check's CronJob)
artifact pack|unpack    a directory to an artifact and back (Tekton steps; ARTIFACTS_URL)
stage …, collect …      the steps around the resource script inside a task pod
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from functions.errors import ConfigError, FunctionError
from functions.steps import pod_contract
from storage.store_errors import StorageError


def console() -> None:
    """The ``resource-functions`` command of the installed package."""
    sys.exit(main(sys.argv[1:]))


def main(argv: list[str]) -> int:
    if argv and argv[0] in POD_STEPS:  # task pods: the pod contract parses their arguments
        return run_pod_step(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (FunctionError, StorageError) as err:  # hostile trees and artifacts included
        print(f"error: {err}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resource-functions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(required=True, dest="command")
    serve = sub.add_parser("serve", help="serve one action over HTTP (CloudEvents)")
    serve.add_argument(
        "action", choices=["check", "get", "put", "dead-letter", "reply-relay", "artifacts"]
    )
    serve.add_argument("--host", help="default: $HOST, else 127.0.0.1")
    serve.add_argument("--port", type=int, help="default: $PORT, else 8080")
    serve.add_argument("--threads", type=int, help="default: $THREADS, else 16")
    serve.set_defaults(handler=cmd_serve)
    run = sub.add_parser("run", help="run one action locally and print the reply data")
    run.add_argument("action", choices=["check", "get", "put"])
    kind = run.add_mutually_exclusive_group(required=True)
    kind.add_argument("--type", help="resource type name from the catalogue")
    kind.add_argument("--image", help="resource type image")
    run.add_argument("--source", default="{}", help="source as JSON, or @file")
    run.add_argument("--version", help="version as JSON (check: optional, get: required)")
    run.add_argument("--params", help="params as JSON, or @file")
    run.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=DIR|URL",
        help="put input: a local directory (uploaded first) or an artifact URL",
    )
    run.add_argument("--output", metavar="DIR", help="get: unpack the artifact into DIR")
    run.set_defaults(handler=cmd_run)
    demo = sub.add_parser("demo", help="start the services locally and show a round trip")
    demo.add_argument("--serve", action="store_true", help="keep the services running after")
    demo.add_argument("--port", type=int, default=8081, help="first of three ports")
    demo.set_defaults(handler=cmd_demo)
    add_inspect_parsers(sub)
    tekton = sub.add_parser(
        "tekton-controller", help="reconcile Tekton CustomRuns (docs/tekton.md)"
    )
    tekton.set_defaults(handler=cmd_tekton_controller)
    add_artifact_parsers(sub)
    send = sub.add_parser("send", help="post one request event to the Broker ($K_SINK)")
    send.add_argument("action", choices=["check", "get", "put"])
    send.add_argument("data", metavar="DATA", help="the request's data as JSON, or @file")
    send.add_argument("--id", default="", help="the event id (default: a new UUID)")
    send.add_argument("--subject", default="", help="the event subject, carried to the replies")
    send.add_argument("--source", default="", help="the event source (/resource-functions/cli)")
    send.add_argument("--sink", default=os.environ.get("K_SINK", ""), help="default: $K_SINK")
    send.set_defaults(handler=cmd_send)
    add_pod_step_parsers(sub)
    return parser


def cmd_send(args: argparse.Namespace) -> int:
    from functions.cli.send import send

    data = _json_arg(args.data, "DATA")
    return send(
        args.action,
        data,
        sink=args.sink,
        out=sys.stdout,
        event_id=args.id,
        source=args.source,
        subject=args.subject,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from functions.cli.demo import run_demo
    except ImportError:  # .dockerignore keeps the demo out of the production image
        raise SystemExit("error: demo is for development: run it from a source checkout") from None
    return run_demo(serve=args.serve, base_port=args.port)


def add_artifact_parsers(sub: Any) -> None:
    """``artifact pack DIR`` and ``artifact unpack ARTIFACT DIR`` (functions.cli.artifact)."""
    artifact = sub.add_parser(
        "artifact", help="a directory to an artifact and back, through the artifacts service"
    )
    verbs = artifact.add_subparsers(required=True, dest="verb")
    pack = verbs.add_parser("pack", help="hand DIR over as an artifact; print it as JSON")
    pack.add_argument("directory", metavar="DIR")
    pack.add_argument("--result", metavar="FILE", help="also write the artifact JSON to FILE")
    pack.set_defaults(handler=cmd_artifact)
    unpack = verbs.add_parser("unpack", help="extract an artifact into DIR, digest verified")
    unpack.add_argument("artifact", metavar="ARTIFACT", help="the artifact as JSON, or @file")
    unpack.add_argument("directory", metavar="DIR")
    unpack.set_defaults(handler=cmd_artifact)


ARTIFACTS_TOKEN_FILE = "/var/run/secrets/resource-functions/token/token"


def cmd_artifact(args: argparse.Namespace) -> int:
    """A Tekton step's side of the artifacts service: ``ARTIFACTS_URL``, and the pod's
    projected ServiceAccount token in ``ARTIFACTS_TOKEN_FILE``; no store credential."""
    import os

    import requests

    from functions.cli import artifact
    from storage.archive import ArchiveOptions, Limits

    url = os.environ.get("ARTIFACTS_URL", "")
    if not url:
        print(
            "error: ARTIFACTS_URL (the artifacts service) is not set: artifact pack and unpack "
            "are Tekton steps' (docs/tekton.md); locally, hand a directory to a put with "
            "`run put ... --input NAME=DIR`, and take a get's with `run get ... --output DIR`",
            file=sys.stderr,
        )
        return 2
    service = artifact.ArtifactsService(
        url, os.environ.get("ARTIFACTS_TOKEN_FILE") or ARTIFACTS_TOKEN_FILE
    )
    try:
        if args.verb == "pack":
            packed = json.dumps(
                service.pack(Path(args.directory), ArchiveOptions.from_env(os.environ))
            )
            if args.result:
                Path(args.result).write_text(packed)
            print(packed)
            return 0
        given = args.artifact
        text = Path(given[1:]).read_text() if given.startswith("@") else given
        service.unpack(
            artifact.parse_artifact(text), Path(args.directory), Limits.from_env(os.environ)
        )
    except (artifact.BadArtifact, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except requests.RequestException as err:
        print(f"error: the artifacts service at {url} is unreachable: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_tekton_controller(_args: argparse.Namespace) -> int:
    from functions.tekton.receiver import main as controller_main

    return controller_main()


POD_STEPS = ("stage", "collect")


def add_inspect_parsers(sub: Any) -> None:
    """``runs``, ``logs``, ``versions``: read the store of STORE_URL (functions.cli.inspect)."""
    runs = sub.add_parser("runs", help="list the runs started lately (from STORE_URL)")
    runs.add_argument("--since", default="1h", help="how far back: 90s, 30m, 1h, 2d (1h)")
    runs.add_argument("--failed", action="store_true", help="failed runs only")
    runs.set_defaults(handler=cmd_runs)
    logs = sub.add_parser("logs", help="print a run's stored log")
    logs.add_argument("run_id", metavar="RUN_ID")
    logs.add_argument(
        "--raw", action="store_true", help="the stored bytes as they are (control characters too)"
    )
    logs.set_defaults(handler=cmd_logs)
    versions = sub.add_parser("versions", help="print a resource's version history")
    versions.add_argument("--type", required=True, help="resource type name from the catalogue")
    versions.add_argument("--source", required=True, help="source as JSON, or @file")
    versions.add_argument(
        "--team", default="", help="build.team: whose history, and ((var)) credentials"
    )
    versions.add_argument("--pipeline", default="", help="build.pipeline, for ((var)) references")
    versions.set_defaults(handler=cmd_versions)


def cmd_runs(args: argparse.Namespace) -> int:
    from functions.cli.inspect import runs

    return runs(args.since, failed=args.failed, out=sys.stdout, err=sys.stderr)


def cmd_logs(args: argparse.Namespace) -> int:
    from functions.cli.inspect import logs

    return logs(args.run_id, out=sys.stdout.buffer, raw=args.raw)


def cmd_versions(args: argparse.Namespace) -> int:
    from functions.cli.inspect import versions

    source = _json_arg(args.source, "--source")
    return versions(args.type, source, team=args.team, pipeline=args.pipeline, out=sys.stdout)


def add_pod_step_parsers(sub: Any) -> None:
    """``stage`` and ``collect``: run inside task pods. Listed here for ``--help``; their
    arguments are parsed by ``functions.steps.pod_contract`` (the side that the pod spec writes)."""
    for name, what in (("stage", "unpack a put's inputs"), ("collect", "record the outcome")):
        step = sub.add_parser(name, help=f"(task pods) {what}", add_help=False)
        step.add_argument("args", nargs=argparse.REMAINDER)


def run_pod_step(name: str, argv: list[str]) -> int:
    """The exit status of the pod step ``name`` (``stage`` or ``collect``) given ``argv``."""
    from functions.task import in_pod

    try:
        if name == "stage":
            stage = pod_contract.StageStep.parse(argv)
            return in_pod.stage_main(stage, settings=in_pod.step_settings("stage"))
        collect = pod_contract.CollectStep.parse(argv)
        return in_pod.collect_main(
            collect, in_pod.step_settings("collect: cannot record the outcome")
        )
    except pod_contract.StepArgsError as err:
        return in_pod.fail(str(err), 2)
    except in_pod.StepCannotStart as err:
        return err.status


def cmd_serve(args: argparse.Namespace) -> int:
    from functions import logs
    from functions.http.serving import serve
    from functions.settings import Settings, open_to_the_network

    settings = Settings.from_env()
    logs.configure(settings.log_level)
    hooks: dict[str, Any] = {}
    whole_bodies = True
    host = args.host or settings.host
    if args.action in ("check", "get", "put") and (warning := open_to_the_network(settings, host)):
        logging.getLogger("functions").warning(warning)
    if args.action == "dead-letter":
        from functions.http.dead_letter import create_dead_letter_app

        app = create_dead_letter_app()
    elif args.action == "reply-relay":
        from functions.http.reply_relay import create_relay_app

        if settings.cache_secret_generated:
            raise ConfigError("the reply relay needs CACHE_SECRET: the functions' own key")
        app = create_relay_app(settings.cache_secret, settings.sink)
    elif args.action == "artifacts":
        from functions.tekton.artifact_service import artifacts_app_from

        app, whole_bodies = artifacts_app_from(settings), False
        hooks = {"started": _inputs_sweep(app.extensions["store"], settings)}
    else:
        from functions.http.app import create_app

        app = create_app(settings, args.action)
        service = app.extensions["service"]
        runtime = service.runtime  # its threads belong in the worker
        sweep = _inputs_sweep(service.store, settings) if args.action == "put" else _nothing
        hooks = {"started": lambda: (runtime.start_sweeps(), sweep()), "stopping": runtime.close}
    serve(
        app,
        host=host,
        port=args.port or settings.port,
        threads=args.threads or settings.threads,
        whole_bodies=whole_bodies,
        **hooks,
    )
    return 0


def _inputs_sweep(store: Any, settings: Any) -> Callable[[], object]:
    """What starts the hourly sweep of expired inputs, where the store needs one (a file
    store: functions.ledger.inputs); else nothing."""
    from functions.ledger.inputs import sweeper

    found = sweeper(store, settings.uploads.inputs_ttl_days)
    return found.start if found is not None else _nothing


def _nothing() -> None:
    pass


def cmd_run(args: argparse.Namespace) -> int:
    from functions.cli.run import run_local

    data: dict[str, Any] = {"source": _json_arg(args.source, "--source")}
    data.update({"type": args.type} if args.type else {"image": args.image})
    if args.version:
        data["version"] = _json_arg(args.version, "--version")
    if args.params:
        data["params"] = _json_arg(args.params, "--params")
    reply = run_local(
        args.action,
        data,
        inputs=dict(_pair(i) for i in args.input),
        output=Path(args.output) if args.output else None,
    )
    print(json.dumps(reply, indent=2))
    return 0 if "error" not in reply else 1


def _json_arg(value: str, name: str) -> Any:
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{name}: not valid JSON: {err}") from None


def _pair(value: str) -> tuple[str, str]:
    name, sep, where = value.partition("=")
    if not sep or not name or not where:
        raise SystemExit(f"--input {value!r}: expected NAME=DIR or NAME=URL")
    return name, where
