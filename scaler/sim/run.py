"""Runs strategies over one trace on the simulated cluster and scores them (DESIGN 4.4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scaler.engine import cost as engine_cost
from scaler.engine import decide as engine_decide
from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, scoring, strategies, traces
from scaler.sim.strategies import oracle, static_peak
from scaler.sim.strategies import scaler as scaler_strategy

# DESIGN 4.4: p95 is judged per 60 s window of arrivals that has traffic.
SLO_WINDOW_S = scoring.SLO_WINDOW_S
# Warm-up traffic before t=0: longer than the longest window a strategy reads at t=0
# (KPA's 60 s stable window, the HPA's 60 s metric lag).
WARMUP_S = 120.0

# Strategies that replay the oracle's plan (they share one, computed first).
PLANNED = ("oracle", "static-peak")

Progress = Callable[[str, float], None]
FloatArray = npt.NDArray[np.float64]
latencies = scoring.latencies


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """One strategy's scores (the JSON contract's keys) and its time series for plots."""

    name: str
    summary: dict[str, float | int]
    series: dict[str, list[float]]


@dataclass(frozen=True, slots=True)
class SimulationResult:
    trace: traces.Trace
    policy: policy_model.ScalePolicy
    profile: profiles.ReplicaProfile
    slo_metric: str
    slo_threshold_s: float
    results: dict[str, StrategyResult]
    # How requests reached the replicas of every strategy's cluster, the oracle's included
    # (`cluster.Dispatch`, `--dispatch`).
    dispatch: sim_cluster.Dispatch = "push"

    def to_json(self) -> dict[str, Any]:
        """The JSON contract of DESIGN 4.4, key for key, plus `dispatch`."""
        return {
            "trace": {"path": self.trace.path, "requests": self.trace.requests,
                      "duration_s": round(self.trace.duration_s, 3),
                      "rate_scale": self.trace.rate_scale},
            "policy": self.policy.name,
            "slo": {"metric": self.slo_metric, "threshold_s": self.slo_threshold_s},
            "dispatch": self.dispatch,
            "strategies": {name: dict(r.summary) for name, r in self.results.items()},
        }


def pool_for(policy: policy_model.ScalePolicy, profile: profiles.ReplicaProfile
             ) -> sim_cluster.PoolConfig:
    """The policy's node pool shape, with the profile's (true) node boot time."""
    pool = policy.spec.node_pool
    return sim_cluster.PoolConfig(
        gpus_per_node=pool.gpus_per_node if pool else profile.node.gpus_per_node,
        node_boot_s=profile.cold_start.node_boot_seconds,
        max_nodes=pool.max_nodes if pool else None,
    )


# Without a latency guard a policy states no SLO; its default metric is judged against 2 s.
DEFAULT_SLO_S = 2.0


def slo_of(policy: policy_model.ScalePolicy) -> tuple[str, float]:
    guard = policy.spec.signals.p95_latency
    return policy.spec.latency_metric, DEFAULT_SLO_S if guard is None else guard.slo_seconds


def feasible(trace: traces.Trace, *, profile: profiles.ReplicaProfile, metric: str,
             threshold: float, dt: float = 0.1) -> set[int]:
    """Windows some provisioning can meet: their requests alone on idle replicas do.

    Requests beyond the context limit are rejected by every strategy and judged by none.
    The same under either dispatch: a request alone reaches an idle replica at the next
    step boundary and is admitted at once, whether routed to it (push) or taken from the
    shared queue (queue), so its floor latency is one formula (`scoring.floor_latencies`).
    """
    keep = profile.accepts(input_tokens=trace.input_tokens, output_tokens=trace.output_tokens)
    return scoring.feasible_windows(
        profile=profile, arrival_s=trace.arrival_s[keep],
        input_tokens=trace.input_tokens[keep].astype(np.float64),
        output_tokens=trace.output_tokens[keep].astype(np.float64),
        metric=metric, threshold=threshold, dt=dt)


def oracle_problem(trace: traces.Trace, *, policy: policy_model.ScalePolicy,
                   profile: profiles.ReplicaProfile, dt: float = 0.1,
                   grace_s: float = sim_cluster.TERMINATION_GRACE_S,
                   dispatch: sim_cluster.Dispatch = "push") -> oracle.Problem:
    """The oracle's search and replays on the cluster the strategies run on: same pool,
    grace period and dispatch (its window searches replay that dispatch too)."""
    metric, threshold = slo_of(policy)
    return oracle.Problem(trace=trace, profile=profile, pool=pool_for(policy, profile),
                          policy=policy, metric=metric, threshold_s=threshold, dt=dt,
                          grace_s=grace_s, dispatch=dispatch)


def plan_oracle(
    trace: traces.Trace, *, policy: policy_model.ScalePolicy, profile: profiles.ReplicaProfile,
    initial: int | None = None, dt: float = 0.1, warmup_s: float = WARMUP_S,
    grace_s: float = sim_cluster.TERMINATION_GRACE_S, dispatch: sim_cluster.Dispatch = "push",
) -> oracle.Plan:
    """The oracle's plan: per-window needs, the lower bound, and the repaired replay."""
    problem = oracle_problem(trace, policy=policy, profile=profile, dt=dt, grace_s=grace_s,
                             dispatch=dispatch)
    windows = feasible(trace, profile=profile, metric=problem.metric,
                       threshold=problem.threshold_s, dt=dt)
    return oracle.make_plan(problem, feasible=windows, initial=initial,
                            run=replayer(problem, warmup_s=warmup_s))


