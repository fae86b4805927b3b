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
                     help="log the scale patches instead of sending them")
    run.set_defaults(handler=run_service)

    # Defaults are repeated from scaler.service.demo, which is imported only when the
    # demo runs (it brings the simulator and numpy).
    demo = subparsers.add_parser(
        "demo",
        help="watch the service scale a simulated GPU cluster (no cluster needed)",
        description="Start an embedded nats-server, a simulated GPU cluster whose replicas "
        "report over NATS, and the real service; replay a bundled trace slice on an "
        "accelerated clock and show the decisions live (see docs/demo.md).",
    )
    demo.add_argument("--policy", type=Path,
                      help="ScalePolicy file or folder (default: config/llama-8b.yaml)")
    demo.add_argument("--trace", type=Path, help="trace file or ServeGen folder (default: "
                      "loadtests/traces/AzureLLMInferenceTrace_conv_20min.csv)")
    demo.add_argument("--trace-format", default="auto",
                      choices=("auto", "azure", "mooncake", "servegen", "csv"),
                      help="trace format (default: sniffed)")
    demo.add_argument("--rate-scale", type=float, default=8.0,
                      help="multiply the trace's request rate (default 8)")
    demo.add_argument("--seed", type=int, default=0, help="seed for rate scaling (default 0)")
    demo.add_argument("--speed", type=float, default=60.0,
                      help="virtual seconds per real second (default 60)")
    demo.add_argument("--duration", type=float, default=1200.0, metavar="SECONDS",
                      help="virtual seconds of the trace to replay (default 1200: 20 s at 60x)")
    demo.add_argument("--initial-replicas", type=int, metavar="N",
                      help="replicas ready at the start (default: what the first minute needs)")
    demo.add_argument("--report", type=Path, metavar="OUT.html",
                      help="write the simulator's HTML report of the run")
    demo.add_argument("--json", type=Path, metavar="OUT.json", help="write a JSON summary")
    demo.add_argument("--no-ui", action="store_true",
                      help="plain log lines instead of the live terminal view")
    demo.add_argument("--metrics-api", action="store_true",
                      help="also serve the external metrics API (TLS, self-signed, loopback)")
    demo.add_argument("--log-level", default="WARNING",
                      choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="the service's own log level, on stderr (default WARNING)")
    demo.set_defaults(handler=run_demo)


def run_service(args: argparse.Namespace) -> int:
    import asyncio

    import pydantic

    from scaler.service import logs, runner, settings

    try:
        loaded = settings.load_settings(args.settings)
    except (FileNotFoundError, pydantic.ValidationError) as error:
        print(f"scaler run: invalid settings: {error}", file=sys.stderr)
        return 2
    if args.policies:
        loaded = loaded.model_copy(update={
            "policies": loaded.policies.model_copy(update={"paths": list(args.policies)})})
    if args.dry_run:
        loaded = loaded.model_copy(update={
            "kube": loaded.kube.model_copy(update={"dry_run": True})})
    logs.configure(level=loaded.log.level, fmt=loaded.log.format)
    return asyncio.run(runner.Service(loaded).run_until_signalled())


def run_demo(args: argparse.Namespace) -> int:
    from scaler.service import demo

    defaults = demo.DemoOptions()
    options = demo.DemoOptions(
        policy=args.policy or defaults.policy, trace=args.trace or defaults.trace,
        trace_format=args.trace_format, rate_scale=args.rate_scale, seed=args.seed,
        speed=args.speed, duration_s=args.duration, initial_replicas=args.initial_replicas,
        report=args.report, json_path=args.json, ui=not args.no_ui,
        metrics_api=args.metrics_api, log_level=args.log_level)
    return demo.main(options)


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
