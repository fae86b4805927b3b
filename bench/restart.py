"""What a restart of the scaler costs, with and without the learned state kept.

Run: .venv/bin/python bench/restart.py [--loads bimodal,square-long] [--seeds 3]
         [--restarts 600,1200] [--json OUT]

Each load runs the scaler strategy three times on the same trace and seeds: without a
restart; restarted at each of `--restarts` (seconds into the trace) from nothing, as every
instance started before the learned state was kept; and restarted from the learned state
a ConfigMap would hold (`types.Learned`: the record the leader writes, through its codec,
so what a restart resumes is exactly what `scaler.service.learned` keeps). A fourth run
has no restart but starts from what a whole run on another draw of the same load
learned: a model that has run before (the day before), as a deployed one has. A restart
empties the engine's windows and the signal store (the new process has no samples yet),
as `scaler run` starting on a cluster does; the simulated cluster keeps running.
Cells: GPU-hours / feasible windows met.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import scenarios, suite
from scaler.engine import types
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.service import learned
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, run, traces
from scaler.sim.strategies import scaler as scaler_strategy

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "config" / "llama-8b.yaml"
# Label -> (shape, parameters, policy changes): memory-bound mixes, where the served share
# is learned under saturation; a square wave with restart-aware holding, where the return
# pattern is learned over two periods; a step, where nothing long-lived is learned; the
# hold-out's sawtooth, whose cycle is learned from three drops.
LOADS: dict[str, tuple[str, dict[str, float], dict[str, object]]] = {
    "bimodal": ("bimodal", {"duration": 1800.0}, {}),
    "bimodal-12k": ("bimodal", {"rate": 12.0, "long_input": 12000.0, "duration": 1800.0}, {}),
    "square-long": ("square", {"low": 0.0, "high": 30.0, "period": 1200.0, "cycles": 3.0},
                    {"behavior": {"restartAware": True}}),
    "step": ("step", {"at": 300.0, "hold": 900.0, "after": 600.0}, {}),
    "sawtooth": ("sawtooth", {"low": 5.0, "high": 50.0, "climb": 240.0, "period": 300.0,
                              "cycles": 6.0}, {"behavior": {"restartAware": True}}),
}
MODES = ("none", "forgotten", "resumed", "warm")


@dataclass(slots=True)
class Restarting:
    """The scaler strategy, restarted at `at` (trace seconds): from nothing, or from the
    record the leader would have written just before (`resume`)."""

    inner: scaler_strategy.ScalerStrategy
    at: tuple[float, ...]
    resume: bool
    done: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def period_s(self) -> float:
        return self.inner.period_s

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        due = [t for t in self.at if t <= now and t not in self.done]
        if due:
            self.done.extend(due)
            state = types.EngineState()
            if self.resume:
                state = _resumed(types.Learned.of(self.inner.state), self.inner.policy,
                                 at=self.inner.start_epoch_s + now)
            self.inner.restart(state)
        return self.inner.decide(cluster, now=now)


def policy_for(changes: dict[str, object]) -> policy_model.ScalePolicy:
    policy = loader.load_paths([POLICY]).policies[0]
    if not changes:
        return policy
    document = policy.model_dump(by_alias=True, exclude_none=True)
    for key, value in changes.items():
        if isinstance(value, dict):
            document["spec"][key] = {**document["spec"].get(key, {}), **value}
        else:
            document["spec"][key] = value
    return policy_model.ScalePolicy.model_validate(document)


def _trace(label: str, seed: int, out: Path) -> traces.Trace:
    shape_name, params, _ = LOADS[label]
    path = out / f"{label}-{seed}.csv"
    scenarios.scenario(shape_name, **params).write(path, seed=seed)
    return traces.load_trace(path)


def _resumed(kept: types.Learned, policy: policy_model.ScalePolicy, *, at: float
             ) -> types.EngineState:
    """`kept` written at `at` and read back as a new instance does: the state it starts."""
    fingerprint = learned.fingerprint(policy)
    record = learned.encode(kept, at=at, policy_fingerprint=fingerprint)
    return learned.decode(record, now=at, policy_fingerprint=fingerprint,
                          max_age_s=learned.DAY_S).state()


def measure(label: str, seed: int, restarts: tuple[float, ...], out: Path
            ) -> dict[str, dict[str, Any]]:
    changes = LOADS[label][2]
    trace = _trace(label, seed, out)
    policy = policy_for(changes)
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    pool = run.pool_for(policy, profile)
    problem = run.oracle_problem(trace, policy=policy, profile=profile)
    feasible = run.feasible(trace, profile=profile, metric=problem.metric,
                            threshold=problem.threshold_s)
    initial = run.initial_replicas_for(trace, policy=policy, profile=profile)
    cells: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        inner = scaler_strategy.ScalerStrategy(policy, start_epoch_s=trace.start_s)
        strategy: scaler_strategy.ScalerStrategy | Restarting = inner
        if mode in ("forgotten", "resumed"):
            strategy = Restarting(inner, restarts, resume=mode == "resumed")
        elif mode == "warm":
            # The same model a day before: a whole run on another draw of the load.
            before = _trace(label, seed + suite.WARM_SEED_OFFSET, out)
            inner.state = _resumed(run.learned_on(before, policy=policy, profile=profile,
                                                  next_start_s=trace.start_s),
                                   policy, at=trace.start_s)
        cluster = run.run_strategy(strategy, trace=trace, profile=profile, pool=pool,
                                   policy=policy, initial_replicas=initial)
        summary = run.summarize(cluster, policy=policy, metric=problem.metric,
                                threshold=problem.threshold_s, feasible_windows=feasible)
        missed = [w for w in suite.missed_windows(run.series(cluster, metric=problem.metric),
                                                  problem.threshold_s) if w in feasible]
        cells[mode] = {"gpu_hours": float(summary["gpu_hours"]),
                       "windows_met": float(summary["p95_windows_met"]),
                       "served_share": round(inner.state.served_share, 3),
                       "missed_windows": missed}
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--restarts", default="600,1200",
                        help="seconds into the trace, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("/tmp/scaler-restart"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    restarts = tuple(float(t) for t in args.restarts.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    print(f"restarts at {', '.join(f'{t:.0f}' for t in restarts)} s; cells: GPU-h / "
          "feasible windows met (served share at the end)")
    print("| load | seed | no restart | restarted from nothing | restarted, state resumed "
          "| no restart, started from a run before |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label in args.loads.split(","):
        results[label] = {}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            cells = measure(label, seed, restarts, args.out)
            results[label][seed] = cells
            row = " | ".join(f"{c['gpu_hours']:.2f} / {c['windows_met']:.3f} "
                             f"({c['served_share']:.2f})" for c in cells.values())
            print(f"| {label} | {seed} | {row} |", flush=True)
            print("  missed windows: " + "; ".join(
                f"{mode} {c['missed_windows']}" for mode, c in cells.items()), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"restarts": restarts, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