def initial_replicas_for(trace: traces.Trace, *, policy: policy_model.ScalePolicy,
                         profile: profiles.ReplicaProfile, dt: float = 0.1,
                         grace_s: float = sim_cluster.TERMINATION_GRACE_S,
                         dispatch: sim_cluster.Dispatch = "push") -> int:
    """Every strategy's start on this trace (`oracle.initial_replicas`), for `simulate`."""
    problem = oracle_problem(trace, policy=policy, profile=profile, dt=dt, grace_s=grace_s,
                             dispatch=dispatch)
    windows = feasible(trace, profile=profile, metric=problem.metric,
                       threshold=problem.threshold_s, dt=dt)
    return oracle.initial_replicas(problem, feasible=windows, run=replayer(problem))


def replayer(problem: oracle.Problem, *, warmup_s: float = WARMUP_S) -> oracle.Runner:
    """How the oracle replays a schedule: `run_strategy` on the problem's cluster."""

    def replay(strategy: oracle.Scheduled, start: int, trace: traces.Trace
               ) -> sim_cluster.SimCluster:
        return run_strategy(strategy, trace=trace, profile=problem.profile, pool=problem.pool,
                            policy=problem.policy, initial_replicas=start, dt=problem.dt,
                            warmup_s=warmup_s, grace_s=problem.grace_s,
                            dispatch=problem.dispatch)

    return replay


def context_for(
    *, policy: policy_model.ScalePolicy, profile: profiles.ReplicaProfile,
    trace: traces.Trace, pool: sim_cluster.PoolConfig, need: npt.NDArray[np.int64] | None = None,
    initial: int | None = None, dt: float = 0.1, plan: oracle.Plan | None = None,
    grace_s: float = sim_cluster.TERMINATION_GRACE_S, deletion_cost: bool = True,
    dispatch: sim_cluster.Dispatch = "push", learned: engine_types.Learned | None = None,
) -> strategies.Context:
    """What strategy constructors read; the oracle's plan (`plan`, or computed when first
    needed) is shared by `oracle` and `static-peak`."""
    return strategies.Context(
        policy=policy, profile=profile, trace=trace, pool=pool,
        rate_need=oracle.oracle_need(trace, profile) if need is None else need,
        planner=lambda: plan_oracle(trace, policy=policy, profile=profile, initial=initial,
                                    dt=dt, grace_s=grace_s, dispatch=dispatch),
        _plan=plan, deletion_cost=deletion_cost, learned=learned)


