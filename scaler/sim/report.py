"""Simulation outputs: the comparison table, the JSON contract, the HTML report, progress."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from scaler.core import vocabulary
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import fleet, profiles, run, traces
from scaler.sim.strategies import oracle

# (JSON key, column title, format) for the table on stdout and in the HTML report. Keys a
# result does not have (older JSON, or a strategy set without them) are left out.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("slo_attainment", "SLO att.", "{:.3f}"),
    ("slo_attainment_feasible", "SLO att. feas.", "{:.3f}"),
    ("p95_windows_met", "p95 win met", "{:.3f}"),
    ("p95_windows_met_all", "p95 win met all", "{:.3f}"),
    ("feasible_windows", "feasible win", "{:d}"),
    ("p50_latency_s", "p50 s", "{:.2f}"),
    ("p95_latency_s", "p95 s", "{:.2f}"),
    ("p99_latency_s", "p99 s", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("cost", "cost", "{:.2f}"),
    ("idle_cost", "idle cost", "{:.2f}"),
    ("cost_per_1k_requests", "cost/1k req", "{:.3f}"),
    ("scale_events", "scale events", "{:d}"),
    ("max_replicas", "max repl.", "{:d}"),
    ("rejected", "rejected", "{:d}"),
    ("unfinished", "unfinished", "{:d}"),
    ("interrupted_requests", "interrupted", "{:d}"),
)

_REQUIRED = ["requests", "completed", "slo_attainment", "p95_windows_met", "p50_latency_s",
             "p95_latency_s", "p99_latency_s", "gpu_hours", "cost", "idle_cost",
             "cost_per_1k_requests", "scale_events", "max_replicas"]
_FRACTION = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}
_AMOUNT = {"type": "number", "minimum": 0}
# JSON Schema of the contract in DESIGN 4.4 (tests validate outputs against it). The
# yardstick extension's keys are allowed, not yet required, while simulators without
# them exist.
STRATEGY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": _REQUIRED,
    "additionalProperties": False,
    "properties": {
        "requests": _COUNT,
        "completed": _COUNT,
        "slo_attainment": _FRACTION,
        "slo_attainment_feasible": _FRACTION,
        "p95_windows_met": _FRACTION,
        "p95_windows_met_all": _FRACTION,
        "feasible_windows": _COUNT,
        "rejected": _COUNT,
        "unfinished": _COUNT,
        # Of the unfinished: cut by a scale-down (the replica killed after its grace).
        "interrupted_requests": _COUNT,
        "gpu_hours_lower_bound": _AMOUNT,
        "p50_latency_s": _AMOUNT,
        "p95_latency_s": _AMOUNT,
        "p99_latency_s": _AMOUNT,
        "gpu_hours": _AMOUNT,
        "cost": _AMOUNT,
        "idle_cost": _AMOUNT,
        "cost_per_1k_requests": _AMOUNT,
        "scale_events": _COUNT,
        "max_replicas": _COUNT,
    },
}
# `scaler loadtest`'s one strategy, `live` (DESIGN 4.5): the keys above that a live run
# measures (the cost keys only with a replica timeline; no feasibility without a model of
# the server), plus the client's schedule lag, whether it was small enough for the run
# to count, and errors by kind.
_MS = {"type": "number", "minimum": 0}
LIVE_SCHEMA: dict[str, Any] = {
    **STRATEGY_SCHEMA,
    "required": ["requests", "completed", "rejected", "unfinished", "slo_attainment",
                 "p95_windows_met", "p50_latency_s", "p95_latency_s", "p99_latency_s",
                 "schedule_lag_ms", "valid", "errors"],
    "properties": {
        **STRATEGY_SCHEMA["properties"],
        "schedule_lag_ms": {
            "type": "object", "required": ["p50", "p99", "max", "threshold_p99"],
            "additionalProperties": False,
            "properties": {"p50": _MS, "p99": _MS, "max": _MS, "threshold_p99": _MS}},
        "valid": {"type": "boolean"},
        "errors": {"type": "object", "additionalProperties": _COUNT},
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "scaler simulate output",
    "type": "object",
    "required": ["trace", "policy", "slo", "strategies"],
    "additionalProperties": False,
    "properties": {
        "trace": {
            "type": "object",
            "required": ["path", "requests", "duration_s", "rate_scale"],
            "additionalProperties": False,
            "properties": {
                "path": {"type": "string"},
                "requests": {"type": "integer", "minimum": 0},
                "duration_s": {"type": "number", "minimum": 0},
                "rate_scale": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        # null: a load test run without --policy (its SLO and costs from flags).
        "policy": {"type": ["string", "null"]},
        "slo": {
            "type": "object",
            "required": ["metric", "threshold_s"],
            "additionalProperties": False,
            "properties": {
                "metric": {"enum": ["ttft", "e2e", "itl"]},
                "threshold_s": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        # How requests reached the replicas of every strategy's cluster (cluster.Dispatch);
        # absent from a load test's document (a live server routes as it does).
        "dispatch": {"enum": list(sim_cluster.DISPATCH_MODES)},
        "strategies": {
            "type": "object",
            "propertyNames": {"enum": ["scaler", "hpa", "keda", "kpa", "oracle",
                                       "oracle-rate", "static-peak", "live"]},
            "properties": {"live": LIVE_SCHEMA},
            "additionalProperties": STRATEGY_SCHEMA,
        },
        # What only a load test has: latency quantiles, the series it plots, the source
        # of its replica timeline (scaler.sim.loadtest_cli.document).
        "loadtest": {"type": "object"},
    },
}

# Fleet replay (DESIGN 4.6): per model the document above, per strategy a `fleet` object.
_COST_GROUP: dict[str, Any] = {
    "type": "object",
    "required": ["models", "requests", "completed", "gpu_hours", "cost", "idle_cost",
                 "cost_per_1k_requests"],
    "additionalProperties": False,
    "properties": {"models": _COUNT, "requests": _COUNT, "completed": _COUNT,
                   "gpu_hours": _AMOUNT, "cost": _AMOUNT, "idle_cost": _AMOUNT,
                   "cost_per_1k_requests": _AMOUNT},
}
_TIER_SLO: dict[str, Any] = {
    "type": "object",
    "required": ["models", "slo_attainment", "p95_windows_met", "feasible_windows",
                 "unfinished"],
    "additionalProperties": False,
    "properties": {"models": _COUNT, "slo_attainment": _FRACTION,
                   "p95_windows_met": _FRACTION, "feasible_windows": _COUNT,
                   "unfinished": _COUNT, "interrupted_requests": _COUNT},
}
FLEET_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [*_COST_GROUP["required"], "by_tenant", "by_cost_center", "peak_gpus",
                 "budget_violations", "violations_by", "by_tier"],
    "additionalProperties": False,
    "properties": {
        **_COST_GROUP["properties"],
        "by_tenant": {"type": "object", "additionalProperties": _COST_GROUP},
        "by_cost_center": {"type": "object", "additionalProperties": _COST_GROUP},
        "peak_gpus": {"type": "object", "additionalProperties": _COUNT},
        # Cycles (1 s) in which some budget's maxGpus or some pool's unreserved GPUs were
        # exceeded, and per limit ("budget NAME", "reservation POOL/NAME") its cycles.
        "budget_violations": _COUNT,
        "violations_by": {"type": "object", "additionalProperties": _COUNT},
        # Requests cut by scale-downs, every model's (as each model's summary counts them).
        "interrupted_requests": _COUNT,
        "by_tier": {"type": "object", "propertyNames": {"enum": ["online", "batch", "dev"]},
                    "additionalProperties": _TIER_SLO},
    },
}
FLEET_SCHEMA: dict[str, Any] = {
    "$schema": SCHEMA["$schema"],
    "title": "scaler simulate --fleet output",
    "type": "object",
    "required": ["fleet", "seed", "pools", "models", "strategies"],
    "additionalProperties": False,
    "properties": {
        "fleet": {"type": "string"},
        "seed": {"type": "integer"},
        "pools": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["gpus", "reserved_gpus", "gpus_per_node",
                                           "gpu_hourly"],
            "additionalProperties": False,
            "properties": {"gpus": _COUNT, "reserved_gpus": _COUNT, "gpus_per_node": _COUNT,
                           "gpu_hourly": _AMOUNT}}},
        "models": {"type": "object", "additionalProperties": {
            k: v for k, v in SCHEMA.items() if k not in ("$schema", "title")}},
        "strategies": {
            "type": "object",
            "propertyNames": {"enum": list(fleet.FLEET_STRATEGIES)},
            "additionalProperties": {
                "type": "object", "required": ["fleet"], "additionalProperties": False,
                "properties": {"fleet": FLEET_OBJECT_SCHEMA}},
        },
    },
}

def present_columns(summaries: Sequence[Mapping[str, float | int]]
                    ) -> list[tuple[str, str, str]]:
    """The COLUMNS that at least one summary has."""
    return [c for c in COLUMNS if any(c[0] in s for s in summaries)]


def _cell(summary: Mapping[str, float | int], key: str, fmt: str) -> str:
    value = summary.get(key)
    if value is None:
        return "-"
    return fmt.format(int(value) if fmt.endswith("d}") else float(value))


def _fixed_width(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the rest right."""
    widths = [max(len(c) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths),
                      *(line(row) for row in rows)])


