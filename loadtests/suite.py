"""The scenario suite: every scenario and shared real trace under every strategy.

Writes each scenario's trace (CSV), runs (trace, strategy) jobs in parallel across
processes (the sweep is embarrassingly parallel: one job per strategy, the oracle and
static-peak together since they share the oracle's plan), and writes `summary.json` and
`index.html` (per scenario a table and GPU-hours against feasible windows met, the
Pareto view, with the oracle and static-peak as reference points).

    .venv/bin/python -m loadtests.suite --out /tmp/suite            # everything
    .venv/bin/python -m loadtests.suite --out /tmp/suite --quick    # seconds: a smoke test
    .venv/bin/python -m loadtests.suite --out /tmp/suite --headroom replicas=1 \
        --headroom fraction=0.25   # also the scaler with spare capacity: its price

A `--headroom` variant is the scaler strategy on the policy with `spec.headroom` set, named
`scaler+1` (one spare replica) or `scaler+25%` (a quarter more capacity), beside the
others in the tables and on each trace's GPU-hours/windows picture.

Shared traces are read from `../shared/traces` beside the repository (or
`$SCALER_TRACES`); what is absent is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import scenarios
from scaler.policy import loader, model
from scaler.sim import profiles, report, run, strategies, traces

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SCALER_TRACES", REPO.parent / "shared" / "traces"))
DEFAULT_POLICY = REPO / "config" / "llama-8b.yaml"
# Strategies that share the oracle's plan run in one job (the plan is computed once).
PLAN_GROUP = ("oracle", "static-peak", "oracle-rate")
QUICK_STRATEGIES = ("scaler", "oracle")
# The suite's scenario lengths: 30 minutes per shape (several cold starts and a 300 s
# scale-down window each), the daily cycle compressed to 2 h, so that the whole suite,
# oracle searches included, runs in about 20 minutes on 2 cores (the ramps of the
# compressed day are 12x steeper than a real day's: harder for a reactive scaler).
FULL: dict[str, dict[str, float]] = {
    "step": {"at": 300.0, "hold": 900.0, "after": 600.0},
    "square": {"period": 600.0, "cycles": 3.0},
    "flash": {"at": 300.0, "decay": 400.0, "duration": 1800.0},
    "ramp": {"duration": 1800.0, "hold": 300.0},
    "daily": {"day": 7200.0, "duration": 7200.0},
    "long-context": {"duration": 1800.0},
    "bimodal": {"duration": 1800.0},
    "long-output": {"duration": 1800.0},
}


@dataclass(frozen=True)
class Item:
    """One trace of the suite: a generated scenario or a shared real trace."""

    name: str
    description: str
    path: Path
    source: str  # "scenario" or "shared"
    rate_scale: float = 1.0
    start_s: float | None = None
    duration_s: float | None = None
    rises: tuple[float, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> traces.Trace:
        return traces.load_trace(self.path, rate_scale=self.rate_scale, seed=1,
                                 start_s=self.start_s, max_duration_s=self.duration_s)


def scenario_items(out: Path, *, quick: bool) -> list[Item]:
    """Write each scenario's trace under `out/traces` and describe it."""
    folder = out / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    chosen = scenarios.QUICK if quick else FULL
    items = []
    for name, params in chosen.items():
        shape = scenarios.scenario(name, **params)
        path = folder / f"{name}.csv"
        shape.write(path, seed=3)
        items.append(Item(name, shape.description, path, "scenario", rises=shape.rises))
    return items


def shared_items(root: Path, *, say: Callable[[str], None]) -> list[Item]:
    """The shared real traces that are present, each as the docs replay it."""
    wanted = [
        Item("azure-code-x16", "Azure LLM 2023 code, first 30 min at 16x the recorded rate",
             root / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv", "shared",
             rate_scale=16.0, duration_s=1800.0),
        Item("azure-conv-x16", "Azure LLM 2023 conv, first 30 min at 16x the recorded rate",
             root / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv", "shared",
             rate_scale=16.0, duration_s=1800.0),
        Item("servegen-10h", "ServeGen m-large, 10:00-10:30 of day 0 at 10 % of the rate",
             root / "servegen_m_large", "shared", rate_scale=0.1, start_s=36000.0,
             duration_s=1800.0),
    ]
    items = []
    for item in wanted:
        if item.path.exists():
            items.append(item)
        else:
            say(f"suite: skipping {item.name}: {item.path} not found")
    functions = root / "azure_functions_2019_sample"
    if functions.exists():
        say(f"suite: skipping {functions.name}: per-minute function invocations, not an LLM "
            "request trace (no token lengths)")
    return items


