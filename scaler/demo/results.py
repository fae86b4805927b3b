"""After the replay: score each model against the oracle, print the table, write report and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from scaler.demo import cluster as demo_cluster
from scaler.demo import live, scenario, view
from scaler.sim import report, run, strategies


def simulation_result(model: demo_cluster.SimulatedModel) -> run.SimulationResult:
    """The simulator's result for the live run ('scaler') beside the oracle's lower bound.

    The oracle replays the same slice on its own simulated cluster, from the same
    initial replicas, knowing the future; it takes about a second.
    """
    policy, profile, trace = model.policy, model.profile, model.trace
    metric, threshold = run.slo_of(policy)
    need = strategies.oracle.oracle_need(trace, profile)
    oracle_strategy = run.make_strategy("oracle", policy=policy, profile=profile, trace=trace,
                                        pool=model.pool, need=need)
    oracle = run.run_strategy(oracle_strategy, trace=trace, profile=profile, pool=model.pool,
                              policy=policy, initial_replicas=model.initial_replicas,
                              warmup_s=model.warmup_s)
    results = {}
    for name, cluster in (("scaler", model.cluster), ("oracle", oracle)):
        results[name] = run.StrategyResult(
            name=name,
            summary=run.summarize(cluster, policy=policy, metric=metric, threshold=threshold),
            series=run.series(cluster, metric=metric))
    return run.SimulationResult(trace=trace, policy=policy, profile=profile,
                                slo_metric=metric, slo_threshold_s=threshold, results=results)


def report_path(base: Path, key: str, *, several: bool) -> Path:
    """`base` for one model; `base-<namespace>-<name>.html` for each of several."""
    if not several:
        return base
    return base.with_name(f"{base.stem}-{key.replace('/', '-')}{base.suffix}")


def summary_document(
    options: scenario.DemoOptions, *, models: scenario.Models, replay: live.Replay,
    nats_url: str, results: dict[str, run.SimulationResult],
) -> dict[str, Any]:
    """The --json summary: the run, every scale change, and the simulator's scores."""
    per_model: dict[str, Any] = {}
    for key, model in models.items():
        changes = model.changes
        per_model[key] = {
            "initial_replicas": model.initial_replicas,
            "final_replicas": model.cluster.spec_replicas,
            "max_replicas": max([model.initial_replicas, *(c.desired for c in changes)]),
            "scale_ups": sum(1 for c in changes if c.desired > c.previous),
            "scale_downs": sum(1 for c in changes if c.desired < c.previous),
            "evaluations": replay.evaluations.get(key, 0),
            "reports_published": model.reports,
            "requests": model.trace.requests,
            "rate_scale": model.trace.rate_scale,
            "changes": [{"t": round(c.at_s, 1), "from": c.previous, "to": c.desired,
                         "winner": c.winner, "summary": c.summary} for c in changes],
        }
        if key in results:
            per_model[key]["simulation"] = results[key].to_json()
    first = next(iter(models.values())).trace
    return {
        "trace": {"path": first.path, "start_epoch_s": first.start_s},
        "speed": options.speed,
        "duration_s": options.duration_s,
        "replayed_s": round(replay.replayed_s, 1),
        "real_seconds": round(replay.real_s, 2),
        "max_lag_s": round(replay.max_lag_s, 2),
        "clock_held_back_s": round(replay.held_back_s, 2),
        "interrupted": replay.interrupted,
        "failed": replay.failed,
        "nats_url": nats_url,
        "http_url": replay.http_url,
        "messages_published": replay.published,
        "dropped_messages": replay.dropped,
        "models": per_model,
    }


def finish(options: scenario.DemoOptions, *, models: scenario.Models,
           warnings: dict[str, str], replay: live.Replay, nats_url: str, out: TextIO) -> None:
    """Drain the clusters, score the run, print the table, write the report and JSON."""
    results: dict[str, run.SimulationResult] = {}
    if replay.interrupted or replay.failed:
        print(f"stopped at {view.fmt_offset(replay.replayed_s)} of the replay; no simulation "
              "report for a partial run", file=out)
    else:
        for key, model in models.items():
            model.drain()
            result = simulation_result(model)
            results[key] = result
            print(f"\n{key}: SLO p95 {result.slo_metric} <= {result.slo_threshold_s:g} s; "
                  "'scaler' is this run (the real service over NATS), 'oracle' the lower "
                  "bound that knows the future", file=out)
            print(report.table(result), file=out)
            if key in warnings:  # said in the banner too; here it is beside the scores
                print(f"warning: {warnings[key]}", file=out)
            if options.report is not None:
                path = report_path(options.report, key, several=len(models) > 1)
                report.write_html(result, path, title=f"Demo: {key}")
                print(f"report: {path}", file=out)
    for key, model in models.items():
        ups = sum(1 for c in model.changes if c.desired > c.previous)
        downs = sum(1 for c in model.changes if c.desired < c.previous)
        print(f"{key}: {ups} scale-ups, {downs} scale-downs, "
              f"{replay.evaluations.get(key, 0)} evaluations, {model.reports} reports; "
              f"replayed {replay.replayed_s:.0f} virtual s in {replay.real_s:.1f} s "
              f"(max lag {replay.max_lag_s:.1f} virtual s)", file=out)
    if options.json_path is not None:
        document = summary_document(options, models=models, replay=replay, nats_url=nats_url,
                                    results=results)
        options.json_path.write_text(json.dumps(document, indent=2) + "\n")
    out.flush()
