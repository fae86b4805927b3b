"""The `scaler loadtest` subcommand: options, the progress line, Ctrl-C, and the reports."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import html
import io
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib import parse

from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.sim import live_replicas, loadtest, profiles, report, run, traces

# Exit codes: 0 a valid measurement; 3 the client's own schedule lag was over
# --max-lag-ms at p99, so the latencies are not the server's alone; 130 Ctrl-C (128 +
# SIGINT), the partial report written.
EXIT_LAGGED = 3
EXIT_INTERRUPTED = 130
STRATEGY = "live"
# The simulator's profile when a policy names none (scaler simulate's default too).
DEFAULT_PROFILE = "llama-3.1-8b-h100"


def register(subparsers: argparse._SubParsersAction[Any], *,
             deployment_source: live_replicas.DeploymentFactory | None = None) -> None:
    """Add `loadtest`. `deployment_source` reads a Deployment for --kubeconfig (the
    Kubernetes client lives in the actuators, which this layer may not import)."""
    parser = subparsers.add_parser(
        "loadtest",
        help="replay a request trace, open loop, against a live OpenAI-compatible endpoint",
        description="Send each request of a trace at its time (open loop, whatever the "
        "server does) to an OpenAI-compatible endpoint with streaming, and report TTFT, "
        "inter-token and end-to-end latency, errors by kind and the client's own schedule "
        "lag. Prompts are synthetic English of about 4 characters per token of the trace's "
        "input length; max_tokens is the output length, with vLLM's ignore_eos.")
    parser.add_argument("--url", required=True,
                        help="server base URL, e.g. http://localhost:8000 (/v1/... is added)")
    parser.add_argument("--model", required=True, help="model name sent in each request")
    parser.add_argument("--trace", required=True, type=Path,
                        help="trace file (or ServeGen folder)")
    parser.add_argument("--trace-format", choices=traces.FORMATS, default="auto",
                        help="trace format (default: sniffed from the file)")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="multiply the request rate as `scaler simulate` does (default 1)")
    parser.add_argument("--start", type=float, metavar="SECONDS",
                        help="start SECONDS into the trace (its own clock)")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="replay only SECONDS of the trace")
    parser.add_argument("--seed", type=int, default=0, help="seed for rate scaling (default 0)")
    parser.add_argument("--max-concurrency", type=int, metavar="N",
                        help="at most N requests in flight; a request due while N are in "
                        "flight is not sent and counts as a concurrency_limit error")
    parser.add_argument("--api", choices=loadtest.APIS, default="completions",
                        help="/v1/completions or /v1/chat/completions (default completions)")
    parser.add_argument("--timeout", type=float, default=loadtest.DEFAULT_TIMEOUT_S,
                        metavar="SECONDS", help="per-request time limit (default %(default)g)")
    parser.add_argument("--max-lag-ms", type=float, default=loadtest.DEFAULT_MAX_LAG_MS,
                        help="p99 schedule lag above which the run is not a valid "
                        "measurement (exit code 3; default %(default)g)")
    parser.add_argument("--policy", type=Path, metavar="FILE",
                        help="ScalePolicy YAML: the SLO (latency metric, p95Latency "
                        "sloSeconds), cost.gpuHourly, resources.gpusPerReplica and the "
                        "profile for idle cost, as `scaler simulate` reads them; its "
                        "namespace/name and target are the defaults of --scaler-model and "
                        "--target")
    parser.add_argument("--slo-metric", choices=("ttft", "e2e", "itl"),
                        help="without --policy: latency the SLO columns judge (default ttft)")
    parser.add_argument("--slo-s", type=float,
                        help="without --policy: SLO threshold for the p95 per 60 s window "
                        f"(default {run.DEFAULT_SLO_S:g})")
    replicas = parser.add_mutually_exclusive_group()
    replicas.add_argument("--kubeconfig", type=Path, metavar="PATH",
                          help="read the replica timeline from the --target Deployment "
                          "through this kubeconfig (a watch: each change when it happens)")
    replicas.add_argument("--scaler-url", metavar="URL",
                          help="read the replica timeline from scaler's decision API at URL "
                          "(e.g. http://localhost:8080), for --scaler-model")
    parser.add_argument("--target", metavar="NAMESPACE/DEPLOYMENT",
                        help="with --kubeconfig: the Deployment (default: the policy's "
                        "namespace and spec.target)")
    parser.add_argument("--context", help="with --kubeconfig: its context (default current)")
    parser.add_argument("--scaler-model", metavar="NAMESPACE/NAME",
                        help="with --scaler-url: the model's key (default: the policy's "
                        "metadata namespace/name)")
    parser.add_argument("--poll", type=float, default=live_replicas.DEFAULT_POLL_S,
                        metavar="SECONDS", help="with --scaler-url: seconds between reads "
                        "(default %(default)g)")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write the JSON report")
    parser.add_argument("--report", type=Path, metavar="OUT.html", help="write the HTML report")
    parser.set_defaults(handler=loadtest_command, deployment_source=deployment_source)


def _usage_error(args: argparse.Namespace) -> str | None:
    url = parse.urlsplit(args.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"--url {args.url!r} is not an http(s) URL with a host"
    if args.rate_scale <= 0 or (args.duration is not None and args.duration <= 0):
        return "--rate-scale and --duration must be positive"
    if args.start is not None and not args.start >= 0:
        return "--start must be zero or positive"
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return "--max-concurrency must be at least 1"
    if args.timeout <= 0 or (args.slo_s is not None and args.slo_s <= 0) or (
            args.max_lag_ms <= 0 or args.poll <= 0):
        return "--timeout, --slo-s, --max-lag-ms and --poll must be positive"
    if args.policy is not None and (args.slo_metric or args.slo_s):
        return "--slo-metric and --slo-s go without --policy (the policy states its SLO)"
    if args.target is not None and args.kubeconfig is None:
        return "--target goes with --kubeconfig"
    if args.scaler_model is not None and args.scaler_url is None:
        return "--scaler-model goes with --scaler-url"
    if args.kubeconfig is not None and args.target is None and args.policy is None:
        return "--kubeconfig needs --target NAMESPACE/DEPLOYMENT (or --policy)"
    if args.scaler_url is not None and args.scaler_model is None and args.policy is None:
        return "--scaler-url needs --scaler-model NAMESPACE/NAME (or --policy)"
    return None


class UsageError(Exception):
    """A flag or file the run cannot start with (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Basis:
    """What the live numbers are judged and priced by: the policy's, or the flags'."""

    policy: policy_model.ScalePolicy | None
    metric: str
    threshold_s: float
    gpu_hourly: float
    gpus_per_replica: int
    profile: profiles.ReplicaProfile

    def to_json(self) -> dict[str, Any]:
        return {"gpu_hourly": self.gpu_hourly, "gpus_per_replica": self.gpus_per_replica,
                "profile": self.profile.name}


def _policy(path: Path) -> policy_model.ScalePolicy:
    """The first valid policy of a file, as `scaler simulate` takes it."""
    result = loader.load_paths([path])
    if result.errors:
        raise UsageError("invalid policy:\n" + "\n".join(f"  {e}" for e in result.errors))
    if not result.policies:
        raise UsageError(f"{path} has no ScalePolicy document")
    return result.policies[0]


def basis(args: argparse.Namespace) -> Basis:
    """The SLO and prices: from --policy as `scaler simulate` reads them (run.slo_of,
    cost.gpuHourly, resources.gpusPerReplica, spec.profile), else the flags and the
    policy model's defaults."""
    policy = _policy(args.policy) if args.policy is not None else None
    if policy is not None:
        metric, threshold = run.slo_of(policy)
        hourly, gpus = policy.spec.cost.gpu_hourly, policy.spec.resources.gpus_per_replica
        name = policy.spec.profile or DEFAULT_PROFILE
    else:
        metric, threshold = args.slo_metric or "ttft", args.slo_s or run.DEFAULT_SLO_S
        hourly = policy_model.Cost().gpu_hourly
        gpus = policy_model.Resources().gpus_per_replica
        name = DEFAULT_PROFILE
    try:
        profile = profiles.load_profile(name)
    except profiles.ProfileError as exc:
        raise UsageError(str(exc)) from None
    return Basis(policy=policy, metric=metric, threshold_s=threshold, gpu_hourly=hourly,
                 gpus_per_replica=gpus, profile=profile)


def replica_source(args: argparse.Namespace, policy: policy_model.ScalePolicy | None
                   ) -> live_replicas.Source | None:
    """Where the replica timeline is read, if anywhere (--kubeconfig or --scaler-url)."""
    try:
        if args.kubeconfig is not None:
            if args.target is not None:
                namespace, name = live_replicas.parse_target(args.target)
            else:
                assert policy is not None  # checked by _usage_error
                if policy.spec.target.kind != "Deployment":
                    raise UsageError(f"the policy's target is a {policy.spec.target.kind}; "
                                     "--target reads a Deployment")
                namespace, name = policy.metadata.namespace, policy.spec.target.name
            if not args.kubeconfig.is_file():
                raise UsageError(f"--kubeconfig {args.kubeconfig}: no such file")
            factory: live_replicas.DeploymentFactory | None = args.deployment_source
            if factory is None:
                raise UsageError("--kubeconfig: no Kubernetes client wired in (run it as "
                                 "the `scaler` command)")
            return factory(kubeconfig=str(args.kubeconfig), context=args.context,
                           namespace=namespace, deployment=name)
        if args.scaler_url is not None:
            key = args.scaler_model
            if key is None:
                assert policy is not None  # checked by _usage_error
                key = f"{policy.metadata.namespace}/{policy.metadata.name}"
            live_replicas.parse_target(key, flag="--scaler-model")
            return live_replicas.ScalerSource(url=args.scaler_url, model=key,
                                              interval_s=args.poll)
    except live_replicas.LiveReplicasError as exc:
        raise UsageError(str(exc)) from None
    return None


def _progress_line(progress: loadtest.Progress) -> None:
    sys.stdout.write(f"\rsent {progress.scheduled}  in flight {progress.in_flight}  "
                     f"finished {progress.finished}  errors {progress.errors}   ")
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class Outcome:
    """The run, and the replica timeline read during it (None without a source)."""

    live: loadtest.LiveRun
    timeline: live_replicas.Timeline | None


async def _main(requests: Any, target: loadtest.Target,
                source: live_replicas.Source | None) -> Outcome:
    if source is None:
        return Outcome(live=await _replay(requests, target), timeline=None)
    async with live_replicas.recording(source) as timeline:
        return Outcome(live=await _replay(requests, target), timeline=timeline)


async def _replay(requests: Any, target: loadtest.Target) -> loadtest.LiveRun:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Ctrl-C sets `stop`: the schedule ends, requests in flight are cancelled and the
    # partial report is written (instead of a KeyboardInterrupt traceback).
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    on_tick = _progress_line if sys.stdout.isatty() else None
    try:
        return await loadtest.run(requests, target, stop=stop, on_tick=on_tick)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        if on_tick is not None:
            sys.stdout.write("\n")


def document(outcome: Outcome, *, args: argparse.Namespace, judged: Basis) -> dict[str, Any]:
    """The JSON (report.SCHEMA): `scaler simulate`'s keys with one strategy `live` (its
    schedule lag, validity and errors by kind included; the cost keys when a replica
    timeline was read), and the live run's own under `loadtest` (with the series)."""
    live, timeline = outcome.live, outcome.timeline
    records = live.records
    duration = max(records.arrival_s, default=0.0)
    strategy: dict[str, Any] = {
        **loadtest.summary(live, metric=judged.metric, threshold_s=judged.threshold_s),
        **loadtest.client_health(live, max_lag_ms=args.max_lag_ms)}
    plot: dict[str, Any] = loadtest.series(live, metric=judged.metric)
    replicas: dict[str, Any] | None = None
    if timeline is not None:
        # GPU time over the trace's duration, as the simulator bills it (cut at the
        # interruption of a partial run); events and the peak over the whole run.
        until = min(duration, live.wall_s)
        prompt, generated = loadtest.served_tokens(records)
        useful = live_replicas.useful_gpu_seconds(
            judged.profile, prompt_tokens=prompt, generated_tokens=generated,
            gpus_per_replica=judged.gpus_per_replica)
        strategy.update(live_replicas.summary(
            timeline, origin=live.origin, until_s=until, end_s=live.wall_s,
            gpus_per_replica=judged.gpus_per_replica, gpu_hourly=judged.gpu_hourly,
            useful_gpu_s=useful, completed=int(strategy["completed"])))
        plot.update(live_replicas.series(timeline, origin=live.origin, end_s=live.wall_s))
        replicas = {"source": timeline.source, "reads": timeline.reads,
                    "changes": len(timeline.samples), "read_errors": timeline.errors,
                    "last_error": timeline.last_error, **judged.to_json(),
                    "useful_gpu_note": "useful GPU time (for idle cost) is estimated from "
                    "the tokens served at the profile's rates, as the simulator counts it"}
    return {
        "trace": {"path": str(args.trace), "requests": len(records),
                  "duration_s": round(duration, 3), "rate_scale": args.rate_scale},
        "policy": judged.policy.name if judged.policy is not None else None,
        "slo": {"metric": judged.metric, "threshold_s": judged.threshold_s},
        "strategies": {STRATEGY: strategy},
        "loadtest": {**loadtest.details(live), "replicas": replicas, "series": plot},
    }


def _figure_png(doc: dict[str, Any]) -> str:
    """Arrivals per 10 s, the replica timeline when one was read, and the p95 per 60 s
    window against the SLO, as a base64 PNG (the simulator's colours)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    s = doc["loadtest"]["series"]
    slo = doc["slo"]["threshold_s"]
    has_replicas = bool(s.get("replicas_t"))
    rows = 3 if has_replicas else 2
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.5 * rows), sharex=True, squeeze=False)
    top, bottom = axes[0][0], axes[-1][0]
    # Each value spans its bin (10 s, 60 s): the last is repeated at its bin's end.
    bins = [t / 60.0 for t in s["t"]]
    top.step(bins + [t + 10.0 / 60.0 for t in bins[-1:]], s["arrival_rate"] +
             s["arrival_rate"][-1:], where="post", color=report.DESIRED, lw=0.8)
    top.set_ylim(bottom=0)
    top.set_title("Requests sent (per second, per 10 s)", fontsize=10, loc="left")
    if has_replicas:
        middle = axes[1][0]
        minutes = [t / 60.0 for t in s["replicas_t"]]
        # As the simulator draws them: ready, and starting stacked on it (allocated in
        # all), under the desired count.
        starting = [a - r for a, r in zip(s["allocated"], s["ready"], strict=True)]
        middle.stackplot(minutes, s["ready"], starting, colors=[report.READY, report.STARTING],
                         alpha=0.75, step="post", lw=0,
                         labels=["ready", "starting (stacked on ready)"])
        middle.step(minutes, s["desired"], where="post", color=report.DESIRED, lw=1.4,
                    label="desired (spec.replicas)")
        middle.set_ylim(0, max(2.0, max(s["desired"] + s["allocated"]) * 1.15))
        middle.legend(fontsize=8, loc="upper left", frameon=False)
        live = doc["strategies"][STRATEGY]
        middle.set_title(f"Replicas ({doc['loadtest']['replicas']['source']}): "
                         f"{live['gpu_hours']:.2f} GPU-h, {live['scale_events']} scale "
                         "events", fontsize=10, loc="left")
    minutes = [t / 60.0 for t in s["p95_window_t"]]
    bottom.step(minutes + [m + 1.0 for m in minutes[-1:]], s["p95"] + s["p95"][-1:],
                where="post", color=report.READY, lw=1.0)
    bottom.set_ylim(0, max(s["p95"] + [slo]) * 1.15)
    missed = [(m + 0.5, v) for m, v in zip(minutes, s["p95"], strict=True) if v > slo + 1e-9]
    if missed:
        bottom.scatter(*zip(*missed, strict=True), s=10, color=report.MISS, zorder=3)
    for t in s["p95_unserved_t"]:
        bottom.axvspan(t / 60.0, t / 60.0 + 1.0, color=report.MISS, alpha=0.25, lw=0)
    bottom.axhline(slo, color=report.MISS, ls="--", lw=1.0)
    bottom.set_title(f"p95 {doc['slo']['metric']} per 60 s window (s), SLO {slo:g} s",
                     fontsize=10, loc="left")
    bottom.set_xlabel("minutes")
    for (axis,) in axes:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def render_html(doc: dict[str, Any]) -> str:
    """The report page: the simulator's table columns for `live`, then what only a live
    run has, then the plot."""
    live = doc["strategies"][STRATEGY]
    columns = report.present_columns([live])
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in columns)
    cells = "".join(f"<td>{fmt.format(int(live[key]) if fmt.endswith('d}') else live[key])}"
                    "</td>" for key, _, fmt in columns)
    extra = doc["loadtest"]
    lag = live["schedule_lag_ms"]
    validity = ("valid measurement" if live["valid"] else
                f"NOT a valid measurement: the client's p99 schedule lag {lag['p99']:g} ms "
                f"exceeded {lag['threshold_p99']:g} ms")
    detail = html.escape(json.dumps(
        {"schedule_lag_ms": lag, "errors": live["errors"],
         **{k: v for k, v in extra.items() if k != "series"}}, indent=2))
    trace = doc["trace"]
    policy = (f"Policy <code>{html.escape(doc['policy'])}</code>; " if doc["policy"]
              else "")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Load test of {html.escape(extra["url"])}</title>
<style>{report.STYLE}</style></head><body>
<h1>Load test of {html.escape(extra["url"])} ({html.escape(extra["model"])})</h1>
<p>Trace <code>{html.escape(trace["path"])}</code>: {trace["requests"]} requests over
{trace["duration_s"]:.0f} s at rate scale {trace["rate_scale"]:g}, sent open loop.
{policy}SLO: p95 {html.escape(doc["slo"]["metric"])} within {doc["slo"]["threshold_s"]:g} s
per 60 s window. <b>{html.escape(validity)}</b>{"; interrupted (partial)" if extra["interrupted"]
else ""}.</p>
<table><tr><th>strategy</th>{head}</tr><tr><th>{STRATEGY}</th>{cells}</tr></table>
<img alt="requests sent, replicas and p95 per window"
 src="data:image/png;base64,{_figure_png(doc)}">
<h2>Latencies, schedule lag, errors and replicas</h2><pre>{detail}</pre>
</body></html>
"""


def loadtest_command(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem:
        print(f"scaler loadtest: {problem}", file=sys.stderr)
        return 2
    target = loadtest.Target(url=args.url, model=args.model, api=args.api,
                             max_concurrency=args.max_concurrency, timeout_s=args.timeout)
    try:
        judged = basis(args)
        source = replica_source(args, judged.policy)
        requests = loadtest.stream_trace(args.trace, args.trace_format,
                                         rate_scale=args.rate_scale, seed=args.seed,
                                         start_s=args.start, duration_s=args.duration)
        outcome = asyncio.run(_main(requests, target, source))
    except (UsageError, traces.TraceError, live_replicas.LiveReplicasError) as exc:
        print(f"scaler loadtest: {exc}", file=sys.stderr)
        return 2
    live = outcome.live
    doc = document(outcome, args=args, judged=judged)
    summary, extra = doc["strategies"][STRATEGY], doc["loadtest"]
    lag = summary["schedule_lag_ms"]
    errors = ", ".join(f"{k} {v}" for k, v in summary["errors"].items() if v) or "none"
    print(f"{summary['requests']} requests to {args.url} in {extra['wall_s']:.1f} s: "
          f"{summary['completed']} completed; errors: {errors}")
    for name in ("ttft_s", "itl_s", "e2e_s"):
        q = extra[name]
        print(f"  {name[:-2]:>4}: p50 {q['p50']:.3f} s  p95 {q['p95']:.3f} s  "
              f"p99 {q['p99']:.3f} s")
    print(f"  SLO p95 {judged.metric} <= {judged.threshold_s:g} s: windows met "
          f"{summary['p95_windows_met']:.3f}, attainment {summary['slo_attainment']:.3f}")
    if "gpu_hours" in summary:
        print(f"  replicas ({extra['replicas']['source']}): max {summary['max_replicas']}, "
              f"{summary['scale_events']} scale events, {summary['gpu_hours']:.3f} GPU-h, "
              f"cost {summary['cost']:.2f} (idle {summary['idle_cost']:.2f}), "
              f"{summary['cost_per_1k_requests']:.3f} per 1k requests")
    print(f"  schedule lag: p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms, "
          f"max {lag['max']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.report:
        args.report.write_text(render_html(doc))
    if live.interrupted:
        print("scaler loadtest: interrupted; the report is partial", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not summary["valid"]:
        print(f"scaler loadtest: NOT a valid measurement: the client's p99 schedule lag "
              f"{lag['p99']:.1f} ms exceeded --max-lag-ms {args.max_lag_ms:g} (requests "
              "left late, so latencies are not the server's alone); use a faster "
              "machine, a lower --rate-scale, or split the load", file=sys.stderr)
        return EXIT_LAGGED
    return 0
