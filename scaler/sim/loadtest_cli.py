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
from pathlib import Path
from typing import Any
from urllib import parse

from scaler.sim import loadtest, report, run, traces

# Exit codes: 0 a valid measurement; 3 the client's own schedule lag was over
# --max-lag-ms at p99, so the latencies are not the server's alone; 130 Ctrl-C (128 +
# SIGINT), the partial report written.
EXIT_LAGGED = 3
EXIT_INTERRUPTED = 130
STRATEGY = "live"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
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
    parser.add_argument("--slo-metric", choices=("ttft", "e2e", "itl"), default="ttft",
                        help="latency the SLO columns judge (default ttft)")
    parser.add_argument("--slo-s", type=float, default=run.DEFAULT_SLO_S,
                        help="SLO threshold for the p95 per 60 s window (default %(default)g)")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write the JSON report")
    parser.add_argument("--report", type=Path, metavar="OUT.html", help="write the HTML report")
    parser.set_defaults(handler=loadtest_command)


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
    if args.timeout <= 0 or args.slo_s <= 0 or args.max_lag_ms <= 0:
        return "--timeout, --slo-s and --max-lag-ms must be positive"
    return None


def _progress_line(progress: loadtest.Progress) -> None:
    sys.stdout.write(f"\rsent {progress.scheduled}  in flight {progress.in_flight}  "
                     f"finished {progress.finished}  errors {progress.errors}   ")
    sys.stdout.flush()


async def _main(requests: Any, target: loadtest.Target) -> loadtest.LiveRun:
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


def document(live: loadtest.LiveRun, *, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON: `scaler simulate`'s keys (trace, policy, slo, strategies.live) where they
    apply, and the live run's own under `loadtest` (with the p95-per-window series)."""
    records = live.records
    arrival = list(records.arrival_s)
    return {
        "trace": {"path": str(args.trace), "requests": len(records),
                  "duration_s": round(max(arrival, default=0.0), 3),
                  "rate_scale": args.rate_scale},
        "policy": None,
        "slo": {"metric": args.slo_metric, "threshold_s": args.slo_s},
        "strategies": {STRATEGY: loadtest.summary(live, metric=args.slo_metric,
                                                  threshold_s=args.slo_s)},
        "loadtest": {**loadtest.details(live, max_lag_ms=args.max_lag_ms),
                     "series": loadtest.series(live, metric=args.slo_metric)},
    }


def _figure_png(doc: dict[str, Any]) -> str:
    """Arrivals per 10 s and the p95 per 60 s window against the SLO, as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    s = doc["loadtest"]["series"]
    slo = doc["slo"]["threshold_s"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    # Each value spans its bin (10 s, 60 s): the last is repeated at its bin's end.
    bins = [t / 60.0 for t in s["t"]]
    top.step(bins + [t + 10.0 / 60.0 for t in bins[-1:]], s["arrival_rate"] +
             s["arrival_rate"][-1:], where="post", color=report.DESIRED, lw=0.8)
    top.set_ylim(bottom=0)
    top.set_title("Requests sent (per second, per 10 s)", fontsize=10, loc="left")
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
    for axis in (top, bottom):
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
    validity = ("valid measurement" if extra["valid"] else
                "NOT a valid measurement: the client's p99 schedule lag "
                f"{extra['schedule_lag_ms']['p99']:g} ms exceeded "
                f"{extra['schedule_lag_ms']['threshold_p99']:g} ms")
    detail = html.escape(json.dumps({k: v for k, v in extra.items() if k != "series"},
                                    indent=2))
    trace = doc["trace"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Load test of {html.escape(extra["url"])}</title>
<style>{report.STYLE}</style></head><body>
<h1>Load test of {html.escape(extra["url"])} ({html.escape(extra["model"])})</h1>
<p>Trace <code>{html.escape(trace["path"])}</code>: {trace["requests"]} requests over
{trace["duration_s"]:.0f} s at rate scale {trace["rate_scale"]:g}, sent open loop.
SLO: p95 {html.escape(doc["slo"]["metric"])} within {doc["slo"]["threshold_s"]:g} s per
60 s window. <b>{html.escape(validity)}</b>{"; interrupted (partial)" if extra["interrupted"]
else ""}.</p>
<table><tr><th>strategy</th>{head}</tr><tr><th>{STRATEGY}</th>{cells}</tr></table>
<img alt="requests sent and p95 per window" src="data:image/png;base64,{_figure_png(doc)}">
<h2>Latencies, schedule lag and errors</h2><pre>{detail}</pre>
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
        requests = loadtest.stream_trace(args.trace, args.trace_format,
                                         rate_scale=args.rate_scale, seed=args.seed,
                                         start_s=args.start, duration_s=args.duration)
        live = asyncio.run(_main(requests, target))
    except traces.TraceError as exc:
        print(f"scaler loadtest: {exc}", file=sys.stderr)
        return 2
    doc = document(live, args=args)
    summary, extra = doc["strategies"][STRATEGY], doc["loadtest"]
    lag = extra["schedule_lag_ms"]
    errors = ", ".join(f"{k} {v}" for k, v in extra["errors"].items() if v) or "none"
    print(f"{summary['requests']} requests to {args.url} in {extra['wall_s']:.1f} s: "
          f"{summary['completed']} completed; errors: {errors}")
    for name in ("ttft_s", "itl_s", "e2e_s"):
        q = extra[name]
        print(f"  {name[:-2]:>4}: p50 {q['p50']:.3f} s  p95 {q['p95']:.3f} s  "
              f"p99 {q['p99']:.3f} s")
    print(f"  SLO p95 {args.slo_metric} <= {args.slo_s:g} s: windows met "
          f"{summary['p95_windows_met']:.3f}, attainment {summary['slo_attainment']:.3f}")
    print(f"  schedule lag: p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms, "
          f"max {lag['max']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.report:
        args.report.write_text(render_html(doc))
    if live.interrupted:
        print("scaler loadtest: interrupted; the report is partial", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not extra["valid"]:
        print(f"scaler loadtest: NOT a valid measurement: the client's p99 schedule lag "
              f"{lag['p99']:.1f} ms exceeded --max-lag-ms {args.max_lag_ms:g} (requests "
              "left late, so latencies are not the server's alone); use a faster "
              "machine, a lower --rate-scale, or split the load", file=sys.stderr)
        return EXIT_LAGGED
    return 0
