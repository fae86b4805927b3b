"""The `scaler simulate` subcommand (DESIGN 4.4): replay a trace against scaling strategies."""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path
from typing import Any

from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import fleet, from_prometheus, profiles, report, run, strategies, traces


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add this area's subcommands. Each sets `handler=func(args) -> exit code`."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay a request trace against scaler, hpa, keda, kpa and an oracle",
        description="Replay a request trace on a simulated GPU cluster under each scaling "
        "strategy; print a comparison table and optionally write JSON and HTML reports.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="trace file (or ServeGen folder)")
    source.add_argument("--fleet", type=Path, metavar="FLEET.yaml",
                        help="replay several models on shared GPU pools and budgets (DESIGN "
                        "4.6; see docs/simulation.md, e.g. loadtests/fleet/fleet.yaml)")
    source.add_argument("--from-prometheus", metavar="URL",
                        help="rebuild the trace from a vLLM, SGLang or TGI deployment's "
                        "Prometheus history (needs --model, --start and --end; see "
                        "docs/simulation.md)")
    parser.add_argument("--model", metavar="NAME",
                        help="with --from-prometheus: the value of the series' model label")
    parser.add_argument("--preset", choices=tuple(from_prometheus.PRESETS),
                        default=from_prometheus.DEFAULT_PRESET,
                        help="with --from-prometheus: the server's metric names (default "
                        "%(default)s)")
    parser.add_argument("--model-label", default=from_prometheus.MODEL_LABEL, metavar="LABEL",
                        help="with --from-prometheus: the label --model matches (default "
                        "%(default)s; TGI has none: use one the scrape adds, e.g. job)")
    parser.add_argument("--end", metavar="TIME",
                        help="with --from-prometheus: end of the history, epoch seconds or "
                        "RFC 3339 (e.g. 2026-12-01T11:00:00Z)")
    parser.add_argument("--step", type=float, default=from_prometheus.DEFAULT_STEP_S,
                        metavar="SECONDS", help="with --from-prometheus: interval of the "
                        f"rebuilt counts (default {from_prometheus.DEFAULT_STEP_S:g})")
    parser.add_argument("--trace-format", choices=traces.FORMATS, default="auto",
                        help="trace format (default: sniffed from the file)")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="multiply the request rate: superposed time-shifted copies "
                        "above 1, thinning below 1 (default 1)")
    parser.add_argument("--policy", type=Path,
                        help="ScalePolicy YAML (spec.profile names the replica profile); "
                        "required but with --fleet, whose file names each model's")
    parser.add_argument("--strategies", default=",".join(strategies.STRATEGIES),
                        help=f"comma-separated, from {','.join(strategies.NAMES)} "
                        f"(default {','.join(strategies.STRATEGIES)})")
    parser.add_argument("--start", metavar="SECONDS",
                        help="with --from-prometheus: start of the history, epoch seconds or "
                        "RFC 3339. Otherwise: start the replay SECONDS into the trace (its "
                        "own clock: from the first request, or from window 0 for ServeGen); "
                        "times are re-based to the slice start (e.g. --start 36000 --duration 3600 "
                        "for 10:00 to 11:00 of a ServeGen day)")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="replay only SECONDS of the trace, from --start or its "
                        "beginning (e.g. 86400 for the first day of a 14-day ServeGen trace)")
    parser.add_argument("--lengths", default="auto", metavar="auto|dataset|FILE",
                        help="ServeGen token lengths: 'auto' (each client's "
                        "chunk-N-dataset.json where present, else ShareGPT stats beside "
                        "the folder), 'dataset' (require dataset.json), or a ShareGPT "
                        "stats CSV (default auto)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for rate scaling and ServeGen draws (default 0)")
    parser.add_argument("--no-deletion-cost", dest="deletion_cost", action="store_false",
                        help="scaler writes no pod-deletion-cost before its scale-downs, as "
                        "the service with kube.deletion_cost.enabled false: the ReplicaSet "
                        "then removes the most recently ready pods first, whatever they hold "
                        "(measures what the costs buy; also with --fleet)")
    parser.add_argument("--termination-grace-period", type=int, metavar="SECONDS",
                        help="the Deployment's terminationGracePeriodSeconds: how long a "
                        "removed replica drains before what it holds is cut (default "
                        f"{sim_cluster.TERMINATION_GRACE_S:g}, Kubernetes'; 0 to "
                        f"{sim_cluster.MAX_GRACE_S}; with --fleet it is set per model in the "
                        "fleet file)")
    parser.add_argument("--dispatch", choices=sim_cluster.DISPATCH_MODES,
                        help="how requests reach the replicas, for every strategy and the "
                        "oracle alike: push (default), a Service sending each arrival to "
                        "the least-loaded replica's own queue (online serving behind vLLM); "
                        "queue, one shared FIFO work queue a replica takes from only when it "
                        "can start the request at once (batch fed from a JetStream "
                        "work-queue stream), so a removed replica holds only what it started. "
                        "The oracle's window searches and replays use it; feasible windows "
                        "(each request alone on an idle replica) are the same under both. "
                        "The JSON says which (dispatch). With --fleet it is set per model in "
                        "the fleet file")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write the JSON report")
    parser.add_argument("--report", type=Path, metavar="OUT.html", help="write the HTML report")
    parser.set_defaults(handler=simulate_command)