def jobs_for(names: Sequence[str]) -> list[tuple[str, ...]]:
    """Strategy groups, one job each: the plan sharers together, every other alone."""
    planned = tuple(n for n in names if n in PLAN_GROUP)
    return [*((n,) for n in names if n not in PLAN_GROUP), *([planned] if planned else [])]


def headroom_variant(text: str) -> tuple[str, dict[str, float]]:
    """`replicas=N` or `fraction=F` -> (strategy label, `spec.headroom`): ("scaler+1",
    {"replicas": 1}), ("scaler+25%", {"fraction": 0.25})."""
    key, _, number = text.partition("=")
    try:
        amount = float(number)
    except ValueError:
        amount = math.nan
    if key == "replicas" and amount >= 1 and amount.is_integer():
        return f"scaler+{int(amount)}", {"replicas": int(amount)}
    if key == "fraction" and 0 < amount <= 10:
        return f"scaler+{amount:.0%}", {"fraction": amount}
    raise argparse.ArgumentTypeError(
        f"--headroom {text!r}: want replicas=N (N >= 1) or fraction=F (0 < F <= 10)")


def with_headroom(policy: model.ScalePolicy, headroom: dict[str, float]) -> model.ScalePolicy:
    """The policy with `spec.headroom` replaced, validated as a policy file would be."""
    document = policy.model_dump(by_alias=True, exclude_none=True)
    document["spec"]["headroom"] = headroom
    return model.ScalePolicy.model_validate(document)