def table(result: run.SimulationResult) -> str:
    """A fixed-width comparison table, one row per strategy."""
    columns = present_columns([r.summary for r in result.results.values()])
    headers = ["strategy", *(title for _, title, _ in columns)]
    rows = [[name, *(_cell(outcome.summary, key, fmt) for key, _, fmt in columns)]
            for name, outcome in result.results.items()]
    return _fixed_width(headers, rows)


def write_json(result: run.SimulationResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def load_replicas(trace: traces.Trace, profile: profiles.ReplicaProfile) -> oracle.IntArray:
    """Per 60 s window from t=0: the replicas its arrivals need at saturation (rate over one
    replica's saturation rate for the window's mean lengths, rounded up; 0 when empty).
    No strategy meets the SLO in a window with fewer, since below that the queue grows.

    Example: a minute of 3,000 requests (50 req/s) of 1,155 in / 211 out on the 8B
    profile (about 13.5 req/s each at saturation): 50 / 13.5 = 3.7, so 4 replicas.
    """
    return oracle.oracle_need(trace, profile, interval_s=run.SLO_WINDOW_S,
                              bucket_s=run.SLO_WINDOW_S, utilization=1.0)


def capacity_warning(trace: traces.Trace, *, policy: policy_model.ScalePolicy,
                     profile: profiles.ReplicaProfile) -> str | None:
    """A sentence for the user when `replicas.max` cannot carry the trace's peak, else None."""
    load = load_replicas(trace, profile)
    top = policy.spec.replicas.max
    if not load.size or int(load.max()) <= top:
        return None
    need, at = int(load.max()), float(np.argmax(load)) * run.SLO_WINDOW_S
    return (f"replicas.max {top} of policy {policy.name} cannot carry this trace: the "
            f"minute at {at / 60:.0f} min needs {need} replicas of {profile.name} at "
            f"saturation, so every strategy misses the SLO there; replicas.max {need} "
            "would carry it (more for headroom)")


# ----- the figure ------------------------------------------------------------------------

# One colour per role, the same in every panel (matplotlib's tab10, readable on white).
READY, STARTING, DESIRED, NODES, LOAD = "#1f77b4", "#ff7f0e", "#222222", "#555555", "#17becf"
UP, DOWN, MISS, INFEASIBLE = "#2ca02c", "#9467bd", "#d62728", "#dddddd"


def _count_axis(axis: Any, top: float) -> None:
    """Whole-number ticks from 0 with room above the highest count: a flat line at 1 gets
    ticks 0, 1, 2, never 0.96 to 1.04, and no tick reads 1.5 nodes."""
    from matplotlib import ticker

    axis.set_ylim(0, max(2.0, math.ceil(top * 1.15)))
    axis.yaxis.set_major_locator(ticker.MaxNLocator(nbins=5, integer=True, min_n_ticks=2))


def _seconds_axis(axis: Any, low: float, high: float) -> None:
    """Log scale with plain labels (0.1, 0.2, 0.5, 1, 2, 5, 10 s), not 2x10^0."""
    from matplotlib import ticker

    axis.set_yscale("log")
    axis.set_ylim(max(low / 1.5, 1e-3), high * 1.5)
    axis.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.yaxis.set_minor_formatter(ticker.NullFormatter())


def _figure_png(result: run.SimulationResult) -> str:
    """Small multiples as a base64 PNG (Agg: no display needed): demand on top, then one
    row per strategy, replicas on the left and p95 per window on the right, every row on
    the same axes so rows compare at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    shown = {name: r.series for name, r in result.results.items() if r.series}
    rows = max(1, len(shown))
    fig, axes = plt.subplots(rows + 1, 2, figsize=(12, 1.9 * rows + 2.6), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [0.8] + [1] * rows})
    slo = result.slo_threshold_s
    counts_top = max((max(s["desired"] + s["ready"] + [a + b for a, b in
                                                        zip(s["ready"], s["starting"],
                                                            strict=True)] + s["nodes"])
                      for s in shown.values()), default=1.0)
    p95_values = [v for s in shown.values() for v in s["p95"] if v > 0]
    p95_low = min(p95_values + [slo / 4])
    p95_high = max(p95_values + [slo * 2])
    demand, load = axes[0]
    first = next(iter(shown.values()), None)
    if first is not None:
        demand.plot([t / 60.0 for t in first["t"]], first["arrival_rate"], color=DESIRED,
                    lw=0.8)
        demand.set_ylim(0, max(first["arrival_rate"] + [1.0]) * 1.15)
    need = [float(n) for n in load_replicas(result.trace, result.profile)]
    need_minutes = [i * run.SLO_WINDOW_S / 60.0 for i in range(len(need))]
    load.step(need_minutes, need, where="post", color=LOAD, lw=1.2)
    counts_top = max([counts_top, *need])
    _count_axis(load, counts_top)
    demand.set_title("Demand: arrivals (requests/s, per 10 s)", fontsize=10, loc="left")
    load.set_title("Load in replicas: arrivals / one replica's saturation rate, per minute",
                   fontsize=10, loc="left")
    # Windows with traffic that no provisioning can meet (their requests alone on idle
    # replicas miss the SLO): shaded in every latency panel, they count against no one.
    traffic = {int(w) for w in np.unique(result.trace.arrival_s // run.SLO_WINDOW_S)}
    infeasible = sorted(traffic - run.feasible(result.trace, profile=result.profile,
                                               metric=result.slo_metric, threshold=slo))
    for row, (name, s) in enumerate(shown.items(), start=1):
        left, right = axes[row]
        for w in infeasible:
            right.axvspan(w * run.SLO_WINDOW_S / 60.0, (w + 1) * run.SLO_WINDOW_S / 60.0,
                          color=INFEASIBLE, lw=0)
        minutes = [t / 60.0 for t in s["t"]]
        left.stackplot(minutes, s["ready"], s["starting"], colors=[READY, STARTING],
                       alpha=0.75, step="post", lw=0)
        left.step(minutes, s["desired"], where="post", color=DESIRED, lw=1.4)
        left.step(need_minutes, need, where="post", color=LOAD, lw=1.0, zorder=3)
        left.step(minutes, s["nodes"], where="post", color=NODES, lw=1.3, ls=":", zorder=4)
        events = list(zip(s["event_t"], s["event_from"], s["event_desired"], strict=True))
        ups = [(t / 60.0, d) for t, before, d in events if d > before]
        downs = [(t / 60.0, d) for t, before, d in events if d < before]
        for points, marker, colour in ((ups, "^", UP), (downs, "v", DOWN)):
            if points:
                left.scatter([p[0] for p in points], [p[1] for p in points], marker=marker,
                             s=22, color=colour, zorder=3, clip_on=False)
        _count_axis(left, counts_top)
        left.set_ylabel("count")
        summary = result.results[name].summary
        left.set_title(f"{name}: {summary['gpu_hours']:.2f} GPU-h, {summary['scale_events']} "
                       "scale events", fontsize=10, loc="left")
        window_minutes = [t / 60.0 for t in s["p95_window_t"]]
        met = [v <= slo + 1e-9 for v in s["p95"]]
        # Each window's value spans its minute: repeat the last one at its end.
        ends = [window_minutes[-1] + run.SLO_WINDOW_S / 60.0] if window_minutes else []
        right.step(window_minutes + ends, s["p95"] + s["p95"][-1:], where="post",
                   color=READY, lw=1.0)
        right.scatter([m + 0.5 for m, ok in zip(window_minutes, met, strict=True) if not ok],
                      [v for v, ok in zip(s["p95"], met, strict=True) if not ok],
                      s=10, color=MISS, zorder=3)
        for t in s["p95_unserved_t"]:
            right.axvspan(t / 60.0, t / 60.0 + 1.0, color=MISS, alpha=0.25, lw=0)
        right.axhline(slo, color=MISS, ls="--", lw=1.0)
        right.annotate(f"SLO {slo:g} s", xy=(1.0, slo), xycoords=("axes fraction", "data"),
                       xytext=(3, 0), textcoords="offset points", va="center", fontsize=8,
                       color=MISS)
        _seconds_axis(right, p95_low, p95_high)
        right.set_ylabel("seconds")
        feasible = summary.get("feasible_windows")
        of = f" of {feasible} feasible windows" if feasible is not None else ""
        right.set_title(f"p95 {result.slo_metric} per 60 s window: "
                        f"{summary['p95_windows_met']:.3f}{of} met", fontsize=10, loc="left")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
        axis.margins(x=0)
    for axis in axes[-1]:
        axis.set_xlabel("minutes")
    handles = [Line2D([], [], color=DESIRED, lw=1.4, label="desired (spec.replicas)"),
               Patch(color=READY, alpha=0.75, label="ready"),
               Patch(color=STARTING, alpha=0.75, label="starting (stacked on ready)"),
               Line2D([], [], color=NODES, ls=":", lw=1.3, label="nodes"),
               Line2D([], [], color=LOAD, label="load in replicas (at saturation)"),
               Line2D([], [], color=UP, marker="^", ls="", label="scale up"),
               Line2D([], [], color=DOWN, marker="v", ls="", label="scale down"),
               Line2D([], [], color=MISS, marker="o", ls="", ms=4, label="window over the SLO"),
               Patch(color=MISS, alpha=0.25, label="p95 request never served"),
               Patch(color=INFEASIBLE, label="no provisioning meets it")]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 0.97, 1 - 0.5 / (1.9 * rows + 2.6)))
    return _png_base64(fig)


def _png_base64(fig: Any) -> str:
    """A matplotlib figure as a base64 PNG (90 dpi), closed after."""
    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #bbb;padding:3px 6px;
text-align:right}th:first-child{text-align:left;white-space:nowrap}img{max-width:100%}
p.note{color:#555}"""


def html_table(result: run.SimulationResult) -> str:
    columns = present_columns([r.summary for r in result.results.values()])
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in columns)
    rows = []
    for name, outcome in result.results.items():
        cells = "".join(f"<td>{_cell(outcome.summary, key, fmt)}</td>"
                        for key, _, fmt in columns)
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    return f"<table><tr><th>strategy</th>{head}</tr>{''.join(rows)}</table>"


