"""The command line for people and for task pods.

serve ACTION            run one service (check, get, put or dead-letter) under gunicorn
run ACTION …            run one action locally and print the reply (progress on stderr)
demo [--serve]          start the three services locally and show a check/get/put round trip
stage …, collect …      the steps around the resource script inside a task pod
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from functions import pod_contract
from functions.errors import ConfigError, FunctionError
from storage.errors import StorageError

if TYPE_CHECKING:
    from functions.task.step_settings import StepSettings


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (FunctionError, StorageError) as err:  # hostile trees and artifacts included
        print(f"error: {err}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m functions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(required=True, dest="command")
    serve = sub.add_parser("serve", help="serve one action over HTTP (CloudEvents)")
    serve.add_argument("action", choices=["check", "get", "put", "dead-letter"])
    serve.add_argument("--host", help="default: $HOST, else 0.0.0.0")
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
    add_pod_step_parsers(sub)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from functions.cli.demo import run_demo
    except ImportError:  # .dockerignore keeps the demo out of the production image
        raise SystemExit("error: demo is for development: run it from a source checkout") from None
    return run_demo(serve=args.serve, base_port=args.port)


def add_pod_step_parsers(sub: Any) -> None:
    """``stage`` and ``collect``: run inside task pods (functions.pod_contract)."""
    stage = sub.add_parser("stage", help="(task pods) unpack a put's inputs")
    stage.add_argument("--dir", required=True, type=Path, help="the put's working directory")
    stage.add_argument("--input", action="append", default=[], metavar="NAME=KEY[@sha256:HEX]")
    stage.add_argument("--task-dir", type=Path, default=Path(pod_contract.TASK_DIR))
    stage.set_defaults(handler=cmd_stage)
    collect = sub.add_parser("collect", help="(task pods) store the resource step's outcome")
    collect.add_argument("--run-id", required=True)
    collect.add_argument("--action", required=True, choices=["check", "get", "put"])
    collect.add_argument("--dir", required=True, type=Path, help="the build dir (/tmp/build)")
    collect.add_argument("--stdin-file", type=Path, default=Path(pod_contract.STDIN_FILE))
    collect.add_argument("--cache-key")
    collect.add_argument("--history-key", help="check: the resource key of its version history")
    collect.add_argument("--history-limit", type=int, default=1000)
    collect.add_argument("--lease-key", help="async check: its lease, released once recorded")
    collect.add_argument("--lease-holder", help="async check: the nonce of its lease's holding")
    collect.add_argument("--reply-to-sink", action="store_true", help="post the reply to K_SINK")
    collect.add_argument("--request-id", default="")
    collect.add_argument("--subject")
    collect.add_argument("--traceparent", help="the request's: the posted events carry it on")
    collect.add_argument("--tracestate", default="")
    collect.set_defaults(handler=cmd_collect)


def cmd_stage(args: argparse.Namespace) -> int:
    from functions.pod_contract import parse_input
    from functions.task.in_pod import stage_main

    try:
        inputs = dict(parse_input(value) for value in args.input)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    settings = _step_settings("stage")
    if isinstance(settings, int):
        return settings
    return stage_main(directory=args.dir, inputs=inputs, task_dir=args.task_dir, settings=settings)


def cmd_collect(args: argparse.Namespace) -> int:
    from functions.model import HistoryPlan, LeaseHold
    from functions.pod_contract import ReplyPlan
    from functions.task.in_pod import CollectArgs, collect_main
    from functions.tracing import trace_context

    trace = trace_context(args.traceparent, args.tracestate)
    reply = ReplyPlan(args.request_id, args.subject, trace=trace) if args.reply_to_sink else None
    history = HistoryPlan(args.history_key, args.history_limit) if args.history_key else None
    held = args.lease_key and args.lease_holder
    lease = LeaseHold(args.lease_key, args.lease_holder) if held else None
    settings = _step_settings("collect: cannot record the outcome")
    if isinstance(settings, int):
        return settings
    return collect_main(
        CollectArgs(
            run_id=args.run_id,
            action=args.action,
            build_dir=args.dir,
            stdin_file=args.stdin_file,
            cache_key=args.cache_key,
            reply=reply,
            history=history,
            lease=lease,
        ),
        settings,
    )


def _step_settings(prefix: str) -> StepSettings | int:
    """The in-pod step's settings, or the exit status of a step that cannot start (its
    message in the termination log, as every step failure)."""
    from functions.task.in_pod import fail
    from functions.task.step_settings import StepSettings

    try:
        return StepSettings.from_env(os.environ)
    except ConfigError as err:
        return fail(f"{prefix}: {err}")


def cmd_serve(args: argparse.Namespace) -> int:
    from functions import logs
    from functions.http.serving import serve
    from functions.settings import Settings

    settings = Settings.from_env()
    logs.configure(settings.log_level)
    hooks: dict[str, Any] = {}
    if args.action == "dead-letter":
        from functions.http.dead_letter import create_dead_letter_app

        app = create_dead_letter_app()
    else:
        from functions.http.app import create_app

        app = create_app(settings, args.action)
        runtime = app.extensions["service"].runtime  # its threads belong in the worker
        hooks = {"started": runtime.start_sweeps, "stopping": runtime.close}
    serve(
        app,
        host=args.host or settings.host,
        port=args.port or settings.port,
        threads=args.threads or settings.threads,
        **hooks,
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from functions.cli.local import run_local

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