def run_job(item: Item, names: tuple[str, ...], policy_path: Path,
            variants: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """One process's work: load the trace and policy, simulate the strategies (a headroom
    variant's label runs the scaler on the policy with that headroom)."""
    started = time.perf_counter()
    policy = loader.load_paths([policy_path]).policies[0]
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    trace = item.load()
    variant = (variants or {}).get(names[0]) if len(names) == 1 else None
    if variant is not None:
        result = run.simulate(trace, policy=with_headroom(policy, variant), profile=profile,
                              names=("scaler",))
        result.results[names[0]] = result.results.pop("scaler")
    else:
        result = run.simulate(trace, policy=policy, profile=profile, names=names)
    return {"item": item.name, "names": list(names),
            "summaries": {n: r.summary for n, r in result.results.items()},
            "missed": {n: missed_windows(r.series, result.slo_threshold_s)
                       for n, r in result.results.items()},
            "trace": result.to_json()["trace"], "seconds": time.perf_counter() - started}


def missed_windows(series: dict[str, list[float]], threshold_s: float) -> list[int]:
    """Windows whose p95 is over the SLO (from the report's series: a lower bound for
    windows with unanswered requests, which count as missed in any case)."""
    window = run.SLO_WINDOW_S
    over = {int(t // window) for t, v in zip(series.get("p95_window_t", []),
                                             series.get("p95", []), strict=True)
            if v > threshold_s + 1e-9}
    return sorted(over | {int(t // window) for t in series.get("p95_unserved_t", [])})


def rise_windows(item: Item, trace: traces.Trace, profile: profiles.ReplicaProfile
                 ) -> set[int]:
    """Windows that start within one pod start after a rise of the load: a scaler that
    only reacts has not got the new replicas ready there, whatever it does, unless it
    held headroom (or predicted the rise).

    For scenarios the rises are the shape's own (step, square, flash); for real traces a
    rise is a window whose load in replicas is 1.25x above the highest of the pod start
    before it (noise on a flat load stays below that).
    """
    window = run.SLO_WINDOW_S
    pod_start = profile.cold_start.pod_start_seconds
    if item.source == "scenario":
        return {int(t // window) + k for t in item.rises
                for k in range(int(math.ceil(pod_start / window)) + 1)
                if (int(t // window) + k) * window < t + pod_start}
    load = report.load_replicas(trace, profile)
    span = int(math.ceil(pod_start / window))
    rises = [w for w in range(span, load.size)
             if load[w] > 1.25 * max(float(load[w - span:w].max()), 1.0)]
    return {w + k for w in rises for k in range(span)} & set(range(load.size))


def pareto_png(name: str, summaries: dict[str, dict[str, float | int]]) -> str:
    """GPU-hours against feasible windows met, one point per strategy, as base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axis = plt.subplots(figsize=(4.6, 3.2))
    for strategy, summary in summaries.items():
        x, y = float(summary["gpu_hours"]), float(summary["p95_windows_met"])
        reference = strategy in PLAN_GROUP
        axis.scatter([x], [y], s=60 if reference else 40,
                     marker={"oracle": "*", "static-peak": "s", "oracle-rate": "D"}.get(
                         strategy, "o"),
                     color="#222222" if reference else "#2ca02c" if "+" in strategy
                     else "#1f77b4", zorder=3)
        # The two references often sit close together: the oracle's label goes below.
        axis.annotate(strategy, (x, y), xytext=(5, -11 if strategy == "oracle" else 4),
                      textcoords="offset points", fontsize=8)
    axis.set_xlabel("GPU-hours (fewer is better)")
    axis.set_ylabel("feasible windows met")
    axis.set_ylim(min(0.5, *(float(s["p95_windows_met"]) for s in summaries.values())) - 0.05,
                  1.05)
    axis.set_xlim(0, max(float(s["gpu_hours"]) for s in summaries.values()) * 1.2 + 0.01)
    axis.grid(alpha=0.3)
    axis.set_title(f"{name}: the best is top left", fontsize=10, loc="left")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


TABLE_KEYS = (("gpu_hours", "GPU-h", "{:.2f}"), ("p95_windows_met", "feasible win met", "{:.3f}"),
              ("p95_windows_met_all", "all win met", "{:.3f}"),
              ("slo_attainment", "SLO att.", "{:.3f}"), ("scale_events", "events", "{:d}"),
              ("max_replicas", "max repl.", "{:d}"), ("rejected", "rejected", "{:d}"))


def _value(summary: dict[str, float | int], key: str, fmt: str) -> str:
    if key not in summary:
        return "-"
    value = summary[key]
    return fmt.format(int(value) if fmt.endswith("d}") else float(value))


def render_html(document: dict[str, Any]) -> str:
    parts = [f"<h1>Scenario suite: {html.escape(document['policy'])}</h1>",
             f"<p>{len(document['scenarios'])} traces x {len(document['strategies'])} "
             f"strategies in {document['wall_s']:.0f} s on {document['workers']} worker "
             "processes. Windows met count feasible 60 s windows (those whose floor, each "
             "request alone on an idle replica, is within the SLO) when the simulator "
             "reports them.</p>"]
    for name, entry in document["scenarios"].items():
        summaries = entry["strategies"]
        head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in TABLE_KEYS)
        rows = "".join(
            f"<tr><th>{html.escape(strategy)}</th>"
            + "".join(f"<td>{_value(summary, k, f)}</td>" for k, _, f in TABLE_KEYS) + "</tr>"
            for strategy, summary in summaries.items())
        feasible = next((s.get("feasible_windows") for s in summaries.values()), None)
        parts.append(
            f"<h2>{html.escape(name)}</h2><p>{html.escape(entry['description'])}: "
            f"{entry['requests']} requests over {entry['duration_s']:.0f} s; "
            f"{entry['windows']} windows"
            + (f", {feasible} feasible" if feasible is not None else "")
            + f", {len(entry['rise_windows'])} within one cold start of a rise"
            + "".join(f"; {strategy} missed {len(missed)}"
                      + (f" ({len(set(missed) & set(entry['rise_windows']))} of them there)"
                         if entry["rise_windows"] else "")
                      for strategy, missed in entry["missed"].items() if missed)
            + ".</p>"
            f'<div class="row"><table><tr><th>strategy</th>{head}</tr>{rows}</table>'
            f'<img alt="GPU-hours against windows met" '
            f'src="data:image/png;base64,{pareto_png(name, summaries)}"></div>')
    skipped = "".join(f"<li>{html.escape(s)}</li>" for s in document["skipped"])
    if skipped:
        parts.append(f"<h2>Skipped</h2><ul>{skipped}</ul>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #bbb;"
             "padding:3px 7px;text-align:right}th:first-child{text-align:left}"
             ".row{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}")
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>Scenario suite</title>'
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def markdown_table(document: dict[str, Any]) -> str:
    """One row per trace: GPU-hours / feasible windows met per strategy, and how many of
    each reactive strategy's missed windows start within one cold start of a rise."""
    names = document["strategies"]
    reactive = [n for n in names if n not in PLAN_GROUP]
    lines = ["| trace | rise windows | " + " | ".join(names)
             + " | misses at rises (" + ", ".join(reactive) + ") |",
             "| --- | ---: | " + " | ".join("---:" for _ in names) + " | ---: |"]
    for name, entry in document["scenarios"].items():
        cells = []
        for strategy in names:
            summary = entry["strategies"].get(strategy)
            cells.append("-" if summary is None else
                         f"{summary['gpu_hours']:.2f} / {summary['p95_windows_met']:.3f}")
        rises = set(entry["rise_windows"])
        at_rises = " / ".join(str(len(set(entry["missed"].get(n, [])) & rises))
                              for n in reactive)
        lines.append(f"| {name} | {len(rises)} of {entry['windows']} | "
                     + " | ".join(cells) + f" | {at_rises} |")
    return "\n".join(lines)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--policy", type=Path, default=DEFAULT_POLICY)
    parser.add_argument("--strategies", default=None,
                        help=f"comma-separated (default: {','.join(strategies.STRATEGIES)})")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: the number of cores)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny scenarios, {' and '.join(QUICK_STRATEGIES)}, no shared "
                        "traces: seconds, for tests")
    parser.add_argument("--only", default=None, help="comma-separated trace names to run")
    parser.add_argument("--headroom", action="append", default=[], type=headroom_variant,
                        metavar="replicas=N|fraction=F",
                        help="also run the scaler with this spec.headroom (repeatable)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    names = (tuple(n.strip() for n in args.strategies.split(",") if n.strip())
             if args.strategies else QUICK_STRATEGIES if args.quick else strategies.STRATEGIES)
    variants = dict(args.headroom)
    unknown = [n for n in names if n not in strategies.NAMES]
    if unknown or args.workers < 1:
        say(f"suite: unknown strategies {unknown} (choose from {', '.join(strategies.NAMES)})"
            if unknown else "suite: --workers must be at least 1")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []

    def skip(line: str) -> None:
        skipped.append(line.removeprefix("suite: "))
        say(line)

    items = scenario_items(args.out, quick=args.quick)
    if not args.quick:
        items += shared_items(SHARED, say=skip)
    if args.only:
        keep = {n.strip() for n in args.only.split(",")}
        missing = sorted(keep - {i.name for i in items})
        if missing:
            say(f"suite: --only names no trace {missing} (have {', '.join(i.name for i in items)})")
            return 2
        items = [i for i in items if i.name in keep]
    policy = loader.load_paths([args.policy]).policies[0]
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    names = (*names, *(label for label in variants if label not in names))
    document: dict[str, Any] = {"policy": policy.name, "strategies": list(names),
                                "workers": args.workers, "quick": args.quick,
                                "scenarios": {}, "skipped": skipped}
    for item in items:
        trace = item.load()
        document["scenarios"][item.name] = {
            "description": item.description, "source": item.source, "path": str(item.path),
            "requests": trace.requests, "duration_s": round(trace.duration_s, 1),
            "windows": int(trace.per_minute().size),
            "rise_windows": sorted(rise_windows(item, trace, profile)), "job_seconds": 0.0,
            "strategies": {}, "missed": {}}
    # Longest jobs first, so the last to start are short: the oracle's plan (a search
    # that replays the trace many times) costs about 3x one strategy's run.
    jobs = sorted(((item, group) for item in items for group in jobs_for(names)),
                  key=lambda job: -document["scenarios"][job[0].name]["duration_s"]
                  * (3.0 if set(job[1]) & set(PLAN_GROUP) else 1.0))
    say(f"suite: {len(jobs)} jobs ({len(items)} traces x {len(names)} strategies) on "
        f"{args.workers} worker processes")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_job, item, group, args.policy, variants)
                   for item, group in jobs]
        for done, future in enumerate(as_completed(futures), start=1):
            outcome = future.result()
            entry = document["scenarios"][outcome["item"]]
            entry["strategies"].update(outcome["summaries"])
            entry["missed"].update(outcome["missed"])
            entry["job_seconds"] = round(entry["job_seconds"] + outcome["seconds"], 1)
            say(f"suite: [{done}/{len(jobs)}] {outcome['item']} "
                f"{','.join(outcome['names'])}: {outcome['seconds']:.0f} s")
    for entry in document["scenarios"].values():
        entry["strategies"] = {n: entry["strategies"][n] for n in names
                               if n in entry["strategies"]}
        entry["missed"] = {n: entry["missed"][n] for n in names if n in entry["missed"]}
    document["wall_s"] = round(time.perf_counter() - started, 1)
    (args.out / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "index.html").write_text(render_html(document))
    print(markdown_table(document))
    say(f"suite: {args.out / 'summary.json'}, {args.out / 'index.html'} "
        f"({document['wall_s']:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
