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
        "look-ahead, and every limit applied. --history N adds its recent decisions and "
        "scale events (GET .../history), as `kubectl describe` shows Events; --audit FILE "
        "reads them from an audit log instead, with no service.",
    )
    explain.add_argument("model", nargs="?", help="model name, or namespace/name (with "
                         "--audit: optional, every model in the log when left out)")
    explain.add_argument("-n", "--namespace", help="namespace (needed when the name is in "
                         "several namespaces)")
    explain.add_argument("--url", default=DEFAULT_URL,
                         help=f"the service's HTTP address (default {DEFAULT_URL})")
    explain.add_argument("--json", action="store_true", help="print the raw JSON document")
    explain.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    explain.add_argument("--history", type=int, metavar="N",
                         help="also print the last N decisions and scale events (1 to "
                         "356, what the service keeps per model)")
    explain.add_argument("--audit", type=Path, action="append", metavar="FILE",
                         help="replay an audit log (audit.path) into the history offline; "
                         "repeat for rotated files, oldest first (decisions.jsonl.1, then "
                         "decisions.jsonl)")
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


def _ask(url: str, args: argparse.Namespace) -> dict[str, Any] | int:
    """The JSON answer of a /v1 URL, or the exit code once what went wrong is said:
    2 when the service cannot be reached, 1 when it answers with an error."""
    try:
        code, document = fetch_decision(url, timeout=args.timeout)
    except OSError as error:
        print(f"scaler explain: cannot reach the service at {args.url}: {error}",
              file=sys.stderr)
        return 2
    if code != 200:
        print(f"scaler explain: {document.get('error', document)}", file=sys.stderr)
        return 1
    return document


def run_explain(args: argparse.Namespace) -> int:
    from scaler.service import explain, http_api

    if args.history is not None and not 1 <= args.history <= http_api.HISTORY_LIMIT_MAX:
        print(f"scaler explain: --history: expected 1 to {http_api.HISTORY_LIMIT_MAX}, got "
              f"{args.history}", file=sys.stderr)
        return 2
    if args.audit:
        return explain_audit(args)
    if args.model is None:
        print("scaler explain: name a MODEL (or replay an audit log with --audit FILE)",
              file=sys.stderr)
        return 2
    document = _ask(http_api.decision_url(args.url, args.model, args.namespace), args)
    if isinstance(document, int):
        return document
    if args.history is None:
        print(json.dumps(document, indent=2) if args.json else explain.describe(document))
        return 0
    url = http_api.decision_url(args.url, args.model, args.namespace, endpoint="history")
    history = _ask(f"{url}?limit={args.history}", args)
    if isinstance(history, int):
        return history
    if args.json:
        print(json.dumps({"decision": document, "history": history}, indent=2))
    else:
        print(explain.describe(document) + "\n\n" + explain.events_table(history))
    return 0


# Skipped audit lines named in the warning; the rest are counted (a log torn everywhere
# should not bury the answer under thousands of lines).
_SKIPPED_NAMED = 10


def _select(keys: list[str], model: str | None, namespace: str | None) -> list[str]:
    """The keys `model` names ('name', 'namespace/name' or with -n), all when None."""
    if model is None:
        return keys
    if "/" in model or namespace:
        key = model if "/" in model else f"{namespace}/{model}"
        return [key] if key in keys else []
    return [key for key in keys if key.partition("/")[2] == model]


def explain_audit(args: argparse.Namespace) -> int:
    """`scaler explain --audit FILE [MODEL]`: the history view from audit files."""
    from scaler.service import explain
    from scaler.service import history as decision_history

    files = ", ".join(str(path) for path in args.audit)
    try:
        replayed = decision_history.replay(args.audit)
    except OSError as error:
        print(f"scaler explain: cannot read the audit log: {error}", file=sys.stderr)
        return 2
    if replayed.skipped:
        named = "; ".join(str(line) for line in replayed.skipped[:_SKIPPED_NAMED])
        more = len(replayed.skipped) - _SKIPPED_NAMED
        print(f"scaler explain: warning: skipped {len(replayed.skipped)} of "
              f"{replayed.lines} lines (truncated or corrupt): {named}"
              + (f"; and {more} more" if more > 0 else ""), file=sys.stderr)
    keys = _select(sorted(replayed.histories), args.model, args.namespace)
    if not keys:
        what = "any model" if args.model is None else f"model {args.model!r}"
        print(f"scaler explain: no decisions for {what} in {files}", file=sys.stderr)
        return 1
    if args.model is not None and len(keys) > 1:
        print(f"scaler explain: model {args.model!r} is in several namespaces; ask for one "
              "of " + ", ".join(keys), file=sys.stderr)
        return 1
    # Ages count back from the newest decision in the files, not from today: a log read
    # a week later still reads "2m" for two minutes before the end.
    newest = max(entries[-1].last_at for entries in
                 (history.entries() for history in replayed.histories.values()) if entries)
    documents = []
    for key in keys:
        entries = replayed.histories[key].entries()
        shown = entries if args.history is None else entries[-args.history:]
        documents.append(explain.history_document(key, shown, now=newest, kept=len(entries)))
    if args.json:
        print(json.dumps({"histories": documents}, indent=2))
    else:
        print("\n\n".join(f"{document['model']}:\n{explain.events_table(document)}"
                           for document in documents))
    return 0