def render_html(result: run.SimulationResult, *, title: str | None = None) -> str:
    """The report page; `title` is the caller's (default: "Simulation of POLICY")."""
    heading = title or f"Simulation of {result.policy.name}"
    trace = result.to_json()["trace"]
    sources = "".join(f'<li>{html.escape(s.what)}: <a href="{html.escape(s.url)}">'
                      f"{html.escape(s.url)}</a></li>" for s in result.profile.sources)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>{STYLE}</style>
</head><body>
<h1>{html.escape(heading)}</h1>
<p>Trace <code>{html.escape(trace["path"])}</code>: {trace["requests"]} requests over
{trace["duration_s"]:.0f} s at rate scale {trace["rate_scale"]:g}. Policy
<code>{html.escape(result.policy.name)}</code>; SLO: p95 {html.escape(result.slo_metric)}
within {result.slo_threshold_s:g} s per 60 s window. Replica profile
<code>{html.escape(result.profile.name)}</code> ({html.escape(result.profile.model)} on
{html.escape(result.profile.gpu)}); requests reach the replicas by {result.dispatch}
dispatch (every strategy and the oracle).</p>
{html_table(result)}
<p class="note">GPU-hours are allocated GPU-hours from pod creation to removal, cold starts
included; the oracle knows the future and is the reference for the fewest GPU-hours that
meet the SLO.</p>
<h2>What each strategy decided</h2>
<p class="note">Left: the replicas each strategy asked for (black step), ready (blue) and
starting (orange, stacked on ready), nodes (dotted), each scale event (triangles), and
the load in replicas (teal: what one minute's arrivals need at saturation, no headroom).
Right: the p95 of each 60 s window against the SLO (dashed red); red dots are windows
over it; grey windows are ones no provisioning can meet (each request alone on an idle
replica misses the SLO), which count against no strategy. All rows share their axes.</p>
<img alt="demand, then per strategy replicas and p95 over time"
 src="data:image/png;base64,{_figure_png(result)}">
<h2>Profile sources</h2><ul>{sources}</ul>
</body></html>
"""


def write_html(result: run.SimulationResult, path: Path, *, title: str | None = None) -> None:
    path.write_text(render_html(result, title=title))


# ----- fleet replay (DESIGN 4.6) -----------------------------------------------------------

# (key of the `fleet` object, column title, format) of the fleet table.
FLEET_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("cost", "cost", "{:.2f}"),
    ("idle_cost", "idle cost", "{:.2f}"),
    ("cost_per_1k_requests", "cost/1k req", "{:.3f}"),
    ("budget_violations", "budget viol.", "{:d}"),
    ("interrupted_requests", "interrupted", "{:d}"),
)
TIER_COLOURS = {"online": READY, "batch": STARTING, "dev": NODES}


def _fleet_rows(result: fleet.FleetResult) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the fleet table: per strategy the totals, peak GPUs per pool,
    violations, and per tier the feasible windows met and the SLO attainment."""
    tiers = [t.value for t in vocabulary.Tier
             if any(m.tier is t for m in result.fleet.members)]
    pools = sorted(result.fleet.pools)
    headers = ["strategy", *(title for _, title, _ in FLEET_COLUMNS),
               *(f"peak GPUs {p}" for p in pools),
               *(f"{t} win met" for t in tiers), *(f"{t} SLO att." for t in tiers)]
    rows = []
    for name, outcome in result.results.items():
        summary = outcome.fleet
        by_tier = summary["by_tier"]
        rows.append([name, *(_cell(summary, key, fmt) for key, _, fmt in FLEET_COLUMNS),
                     *(str(summary["peak_gpus"][p]) for p in pools),
                     *(f"{by_tier[t]['p95_windows_met']:.3f}" for t in tiers),
                     *(f"{by_tier[t]['slo_attainment']:.3f}" for t in tiers)])
    return headers, rows


def fleet_text(result: fleet.FleetResult) -> str:
    """Per model its comparison table, then the fleet's."""
    parts = []
    for member in result.fleet.members:
        parts.append(f"{member.key} ({member.tier}, pool {member.pool}, tenant "
                     f"{member.policy.tenant or fleet.UNLABELLED}): {member.trace.requests} "
                     f"requests over {member.trace.duration_s:.0f} s; SLO p95 "
                     f"{member.metric} <= {member.threshold_s:g} s")
        parts.append(table(result.model_result(member)))
        parts.append("")
    pools = ", ".join(f"{name} {pool.spec.total_gpus} GPUs ({pool.spec.reserved_gpus} "
                      "reserved)" for name, pool in sorted(result.fleet.pools.items()))
    parts.append(f"fleet {result.fleet.path}: pools {pools}")
    parts.append(_fixed_width(*_fleet_rows(result)))
    return "\n".join(parts)


def write_fleet_json(result: fleet.FleetResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def _fleet_figure_png(result: fleet.FleetResult) -> str:
    """Per strategy and pool, the GPUs held stacked by tier over time, against the pool's
    size and its unreserved part; every panel on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    pools = sorted(result.fleet.pools)
    rows = max(1, len(result.results))
    fig, axes = plt.subplots(rows, len(pools), figsize=(12, 2.2 * rows + 0.8), sharex=True,
                             squeeze=False)
    top = max(pool.spec.total_gpus for pool in result.fleet.pools.values())
    tiers = [t.value for t in vocabulary.Tier]
    for row, (name, outcome) in enumerate(result.results.items()):
        for col, pool_name in enumerate(pools):
            axis = axes[row][col]
            series = outcome.pool_series.get(pool_name, {})
            minutes = [t / 60.0 for t in series.get("t", [])]
            if minutes:
                axis.stackplot(minutes, *(series[t] for t in tiers),
                               colors=[TIER_COLOURS[t] for t in tiers], alpha=0.75,
                               step="post", lw=0)
            spec = result.fleet.pools[pool_name].spec
            axis.axhline(spec.total_gpus, color=DESIRED, lw=1.2)
            if spec.reserved_gpus:
                axis.axhline(spec.shareable_gpus, color=MISS, ls="--", lw=1.0)
            _count_axis(axis, top)
            summary = outcome.fleet
            axis.set_title(f"{name}, pool {pool_name}: {summary['gpu_hours']:.2f} GPU-h, "
                           f"peak {summary['peak_gpus'][pool_name]} GPUs, "
                           f"{summary['budget_violations']} cycles over a limit",
                           fontsize=10, loc="left")
            axis.set_ylabel("GPUs")
            axis.grid(alpha=0.3)
            axis.margins(x=0)
    for axis in axes[-1]:
        axis.set_xlabel("minutes")
    handles = [*(Patch(color=TIER_COLOURS[t], alpha=0.75, label=f"{t} tier") for t in tiers),
               Line2D([], [], color=DESIRED, lw=1.2, label="pool size"),
               Line2D([], [], color=MISS, ls="--", lw=1.0,
                      label="unreserved (above: held for training)")]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (2.2 * rows + 0.8)))
    return _png_base64(fig)


def render_fleet_html(result: fleet.FleetResult) -> str:
    """The fleet report page: the fleet table, the pools' GPUs by tier over time, and
    each model's table."""
    headers, rows = _fleet_rows(result)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr><th>" + html.escape(row[0]) + "</th>"
                   + "".join(f"<td>{html.escape(c)}</td>" for c in row[1:]) + "</tr>"
                   for row in rows)
    models = "".join(
        f"<h3>{html.escape(m.key)} ({html.escape(m.tier.value)}, tenant "
        f"{html.escape(m.policy.tenant or fleet.UNLABELLED)})</h3>"
        f"<p>Trace <code>{html.escape(m.trace.path)}</code>: {m.trace.requests} requests "
        f"over {m.trace.duration_s:.0f} s; SLO p95 {html.escape(m.metric)} within "
        f"{m.threshold_s:g} s.</p>{html_table(result.model_result(m))}"
        for m in result.fleet.members)
    title = f"Fleet replay of {result.fleet.path}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>{len(result.fleet.members)} models on {len(result.fleet.pools)} pool(s), seed
{result.seed}. Under <code>scaler</code> each model decides with the engine and the
fleet step (<code>scaler.engine.fleet.arbitrate</code>) caps it; each baseline scales each
model alone, limited only by the pool's size (a pod that does not fit stays pending).</p>
<table><tr>{head}</tr>{body}</table>
<p class="note">Budget violations: one-second cycles in which the serving replicas of a
budget's models held more than its maxGpus, or a pool's models more than its GPUs less
its reservations. Tier columns: feasible 60 s windows whose p95 met the SLO, and
requests within it, over the tier's models.</p>
<h2>The pools' GPUs by tier</h2>
<img alt="per strategy, GPUs held on each pool stacked by tier over time"
 src="data:image/png;base64,{_fleet_figure_png(result)}">
<h2>Each model</h2>{models}
</body></html>
"""


def write_fleet_html(result: fleet.FleetResult, path: Path) -> None:
    path.write_text(render_fleet_html(result))


# ----- progress --------------------------------------------------------------------------


class ProgressBar:
    """Progress on stderr after the first 2 s: a redrawn bar on a terminal, otherwise a
    plain line every `every_s` seconds (logs and CI show a run is alive, without bars).

    Phases that report nothing (the oracle's search replays the trace many times before
    its own run) would still be silent: `start()` runs a daemon thread that calls `beat()`
    each second, which repeats the last state with the elapsed time when it is due.
    """

    def __init__(self, names: Sequence[str], *, stream: TextIO | None = None,
                 clock: Callable[[], float] | None = None, every_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.names = list(names)
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.terminal = self.stream.isatty()
        self.every_s = every_s
        self.last_write = self.started
        self.shown = False
        self.state = (self.names[0] if self.names else "", 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, name: str, fraction: float) -> None:
        # Warm-up steps run before t=0 and report a negative fraction.
        self.state = (name, min(max(fraction, 0.0), 1.0))
        self._write(due_s=0.0 if self.terminal else self.every_s)

    def beat(self) -> None:
        """Repeat the last state if nothing was written for a while (1 s on a terminal,
        so the elapsed time moves; `every_s` otherwise)."""
        self._write(due_s=1.0 if self.terminal else self.every_s)

    def _write(self, *, due_s: float) -> None:
        with self._lock:
            now = self.clock()
            if now - self.started < 2.0 or now - self.last_write < due_s:
                return
            name, fraction = self.state
            position = self.names.index(name) if name in self.names else 0
            overall = (position + fraction) / max(1, len(self.names))
            elapsed = now - self.started
            if self.terminal:
                filled = int(overall * 30)
                self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {overall:4.0%} "
                                  f"{name:<11} {elapsed:4.0f} s")
                self.shown = True
            else:
                self.stream.write(f"simulate: {overall:4.0%} done ({name} {fraction:.0%}, "
                                  f"{position + 1} of {len(self.names)} strategies), "
                                  f"{elapsed:.0f} s elapsed\n")
            self.last_write = now
            self.stream.flush()

    def start(self) -> ProgressBar:
        def run() -> None:
            while not self._stop.wait(1.0):
                self.beat()

        self._thread = threading.Thread(target=run, name="simulate-progress", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            if self.shown:
                self.stream.write("\r" + " " * 70 + "\r")
                self.stream.flush()
