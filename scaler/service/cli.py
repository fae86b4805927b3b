"""Subcommands of this area; `register` adds them to the `scaler` command line."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add this area's subcommands. Each sets `handler=func(args) -> exit code`."""
    explain = subparsers.add_parser(
        "explain",
        help="print the last decision for a model, in plain words",
        description="Ask a running service (GET /v1/models/.../decision) why it chose the "
        "replicas it did: each signal's value, age and recommendation, the cold-start "
        "look-ahead, and every limit applied.",
    )
    explain.add_argument("model", help="model name, or namespace/name")
    explain.add_argument("-n", "--namespace", help="namespace (needed when the name is in "
                         "several namespaces)")
    explain.add_argument("--url", default=DEFAULT_URL,
                         help=f"the service's HTTP address (default {DEFAULT_URL})")
    explain.add_argument("--json", action="store_true", help="print the raw JSON document")
    explain.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    explain.set_defaults(handler=run_explain)

    run = subparsers.add_parser(
        "run",
        help="run the autoscaler service",
        description="Load policies, subscribe to signals, decide and scale. Settings come "
        "from SCALER_* environment variables over an optional YAML file (see docs/service.md).",
    )
    run.add_argument("--settings", type=Path, help="YAML settings file (or $SCALER_SETTINGS_FILE)")
    run.add_argument("--policies", type=Path, nargs="+", metavar="PATH",
                     help="policy files or folders (overrides policies.paths)")
    run.add_argument("--dry-run", action="store_true",
                     help="log the scale patches instead of sending them (on a Lease of its "
                     "own, <lease name>-dry-run: never the live replicas' one)")
    run.set_defaults(handler=run_service)


def run_service(args: argparse.Namespace) -> int:
    import asyncio

    from scaler.actuators import cli as kube_cli
    from scaler.core import settings as core_settings
    from scaler.service import logs, runner, settings

    try:
        loaded = settings.load_settings(args.settings)
    except core_settings.SettingsError as error:
        for invalid in error.problems:
            print(f"scaler run: invalid settings: {invalid}", file=sys.stderr)
        return 2
    if args.policies:
        loaded = loaded.model_copy(update={
            "policies": loaded.policies.model_copy(update={"paths": list(args.policies)})})
    if args.dry_run:
        loaded = loaded.model_copy(update={
            "kube": loaded.kube.model_copy(update={"dry_run": True})})
    # Asked before anything starts, so a missing cluster is one line, not a traceback;
    # exit 1 as any failed start (2 is for bad settings).
    problem = asyncio.run(kube_cli.cluster_problem(loaded.kube))
    if problem is not None:
        print(f"scaler could not start: {problem}", file=sys.stderr)
        return 1
    logs.configure(level=loaded.log.level, fmt=loaded.log.format)
    return asyncio.run(runner.Service(loaded).run_until_signalled())


def fetch_decision(url: str, *, timeout: float) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of a /v1 decision URL; raises OSError when unreachable."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), dict(json.loads(response.read()))
    except urllib.error.HTTPError as error:
        with error:
            body = error.read()
        try:
            return error.code, dict(json.loads(body))
        except ValueError:
            return error.code, {"error": body.decode(errors="replace")}


def run_explain(args: argparse.Namespace) -> int:
    from scaler.service import explain, http_api

    url = http_api.decision_url(args.url, args.model, args.namespace)
    try:
        code, document = fetch_decision(url, timeout=args.timeout)
    except OSError as error:
        print(f"scaler explain: cannot reach the service at {args.url}: {error}",
              file=sys.stderr)
        return 2
    if code != 200:
        print(f"scaler explain: {document.get('error', document)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(explain.describe(document))
    return 0
