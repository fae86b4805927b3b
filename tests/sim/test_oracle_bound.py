"""The oracle is a lower bound: no schedule meets its windows with fewer GPU-hours.

docs/simulation.md ("The oracle") states the claim and its proof. These properties check
each step on small random traces (a few minutes at a few requests per second):

1. the search's need is necessary: a window-aligned schedule that meets a target window
   has at least the window's need ready in it, whatever came before (state monotonicity);
2. the need is sufficient from an idle start, and more replicas never hurt (the walk);
3. the bound: every schedule and strategy that meets all target windows costs at least
   `lower_bound_gpu_hours`, and the oracle's own replay meets them all at no less.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, run, scoring, strategies, traces
from scaler.sim.strategies import oracle

# Small clusters and no warm-up keep an example to a few seconds: at most 4 replicas.
MAX_REPLICAS = 4
WARMUP_S = 0.0


def _policy(policy: policy_model.ScalePolicy) -> policy_model.ScalePolicy:
    spec = policy.spec.model_copy(update={
        "replicas": policy_model.Replicas(min=1, max=MAX_REPLICAS),
        "warm_floor": policy_model.WarmFloor(),
    })
    return policy.model_copy(update={"spec": spec})


@st.composite
def small_traces(draw: st.DrawFn) -> traces.Trace:
    """Three minutes; per minute a Poisson rate of 0 to 15 req/s; mixed lengths."""
    minutes = 3
    rates = draw(st.lists(st.floats(min_value=0.0, max_value=15.0), min_size=minutes,
                          max_size=minutes))
    seed = draw(st.integers(min_value=0, max_value=2**16))
    rng = np.random.default_rng(seed)
    arrival = [np.zeros(1)]
    for minute, rate in enumerate(rates):
        count = int(rng.poisson(rate * 60.0))
        arrival.append(np.sort(rng.uniform(60.0 * minute, 60.0 * (minute + 1), count)))
    times = np.concatenate(arrival)
    n = times.size
    inputs = np.clip(rng.lognormal(np.log(800), 1.0, n), 1, 12_000).astype(np.int64)
    outputs = np.clip(rng.lognormal(np.log(120), 1.0, n), 1, 1_500).astype(np.int64)
    return traces.Trace("random", times, inputs, outputs)


def _met(problem: oracle.Problem, cluster: sim_cluster.SimCluster) -> set[int]:
    return oracle.replay_met(problem, cluster)


def _replay(problem: oracle.Problem, strategy: strategies.Strategy, initial: int
            ) -> sim_cluster.SimCluster:
    return run.run_strategy(strategy, trace=problem.trace, profile=problem.profile,
                            pool=problem.pool, policy=problem.policy, initial_replicas=initial,
                            warmup_s=WARMUP_S)


def _gpu_hours(cluster: sim_cluster.SimCluster) -> float:
    return float(cluster.gpu_seconds(until=cluster.trace.duration_s)) / 3600.0


@settings(max_examples=6, deadline=None, derandomize=True, phases=(Phase.generate,),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(trace=small_traces(), data=st.data())
def test_no_schedule_meets_the_oracles_windows_with_fewer_gpu_hours(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile,
    trace: traces.Trace, data: st.DataObject,
) -> None:
    policy = _policy(policy_8b)
    problem = run.oracle_problem(trace, policy=policy, profile=profile_8b)
    plan = run.plan_oracle(trace, policy=policy, profile=profile_8b, warmup_s=WARMUP_S)
    targets = plan.targets
    assert plan.replayed is not None
    # The oracle's replay meets every target window, and costs no less than the bound.
    assert targets <= _met(problem, plan.replayed)
    oracle_hours = _gpu_hours(plan.replayed)
    assert plan.lower_bound_gpu_hours <= oracle_hours + 1e-9

    def check(cluster: sim_cluster.SimCluster, label: str) -> None:
        if targets <= _met(problem, cluster):
            assert _gpu_hours(cluster) >= plan.lower_bound_gpu_hours - 1e-9, label

    # Hand-made: one replica fewer than a target window's need, ready throughout it,
    # must miss it. A replica stopped at the window's start could not be back within a
    # pod start, so the windows starting within one pod start after it get no more.
    pod_start = profile_8b.cold_start.pod_start_seconds
    for window in sorted(targets):
        fewer = int(plan.need[window]) - 1
        if fewer < policy.spec.replicas.min:
            continue
        schedule = plan.schedule.copy()
        after = window + 1 + int(np.ceil(pod_start / scoring.SLO_WINDOW_S))
        schedule[window:after] = np.minimum(schedule[window:after], fewer)
        cluster = _replay(problem, oracle.scheduled(problem, schedule), plan.initial)
        start = window * scoring.SLO_WINDOW_S
        ready = cluster.window(cluster.history.ready, start=start,
                               end=start + scoring.SLO_WINDOW_S)
        assert int(ready.max()) <= fewer
        assert window not in _met(problem, cluster), (window, schedule.tolist())
        check(cluster, f"minus one in window {window}")
    # Random window-aligned schedules, and the oracle's with random extra replicas.
    for _ in range(2):
        schedule = np.array(data.draw(st.lists(
            st.integers(min_value=1, max_value=MAX_REPLICAS), min_size=problem.windows,
            max_size=problem.windows)), dtype=np.int64)
        check(_replay(problem, oracle.scheduled(problem, schedule), plan.initial),
              f"random {schedule.tolist()}")
    extra = np.array(data.draw(st.lists(st.integers(min_value=0, max_value=1),
                                        min_size=problem.windows, max_size=problem.windows)))
    padded = np.minimum(plan.schedule + extra, MAX_REPLICAS)
    cluster = _replay(problem, oracle.scheduled(problem, padded), plan.initial)
    # More replicas than the oracle's never lose a window it met (so this check bites).
    assert targets <= _met(problem, cluster)
    check(cluster, "padded")
    # Every other strategy, from the same start.
    context = run.context_for(policy=policy, profile=profile_8b, trace=trace, pool=problem.pool,
                              initial=plan.initial, plan=plan)
    for name in strategies.NAMES:
        if name == "oracle":
            continue
        strategy = strategies.make(name, context)
        start = plan.peak if name == "static-peak" else plan.initial
        check(_replay(problem, strategy, start), name)


@settings(max_examples=4, deadline=None, derandomize=True, phases=(Phase.generate,),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(trace=small_traces())
def test_the_need_meets_from_idle_and_more_replicas_never_hurt(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile,
    trace: traces.Trace,
) -> None:
    policy = _policy(policy_8b)
    problem = run.oracle_problem(trace, policy=policy, profile=profile_8b)
    feasible = run.feasible(trace, profile=profile_8b, metric="ttft", threshold=2.0)
    need, targets = oracle.search_needs(problem, feasible=feasible)
    windows = scoring.windows_of(trace.arrival_s)
    for window in sorted(targets):
        requests = np.flatnonzero(windows == window)
        start = window * scoring.SLO_WINDOW_S
        # The walk stops at the first count that fails below one that meets: every
        # smaller count fails too, and one more than the need still meets.
        for replicas in range(1, int(need[window])):
            assert not oracle.window_meets(problem, requests=requests, start_s=start,
                                           replicas=replicas), (window, replicas)
        for replicas in range(int(need[window]), min(int(need[window]) + 1, MAX_REPLICAS) + 1):
            assert oracle.window_meets(problem, requests=requests, start_s=start,
                                       replicas=replicas), (window, replicas)


def test_least_cost_schedule_holds_short_dips_and_restarts_long_ones() -> None:
    # Pod start 105 s: a 60 s dip costs less held (60) than restarted (105); a 120 s dip
    # costs less restarted. Need 3,1,3,1,1,3 from 3 ready at t=0, full 60 s windows.
    need = np.array([3, 1, 3, 1, 1, 3])
    schedule, cost = oracle.least_cost_schedule(need, lengths=np.full(6, 60.0), initial=3,
                                                start_cost_s=105.0)
    assert schedule.tolist() == [3, 3, 3, 1, 1, 3]
    # Level 1: 360 s; levels 2 and 3: 4 windows held (240) + one restart (105) each.
    assert cost == pytest.approx(360 + 2 * (240 + 105))