def make_strategy(
    name: str,
    *,
    policy: policy_model.ScalePolicy,
    profile: profiles.ReplicaProfile,
    trace: traces.Trace,
    pool: sim_cluster.PoolConfig,
    need: npt.NDArray[np.int64] | None = None,
    initial_replicas: int | None = None,
) -> strategies.Strategy:
    """The named strategy from the registry (`strategies.REGISTRY`)."""
    return strategies.make(name, context_for(policy=policy, profile=profile, trace=trace,
                                             pool=pool, need=need, initial=initial_replicas))


def run_strategy(
    strategy: strategies.Strategy,
    *,
    trace: traces.Trace,
    profile: profiles.ReplicaProfile,
    pool: sim_cluster.PoolConfig,
    policy: policy_model.ScalePolicy,
    initial_replicas: int,
    dt: float = 0.1,
    warmup_s: float = WARMUP_S,
    progress: Progress | None = None,
    grace_s: float = sim_cluster.TERMINATION_GRACE_S,
    dispatch: sim_cluster.Dispatch = "push",
) -> sim_cluster.SimCluster:
    """Drive one cluster with one strategy to the end of the trace and its drain tail.

    The strategy is first asked at t=0, after `warmup_s` of warm-up traffic on the
    initial replicas (see SimCluster), and then every `period_s`. The run ends when
    every accepted request has finished after the trace's end, or at the end of the
    drain tail (`cluster.DRAIN_TAIL_S`): what is still unfinished then is counted
    (`unfinished`) and judged a miss. `grace_s`: a removed replica's
    terminationGracePeriodSeconds; `dispatch`: how requests reach the replicas
    (`cluster.Dispatch`).
    """
    cluster = sim_cluster.SimCluster(
        trace=trace, profile=profile, pool=pool, initial_replicas=initial_replicas, dt=dt,
        gpus_per_replica=policy.spec.resources.gpus_per_replica, warmup_s=warmup_s,
        grace_s=grace_s, dispatch=dispatch,
    )
    next_decision = 0.0
    report_every = max(1, cluster.steps // 100)
    for step in range(cluster.steps):
        now = cluster.time_of_step(step)
        cluster.advance(now)
        if now >= next_decision - 1e-9:
            cluster.scale_to(strategy.decide(cluster, now=now), now=now)
            next_decision += strategy.period_s
        cluster.run_step(now)
        if now > trace.duration_s and cluster.drained:
            break
        if progress is not None and step % report_every == 0:
            progress(strategy.name, min(1.0, now / max(trace.duration_s, 1e-9)))
    return cluster


def summarize(
    cluster: sim_cluster.SimCluster,
    *,
    policy: policy_model.ScalePolicy,
    metric: str,
    threshold: float,
    feasible_windows: set[int] | None = None,
) -> dict[str, float | int]:
    """The contract's per-strategy numbers (DESIGN 4.4 and the cost vocabulary of 1).

    Rejected requests (beyond the context limit) are counted and judged by no SLO
    figure; unfinished ones are misses. `interrupted_requests` are the unfinished ones
    cut by a scale-down (their replica killed at the end of its grace period), a part of
    `unfinished`. `feasible_windows` defaults to every window with traffic (callers that
    know the profile pass `feasible(...)`).
    """
    trace = cluster.trace
    accepted = ~cluster.rejected[cluster.first:]
    judged = scoring.judged(cluster, metric)[accepted]
    windows = scoring.windows_of(trace.arrival_s)[accepted]
    within = judged <= threshold + scoring.EPSILON_S
    met = scoring.window_met(judged, windows, threshold)
    if feasible_windows is None:
        feasible_windows = set(met)
    judged_feasible = [w for w in met if w in feasible_windows]
    in_feasible = np.isin(windows, np.fromiter(feasible_windows, dtype=np.int64,
                                               count=len(feasible_windows)))
    served = judged[np.isfinite(judged)]
    p50, p95, p99 = (np.percentile(served, [50, 95, 99]).tolist() if served.size
                     else [0.0, 0.0, 0.0])
    completed = int(np.isfinite(cluster.done[cluster.first:]).sum())
    rejected = int(trace.requests - np.count_nonzero(accepted))
    price = engine_cost.of_gpu_time(
        allocated_gpu_seconds=cluster.gpu_seconds(until=trace.duration_s),
        useful_gpu_seconds=cluster.useful_gpu_s, gpu_hourly=policy.spec.cost.gpu_hourly,
        requests=completed)

    def fraction(hits: int, total: int) -> float:
        # Nothing to judge counts against nobody (0 feasible windows: 1.0).
        return round(hits / total, 6) if total else 1.0

    return {
        "requests": trace.requests,
        "completed": completed,
        "rejected": rejected,
        "unfinished": trace.requests - rejected - completed,
        "interrupted_requests": int(np.count_nonzero(cluster.interrupted[cluster.first:])),
        "slo_attainment": fraction(int(within.sum()), int(judged.size)),
        "slo_attainment_feasible": fraction(int(within[in_feasible].sum()),
                                            int(in_feasible.sum())),
        "feasible_windows": len(judged_feasible),
        "p95_windows_met": fraction(sum(met[w] for w in judged_feasible), len(judged_feasible)),
        "p95_windows_met_all": fraction(sum(met.values()), len(met)),
        "p50_latency_s": round(p50, 4),
        "p95_latency_s": round(p95, 4),
        "p99_latency_s": round(p99, 4),
        "gpu_hours": round(price.allocated_gpu_hours, 4),
        "cost": round(price.cost, 4),
        "idle_cost": round(price.idle_cost, 4),
        # The contract's number: 0 when nothing completed (no price per request).
        "cost_per_1k_requests": round(price.cost_per_1k_requests or 0.0, 4),
        "scale_events": cluster.scale_events,
        "max_replicas": cluster.max_spec,
    }


def series(cluster: sim_cluster.SimCluster, *, metric: str) -> dict[str, list[float]]:
    """Series for the report's plots, from t=0 (warm-up excluded):

    - every 10 s: `t`, `arrival_rate` (req/s), `in_system` (mean requests), and the counts
      at the end of each 10 s (whole numbers): `desired` (spec.replicas as set), `ready`,
      `starting` (pods created, not ready yet, waiting for a node included), `nodes`;
    - `event_t`/`event_from`/`event_desired`: each change of spec.replicas, at its step;
    - `p95_window_t`/`p95`: each 60 s window with traffic and its p95 (unanswered
      requests count as waiting until the end); `p95_unserved_t`: windows whose p95
      request was never answered.
    """
    h = cluster.history
    per = max(1, int(round(10.0 / cluster.dt)))
    start = cluster.index(0.0)
    steps = (cluster.step - start) - (cluster.step - start) % per
    if steps <= 0:
        return {}

    def fold(values: npt.NDArray[Any], how: str) -> list[float]:
        shaped = values[start:start + steps].reshape(-1, per).astype(np.float64)
        if how == "last":
            return [float(v) for v in shaped[:, -1]]
        folded = shaped.sum(axis=1) / 10.0 if how == "rate" else shaped.mean(axis=1)
        return [round(float(v), 3) for v in folded]

    # From the last warm-up step, so a change decided at t=0 counts as an event.
    base = max(start - 1, 0)
    spec = h.spec[base:cluster.step]
    changed = np.flatnonzero(np.diff(spec)) + 1
    # p95 per window of the accepted requests: of their censored latencies (an unanswered
    # request counts as waiting until the run ended), so every value is finite; windows
    # whose p95 request was never answered are listed apart.
    accepted = ~cluster.rejected[cluster.first:]
    windows = scoring.windows_of(cluster.trace.arrival_s)[accepted]
    shown = scoring.censored(cluster, metric)[accepted]
    judged = scoring.judged(cluster, metric)[accepted]
    p95_t: list[float] = []
    p95: list[float] = []
    unserved: list[float] = []
    order = np.argsort(windows, kind="stable")
    for idx in np.split(order, np.flatnonzero(np.diff(windows[order])) + 1):
        if not idx.size:
            continue
        start_t = float(windows[idx[0]]) * SLO_WINDOW_S
        p95_t.append(start_t)
        p95.append(round(float(np.percentile(shown[idx], 95)), 3))
        if not scoring.p95_within(judged[idx], float(np.finfo(np.float64).max)):
            unserved.append(start_t)
    return {
        "t": [i * 10.0 for i in range(steps // per)],
        "arrival_rate": fold(h.arrivals, "rate"),
        "in_system": fold(h.waiting + h.running, "mean"),
        "desired": fold(h.spec, "last"),
        "ready": fold(h.ready, "last"),
        "starting": fold(h.starting, "last"),
        "nodes": fold(h.nodes, "last"),
        "event_t": [round(cluster.time_of_step(base + int(i)), 3) for i in changed],
        "event_desired": [float(spec[i]) for i in changed],
        "event_from": [float(spec[i - 1]) for i in changed],
        "p95_window_t": p95_t,
        "p95": p95,
        "p95_unserved_t": unserved,
    }


def learned_on(trace: traces.Trace, *, policy: policy_model.ScalePolicy,
               profile: profiles.ReplicaProfile, next_start_s: float, dt: float = 0.1,
               grace_s: float = sim_cluster.TERMINATION_GRACE_S,
               dispatch: sim_cluster.Dispatch = "push") -> engine_types.Learned:
    """What `scaler` learns running `trace` (served share, load of a request, start times,
    return pattern, the learned hold's returns and leaves, a cycle): the state a model
    that ran on it before resumes, as the service resumes its ConfigMap's record. The run
    before ends where the next starts (`next_start_s`, epoch seconds): its returns, leaves
    and last drop are moved there, the last hour before the next run; its pod starts are
    long past. A cycle goes on in the phase it had only once it is one (drops a cycle
    apart twice in a row): the two runs are glued there, not one load, so a first
    interval measured across the glue would be made up (Azure code's next span: the
    drop 291 s before the glue and one 71 s after it passed for a cycle of 350 s, whose
    plan bought 15 replicas where 9 ran). Otherwise the next run finds the phase at its
    first drop, with the last whole cycle's profile (the hold-out's sawtooth, 300 s
    periods over 1,800 s: its next drop comes 10 s later than the cycle says, as the run
    before ended 10 s after its last arrival, within the 5 % a drop may be off)."""
    start = initial_replicas_for(trace, policy=policy, profile=profile, dt=dt,
                                 grace_s=grace_s, dispatch=dispatch)
    strategy = scaler_strategy.ScalerStrategy(policy, start_epoch_s=trace.start_s)
    run_strategy(strategy, trace=trace, profile=profile, pool=pool_for(policy, profile),
                 policy=policy, initial_replicas=start, dt=dt, grace_s=grace_s,
                 dispatch=dispatch)
    state = strategy.state
    ended = state.recommendations[-1].at if state.recommendations else trace.start_s
    shift = next_start_s - ended
    learned = dataclasses.replace(
        engine_types.Learned.of(state), observed_until=float("-inf"),
        level_returns=tuple(dataclasses.replace(r, at=r.at + shift)
                            for r in state.level_returns),
        level_leaves=tuple(at + shift for at in state.level_leaves))
    if state.last_drop_at is not None and engine_decide.learned_cycle(state) is not None:
        return dataclasses.replace(learned, last_drop_at=state.last_drop_at + shift)
    # The profile since a drop the next run does not see is no cycle of its own.
    return dataclasses.replace(learned, last_drop_at=None, cycle_demand=())


def initial_replicas(policy: policy_model.ScalePolicy, need: npt.NDArray[np.int64]) -> int:
    """A start from a per-window need (the rate estimate): what the first minute needs."""
    first = int(need[0]) if need.size else 0
    spec = policy.spec
    return min(max(first, spec.replicas.min, 1), spec.replicas.max)


def simulate(
    trace: traces.Trace,
    *,
    policy: policy_model.ScalePolicy,
    profile: profiles.ReplicaProfile,
    names: Sequence[str] = strategies.STRATEGIES,
    dt: float = 0.1,
    progress: Progress | None = None,
    initial: int | None = None,
    grace_s: float = sim_cluster.TERMINATION_GRACE_S,
    deletion_cost: bool = True,
    dispatch: sim_cluster.Dispatch = "push",
    learned: engine_types.Learned | None = None,
) -> SimulationResult:
    """Run each named strategy on its own copy of the cluster; same trace, same start.

    Every strategy starts from the oracle's initial replicas (`initial`, or
    `initial_replicas_for`: what the windows before a first pod could serve need),
    except `static-peak`, which holds its peak from t=0. The oracle's own replay is the
    one its plan already ran. Runs split across processes pass the same `initial`.
    `grace_s`: every cluster's terminationGracePeriodSeconds (`--termination-grace-period`);
    `deletion_cost=False`: `scaler` writes no pod-deletion-cost (`--no-deletion-cost`).
    `dispatch`: how requests reach the replicas of every cluster (`--dispatch`), the
    oracle's searches, its start and its replay included, so it bounds the strategies on
    their own cluster; feasibility is the same under both (`feasible`). `learned`: what
    `scaler` starts having learned (`learned_on`, a model that has run before); None:
    nothing, as on a model's first run.
    """
    pool = pool_for(policy, profile)
    problem = oracle_problem(trace, policy=policy, profile=profile, dt=dt, grace_s=grace_s,
                             dispatch=dispatch)
    metric, threshold = problem.metric, problem.threshold_s
    windows = feasible(trace, profile=profile, metric=metric, threshold=threshold, dt=dt)
    plan: oracle.Plan | None = None
    if any(name in PLANNED for name in names):
        plan = plan_oracle(trace, policy=policy, profile=profile, dt=dt, initial=initial,
                           grace_s=grace_s, dispatch=dispatch)
        start = plan.initial
    elif initial is not None:
        start = initial
    else:
        start = initial_replicas_for(trace, policy=policy, profile=profile, dt=dt,
                                     grace_s=grace_s, dispatch=dispatch)
    context = context_for(policy=policy, profile=profile, trace=trace, pool=pool,
                          initial=start, dt=dt, plan=plan, grace_s=grace_s,
                          deletion_cost=deletion_cost, dispatch=dispatch, learned=learned)
    results: dict[str, StrategyResult] = {}
    for name in names:
        strategy = strategies.make(name, context)
        cluster = context.plan().replayed if name == "oracle" else None
        if cluster is None:
            own = strategy.initial_replicas if isinstance(
                strategy, static_peak.StaticPeak) else start
            cluster = run_strategy(strategy, trace=trace, profile=profile, pool=pool,
                                   policy=policy, initial_replicas=own, dt=dt,
                                   progress=progress, grace_s=grace_s, dispatch=dispatch)
        summary = summarize(cluster, policy=policy, metric=metric, threshold=threshold,
                            feasible_windows=windows)
        if name == "oracle":
            summary["gpu_hours_lower_bound"] = round(context.plan().lower_bound_gpu_hours, 4)
        results[name] = StrategyResult(name=name, summary=summary,
                                       series=series(cluster, metric=metric))
    return SimulationResult(trace=trace, policy=policy, profile=profile, slo_metric=metric,
                            slo_threshold_s=threshold, results=results, dispatch=dispatch)