def _load_policy(path: Path) -> policy_model.ScalePolicy:
    """The first valid policy of a file (the simulator replays one model at a time)."""
    result = loader.load_paths([path])
    if result.errors:
        raise SystemExit("scaler simulate: invalid policy:\n" + "\n".join(
            f"  {error}" for error in result.errors))
    if not result.policies:
        raise SystemExit(f"scaler simulate: {path} has no ScalePolicy document")
    return result.policies[0]


def _load_trace(args: argparse.Namespace, lengths: traces.LengthChoice) -> traces.Trace:
    """The trace file's slice, or the one rebuilt from Prometheus, rate-scaled."""
    if args.from_prometheus is None:
        return traces.load_trace(args.trace, args.trace_format, rate_scale=args.rate_scale,
                                 seed=args.seed, lengths=lengths, start_s=args.start,
                                 max_duration_s=args.duration)
    start = from_prometheus.parse_time(args.start, flag="--start")
    end = from_prometheus.parse_time(args.end, flag="--end")
    trace = from_prometheus.load(args.from_prometheus, args.model, start_s=start, end_s=end,
                                 step_s=args.step, seed=args.seed, preset=args.preset,
                                 model_label=args.model_label)
    trace = traces.cut(trace, start_s=None, duration_s=args.duration)
    return traces.scale_rate(trace, args.rate_scale, seed=args.seed)


