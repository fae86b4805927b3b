"""`scaler demo`: its command line, and the run from options to exit code."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from scaler.demo import defaults

if TYPE_CHECKING:  # imported when the demo runs: it brings the simulator (numpy)
    from scaler.demo import scenario

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add `scaler demo`; it imports the simulator (numpy) only when it runs."""
    demo = subparsers.add_parser(
        "demo",
        help="watch the service scale a simulated GPU cluster (no cluster needed)",
        description="Start an embedded nats-server, a simulated GPU cluster whose replicas "
        "report over NATS, and the real service; replay a bundled trace slice on an "
        "accelerated clock and show the decisions live (see docs/demo.md).",
    )
    demo.add_argument("--policy", type=Path, default=defaults.DEFAULT_POLICY,
                      help="ScalePolicy file or folder (default: the bundled llama-8b.yaml, "
                      "as config/llama-8b.yaml)")
    demo.add_argument("--trace", type=Path, default=defaults.DEFAULT_TRACE,
                      help="trace file or ServeGen folder (default: the bundled "
                      f"{defaults.DEFAULT_TRACE.name})")
    demo.add_argument("--trace-format", default="auto",
                      choices=("auto", "azure", "mooncake", "servegen", "csv"),
                      help="trace format (default: sniffed)")
    demo.add_argument("--rate-scale", type=float,
                      help=f"multiply the trace's request rate (default "
                      f"{defaults.DEFAULT_RATE_SCALE:g}, halved for a policy whose max "
                      "cannot carry it)")
    demo.add_argument("--seed", type=int, default=0, help="seed for rate scaling (default 0)")
    demo.add_argument("--speed", type=float, default=defaults.DEFAULT_SPEED,
                      help=f"virtual seconds per real second (default "
                      f"{defaults.DEFAULT_SPEED:g})")
    demo.add_argument("--duration", type=float, default=defaults.DEFAULT_DURATION_S,
                      metavar="SECONDS", help="virtual seconds of the trace to replay "
                      f"(default {defaults.DEFAULT_DURATION_S:g})")
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


def run_demo(args: argparse.Namespace) -> int:
    from scaler.demo import scenario

    options = scenario.DemoOptions(
        policy=args.policy, trace=args.trace, trace_format=args.trace_format,
        rate_scale=args.rate_scale, seed=args.seed, speed=args.speed,
        duration_s=args.duration, initial_replicas=args.initial_replicas, report=args.report,
        json_path=args.json, ui=not args.no_ui, metrics_api=args.metrics_api,
        log_level=args.log_level)
    return main(options)


def main(options: scenario.DemoOptions, *, out: TextIO | None = None) -> int:
    """Run the demo; 0 when done or stopped by Ctrl-C / SIGTERM, 1 on a failure, 2 on bad
    input. The embedded nats-server is stopped (and its temp dir removed) in every case."""
    from scaler.demo import live, nats_server, results, scenario
    from scaler.service import logs

    stream = out or sys.stdout
    logs.configure(level=options.log_level, fmt="text")
    try:
        models, warnings = scenario.load_models(options)
    except scenario.DemoError as error:
        print(f"scaler demo: {error}", file=sys.stderr)
        return 2
    # The demo has no Prometheus (its URL is a closed loopback port, see live.settings):
    # the example policies' Prometheus sources fail by design, which the service reports
    # as a WARNING in a real deployment. Here it is noise in the first command a person
    # runs; the health series in /metrics still say the source is down.
    prometheus_log = logging.getLogger("scaler.signals.prometheus")
    level = prometheus_log.level
    prometheus_log.setLevel(logging.ERROR)
    server = nats_server.NatsServer(jetstream=False)
    try:
        server.start()
        replay = asyncio.run(live.Demo(options, models=models, warnings=warnings,
                                       nats_url=server.url, out=stream).run())
        server.close()
        results.finish(options, models=models, warnings=warnings, replay=replay,
                       nats_url=server.url, out=stream)
    except BrokenPipeError:
        raise  # `scaler demo | head`: the command line ends quietly (scaler.cli)
    except KeyboardInterrupt:
        # Ctrl-C outside the replay (start-up, the report): stop quietly, still cleaned up.
        print("scaler demo: interrupted", file=sys.stderr)
        return 0
    except Exception as error:  # nats-server or the service could not start, a write failed
        log.debug("demo failed", exc_info=True)
        print(f"scaler demo: failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        server.close()
        prometheus_log.setLevel(level)
    if replay.failed:
        print(f"scaler demo: the service failed: {replay.failed}", file=sys.stderr)
        return 1
    return 0
