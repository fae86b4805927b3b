"""Simulation outputs: the comparison table, the JSON contract and the HTML report."""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from scaler.sim import run

# (JSON key, column title, format) for the table on stdout and in the HTML report.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("slo_attainment", "SLO att.", "{:.3f}"),
    ("p95_windows_met", "p95 win met", "{:.3f}"),
    ("p50_latency_s", "p50 s", "{:.2f}"),
    ("p95_latency_s", "p95 s", "{:.2f}"),
    ("p99_latency_s", "p99 s", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("cost", "cost", "{:.2f}"),
    ("idle_cost", "idle cost", "{:.2f}"),
    ("cost_per_1k_requests", "cost/1k req", "{:.3f}"),
    ("scale_events", "scale events", "{:d}"),
    ("max_replicas", "max repl.", "{:d}"),
)

# JSON Schema of the contract in DESIGN 4.4 (tests validate outputs against it).
STRATEGY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["requests", "completed", "slo_attainment", "p95_windows_met",
                 "p50_latency_s", "p95_latency_s", "p99_latency_s", "gpu_hours", "cost",
                 "idle_cost", "cost_per_1k_requests", "scale_events", "max_replicas"],
    "additionalProperties": False,
    "properties": {
        "requests": {"type": "integer", "minimum": 0},
        "completed": {"type": "integer", "minimum": 0},
        "slo_attainment": {"type": "number", "minimum": 0, "maximum": 1},
        "p95_windows_met": {"type": "number", "minimum": 0, "maximum": 1},
        "p50_latency_s": {"type": "number", "minimum": 0},
        "p95_latency_s": {"type": "number", "minimum": 0},
        "p99_latency_s": {"type": "number", "minimum": 0},
        "gpu_hours": {"type": "number", "minimum": 0},
        "cost": {"type": "number", "minimum": 0},
        "idle_cost": {"type": "number", "minimum": 0},
        "cost_per_1k_requests": {"type": "number", "minimum": 0},
        "scale_events": {"type": "integer", "minimum": 0},
        "max_replicas": {"type": "integer", "minimum": 0},
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
        "policy": {"type": "string"},
        "slo": {
            "type": "object",
            "required": ["metric", "threshold_s"],
            "additionalProperties": False,
            "properties": {
                "metric": {"enum": ["ttft", "e2e", "itl"]},
                "threshold_s": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "strategies": {
            "type": "object",
            "propertyNames": {"enum": ["scaler", "hpa", "keda", "kpa", "oracle"]},
            "additionalProperties": STRATEGY_SCHEMA,
        },
    },
}


def table(result: run.SimulationResult) -> str:
    """A fixed-width comparison table, one row per strategy."""
    headers = ["strategy", *(title for _, title, _ in COLUMNS)]
    rows = []
    for name, outcome in result.results.items():
        rows.append([name, *(fmt.format(outcome.summary[key]) for key, _, fmt in COLUMNS)])
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                       enumerate(zip(headers, widths, strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


def write_json(result: run.SimulationResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def _figure_png(result: run.SimulationResult) -> str:
    """One figure, four panels shared in time, as a base64 PNG (Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    first = next(iter(result.results.values())).series
    if first:
        minutes = [t / 60.0 for t in first["t"]]
        axes[0].plot(minutes, first["arrival_rate"], color="black", lw=0.8, label="arrivals/s")
        axes[0].set_ylabel("requests/s")
        axes[0].set_title("Demand")
    for name, outcome in result.results.items():
        s = outcome.series
        if not s:
            continue
        minutes = [t / 60.0 for t in s["t"]]
        line = axes[1].plot(minutes, s["ready"], lw=1.0, label=f"{name} ready")[0]
        axes[1].plot(minutes, s["starting"], lw=0.8, ls=":", color=line.get_color(),
                     label=f"{name} starting")
        axes[2].plot(minutes, s["nodes"], lw=1.0, label=name)
        p95_minutes = [t / 60.0 for t in s["p95_window_t"]]
        values = [v if v >= 0 else float("nan") for v in s["p95"]]
        axes[3].step(p95_minutes, values, where="post", lw=1.0, label=name)
    axes[1].set_title("Replicas ready (solid) and starting (dotted)")
    axes[1].set_ylabel("replicas")
    axes[2].set_title("Nodes in the pool")
    axes[2].set_ylabel("nodes")
    axes[3].axhline(result.slo_threshold_s, color="red", ls="--", lw=1.0, label="SLO")
    axes[3].set_yscale("log")
    axes[3].set_title(f"p95 {result.slo_metric} per 60 s window")
    axes[3].set_ylabel("seconds")
    axes[3].set_xlabel("minutes")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=5, loc="upper right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def render_html(result: run.SimulationResult) -> str:
    data = result.to_json()
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in COLUMNS)
    rows = []
    for name, outcome in result.results.items():
        cells = "".join(f"<td>{fmt.format(outcome.summary[key])}</td>"
                        for key, _, fmt in COLUMNS)
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    sources = "".join(f'<li>{html.escape(s.what)}: <a href="{html.escape(s.url)}">'
                      f"{html.escape(s.url)}</a></li>" for s in result.profile.sources)
    trace = data["trace"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>scaler simulate: {html.escape(result.policy.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right}}
th:first-child{{text-align:left}}</style>
</head><body>
<h1>Simulation of {html.escape(result.policy.name)}</h1>
<p>Trace <code>{html.escape(trace["path"])}</code>: {trace["requests"]} requests over
{trace["duration_s"]:.0f} s at rate scale {trace["rate_scale"]}.
SLO: p95 {html.escape(result.slo_metric)} within {result.slo_threshold_s} s.
Replica profile <code>{html.escape(result.profile.name)}</code>
({html.escape(result.profile.model)} on {html.escape(result.profile.gpu)}).</p>
<table><tr><th>strategy</th>{head}</tr>{"".join(rows)}</table>
<p>GPU-hours are allocated GPU-hours from pod creation to removal, cold starts included;
the oracle's are the lower bound.</p>
<img alt="demand, replicas, nodes and p95 over time"
 src="data:image/png;base64,{_figure_png(result)}">
<h2>Profile sources</h2><ul>{sources}</ul>
<h2>JSON</h2><pre>{html.escape(json.dumps(data, indent=2))}</pre>
</body></html>
"""


def write_html(result: run.SimulationResult, path: Path) -> None:
    path.write_text(render_html(result))


class ProgressBar:
    """A one-line progress bar on stderr, shown only on a terminal and after 2 s."""

    def __init__(self, names: Sequence[str], *, stream: TextIO | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.stream = stream or sys.stderr
        self.names = list(names)
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.enabled = self.stream.isatty()
        self.shown = False

    def __call__(self, name: str, fraction: float) -> None:
        if not self.enabled or self.clock() - self.started < 2.0:
            return
        position = self.names.index(name) if name in self.names else 0
        overall = (position + fraction) / max(1, len(self.names))
        width = 30
        filled = int(overall * width)
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {overall:4.0%} {name:<7}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 50 + "\r")
            self.stream.flush()