def simulate_command(args: argparse.Namespace) -> int:
    if args.fleet is not None:
        return fleet_command(args)
    if args.policy is None:
        print("scaler simulate: --policy is required (but with --fleet)", file=sys.stderr)
        return 2
    names = [n.strip() for n in str(args.strategies).split(",") if n.strip()]
    unknown = [n for n in names if n not in strategies.REGISTRY]
    if unknown or not names:
        print(f"scaler simulate: unknown strategies {unknown}; choose from "
              f"{', '.join(strategies.NAMES)}", file=sys.stderr)
        return 2
    if args.rate_scale <= 0 or (args.duration is not None and args.duration <= 0):
        print("scaler simulate: --rate-scale and --duration must be positive", file=sys.stderr)
        return 2
    grace = args.termination_grace_period
    if grace is None:
        grace = sim_cluster.TERMINATION_GRACE_S
    elif not 0 <= grace <= sim_cluster.MAX_GRACE_S:
        print(f"scaler simulate: --termination-grace-period must be 0 to "
              f"{sim_cluster.MAX_GRACE_S} seconds, not {grace}", file=sys.stderr)
        return 2
    if args.from_prometheus is None:
        if args.model is not None or args.end is not None:
            print("scaler simulate: --model and --end go with --from-prometheus",
                  file=sys.stderr)
            return 2
        try:
            args.start = None if args.start is None else float(args.start)
        except ValueError:
            args.start = math.nan
        if args.start is not None and not args.start >= 0:
            print("scaler simulate: --start must be zero or positive seconds", file=sys.stderr)
            return 2
    elif args.model is None or args.start is None or args.end is None:
        print("scaler simulate: --from-prometheus needs --model, --start and --end",
              file=sys.stderr)
        return 2
    # Lines reach a pipe or a log as they are printed, not all at exit.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    lengths: traces.LengthChoice = (args.lengths if args.lengths in ("auto", "dataset")
                                    else Path(args.lengths))
    try:
        policy = _load_policy(args.policy)
        profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
        trace = _load_trace(args, lengths)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    except (traces.TraceError, profiles.ProfileError,
            from_prometheus.PrometheusHistoryError) as exc:
        print(f"scaler simulate: {exc}", file=sys.stderr)
        return 2
    if trace.length_source:
        print(f"scaler simulate: {trace.length_source}", file=sys.stderr)
    if trace.requests == 0:
        print(f"scaler simulate: no requests in the chosen slice of {trace.path}",
              file=sys.stderr)
        return 2
    warning = report.capacity_warning(trace, policy=policy, profile=profile)
    if warning:
        print(f"scaler simulate: warning: {warning}", file=sys.stderr)
    dispatch: sim_cluster.Dispatch = args.dispatch or "push"
    bar = report.ProgressBar(names).start()
    try:
        result = run.simulate(trace, policy=policy, profile=profile, names=names, progress=bar,
                              grace_s=float(grace), deletion_cost=args.deletion_cost,
                              dispatch=dispatch)
    finally:
        bar.close()
    print(f"trace {trace.path}: {trace.requests} requests over {trace.duration_s:.0f} s "
          f"(rate scale {trace.rate_scale:g}); policy {policy.name}; SLO p95 "
          f"{result.slo_metric} <= {result.slo_threshold_s:g} s; profile {profile.name}; "
          f"dispatch {result.dispatch}")
    print(report.table(result))
    if args.json:
        report.write_json(result, args.json)
    if args.report:
        report.write_html(result, args.report)
    return 0


def fleet_command(args: argparse.Namespace) -> int:
    """`scaler simulate --fleet FLEET.yaml`: every model on its shared pool, per strategy."""
    default = ",".join(strategies.STRATEGIES)
    chosen = (fleet.FLEET_STRATEGIES if args.strategies == default
              else tuple(n.strip() for n in str(args.strategies).split(",") if n.strip()))
    other = [n for n in chosen if n not in fleet.FLEET_STRATEGIES]
    if other or not chosen:
        print(f"scaler simulate: --fleet runs {', '.join(fleet.FLEET_STRATEGIES)} (the oracle "
              f"and static-peak plan one model alone), not {other}", file=sys.stderr)
        return 2
    ignored = [flag for flag, value in (
        ("--policy", args.policy), ("--start", args.start), ("--duration", args.duration),
        ("--termination-grace-period", args.termination_grace_period),
        ("--dispatch", args.dispatch)) if value is not None]
    if ignored or args.rate_scale != 1.0:
        print(f"scaler simulate: with --fleet, {', '.join(ignored) or '--rate-scale'} go in "
              "the fleet file (per model)", file=sys.stderr)
        return 2
    try:
        loaded = fleet.load_fleet(args.fleet, seed=args.seed)
    except fleet.FleetError as exc:
        print(f"scaler simulate: {exc}", file=sys.stderr)
        return 2
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    bar = report.ProgressBar(chosen).start()
    try:
        result = fleet.simulate_fleet(loaded, names=chosen, seed=args.seed, progress=bar,
                                      deletion_cost=args.deletion_cost)
    finally:
        bar.close()
    print(report.fleet_text(result))
    if args.json:
        report.write_fleet_json(result, args.json)
    if args.report:
        report.write_fleet_html(result, args.report)
    return 0
