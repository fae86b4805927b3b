"""Hypothesis properties of the engine: bounds, stale holds, rate limits, determinism."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scaler.engine import decide as engine_decide
from scaler.engine import forecast, types
from scaler.engine import spec as engine_spec
from tests.engine.helpers import Sim, policy

value = st.one_of(st.none(), st.floats(min_value=0, max_value=5000, allow_nan=False))
age = st.floats(min_value=0, max_value=120)


@st.composite
def snapshots(draw: st.DrawFn) -> types.SignalSnapshot:
    def signal() -> types.SignalValue | None:
        v = draw(value)
        return None if v is None else types.SignalValue.assess(v, age_s=draw(age),
                                                               stale_after_s=30.0)

    queue = signal()
    # Some of the queue may wait in a shared work queue (a JetStream consumer's lag).
    shared = (None if queue is None or not draw(st.booleans()) else types.SignalValue.assess(
        queue.value * draw(st.floats(0, 1)), age_s=queue.age_s, stale_after_s=30.0))
    usage = draw(st.none() | st.floats(0, 1))
    return types.SignalSnapshot(
        queue_depth=queue, in_flight=signal(), tokens_per_second=signal(),
        p95_latency=signal(), arrival_rate=signal(), completion_rate=signal(),
        kv_cache_usage=None if usage is None else types.SignalValue.assess(
            usage, age_s=draw(age), stale_after_s=30.0),
        shared_waiting=shared)


@st.composite
def policies(draw: st.DrawFn) -> Any:
    lo = draw(st.integers(0, 5))
    hi = draw(st.integers(max(lo, 1), 30))
    floor = draw(st.integers(0, hi))
    gpus = draw(st.sampled_from([1, 2, 8]))
    budget = draw(st.one_of(st.none(), st.integers(max(lo, floor, 1) * gpus, 64 * gpus)))
    up_rule = {"type": draw(st.sampled_from(["Pods", "Percent"])),
               "value": draw(st.integers(1, 200)), "periodSeconds": draw(st.integers(1, 120))}
    down_rule = {"type": draw(st.sampled_from(["Pods", "Percent"])),
                 "value": draw(st.integers(1, 100)),
                 "periodSeconds": draw(st.integers(1, 120))}
    overrides: dict[str, Any] = {
        "replicas": {"min": lo, "max": hi},
        "warmFloor": {"replicas": floor},
        "signals": {"concurrency": {"targetPerReplica": draw(st.integers(1, 64))},
                    "queueDepth": {"targetWaitingPerReplica": draw(st.integers(1, 8))},
                    "tokensPerSecond": {"capacityPerReplica": 1000},
                    "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}},
        "behavior": {
            "scaleUp": {"stabilizationSeconds": draw(st.integers(0, 60)),
                        "policies": [up_rule]},
            "scaleDown": {"stabilizationSeconds": draw(st.integers(0, 600)),
                          "policies": [down_rule]},
            "restartAware": draw(st.booleans()),
        },
        "resources": {"gpusPerReplica": gpus},
        "forecast": {"enabled": draw(st.booleans()), "windowSeconds": 60},
    }
    if budget is not None:
        overrides["budget"] = {"maxGpus": budget}
    return policy(**overrides)


# Each step: seconds since the last, the snapshot, and the replicas that fit on free GPUs
# (None: unknown, a node must boot).
steps = st.lists(st.tuples(st.floats(min_value=0.5, max_value=90), snapshots(),
                           st.none() | st.integers(0, 64)),
                 min_size=1, max_size=25)


def _run(p: Any, start_current: int,
         timeline: list[tuple[float, types.SignalSnapshot, int | None]]
         ) -> list[tuple[float, types.SignalSnapshot, types.Decision]]:
    """Apply each decision at once (the shared `Sim`); replicas are ready as they exist."""
    sim = Sim(p, current=start_current)
    t, out = 0.0, []
    for dt, snapshot, free in timeline:
        t += dt
        sim.step(t, snapshot, free_replica_slots=free)
        assert sim.last is not None
        out.append((sim.start + t, snapshot, sim.last))
    return out


@settings(max_examples=200, deadline=None)
@given(policies(), st.integers(0, 40), steps)
def test_bounds_always_hold(p: Any, start: int, timeline: Any) -> None:
    spec = p.spec
    cap = spec.replicas.max
    if spec.budget:
        cap = min(cap, spec.budget.max_gpus // spec.resources.gpus_per_replica)
    for now, _, decision in _run(p, start, timeline):
        floor = max(spec.replicas.min, spec.warm_floor.at(now))
        assert floor <= decision.desired <= cap


@settings(max_examples=200, deadline=None)
@given(policies(), st.integers(0, 40), steps)
def test_no_scale_down_while_a_demand_signal_is_stale(p: Any, start: int, timeline: Any
                                                      ) -> None:
    cap = p.spec.replicas.max
    if p.spec.budget:
        cap = min(cap, p.spec.budget.max_gpus // p.spec.resources.gpus_per_replica)
    for _, _, decision in _run(p, start, timeline):
        stale = any(not s.fresh for s in decision.signals if s.name != "p95_latency")
        if stale and decision.desired < decision.current:
            # Only a hard cap (max or budget) may lower the count on stale data.
            assert decision.current > cap and decision.desired == cap


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(5, 120), st.integers(1, 6), st.integers(5, 120), steps)
def test_rate_limits_never_exceeded_over_any_period(
    up_pods: int, up_period: int, down_pods: int, down_period: int, timeline: Any
) -> None:
    p = policy(
        replicas={"min": 0, "max": 40},
        behavior={
            "scaleUp": {"stabilizationSeconds": 0, "policies": [
                {"type": "Pods", "value": up_pods, "periodSeconds": up_period}]},
            "scaleDown": {"stabilizationSeconds": 0, "policies": [
                {"type": "Pods", "value": down_pods, "periodSeconds": down_period}]},
        },
    )
    changes = [(now, d.desired - d.current) for now, _, d in _run(p, 10, timeline)]
    def net(end: float, period: int) -> int:
        return sum(c for t, c in changes if end - period < t <= end)

    for end, change in changes:
        # At every move, the net movement within that direction's period ending then never
        # exceeds its allowance (an up move may be offset by a down move within the same
        # period, as in the HPA, whose period starts at the count before it). A move never
        # goes against its direction's limit either: the down limit never lifts a count.
        if change > 0:
            assert net(end, up_period) <= up_pods
        elif change < 0:
            assert -net(end, down_period) <= down_pods


@settings(max_examples=100, deadline=None)
@given(policies(), st.integers(0, 40), steps)
def test_same_inputs_give_the_same_output(p: Any, start: int, timeline: Any) -> None:
    first = _run(p, start, timeline)
    second = _run(p, start, timeline)
    assert first == second
    # And one call twice with the same state is the same decision and state.
    now, snapshot, _ = first[-1]
    cluster = types.ClusterState(current=start, ready=start)
    a = engine_decide.decide(p, snapshot=snapshot, cluster=cluster,
                             state=types.EngineState(), now=now)
    b = engine_decide.decide(p, snapshot=snapshot, cluster=cluster,
                             state=types.EngineState(), now=now)
    assert a == b


@settings(max_examples=200, deadline=None)
@given(st.integers(8, 40), st.lists(st.tuples(
    st.floats(min_value=0.5, max_value=30), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1),
    st.floats(0, 10)), min_size=1, max_size=40))
@example(29, [(1.0, 0.0, 1.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.125, 2.0),
              (1.0, 1.0, 0.0, 0.125, 2.0)])  # found by a test run before the queue came out
def test_never_pinned_at_max_while_every_capacity_signal_reads_under_half(
    top: int, timeline: list[tuple[float, float, float, float, float]]
) -> None:
    # Concurrency (running + waiting, 10 per replica), tokens/s (1,000 per replica at 0.8)
    # and the arrival rate (0.1 replicas per req/s once learned) all read under half of
    # max, the queue within what the ready replicas hold (2 per replica) and latency
    # anywhere up to 10x the SLO: the count may rise, never to max. (The guard pushes on a
    # short queue only when it waits past the SLO, and then at most 1.5x the capacity
    # readings; the look-ahead extrapolates at most the history it has seen.) The waiting
    # are part of the concurrency reading, so they come out of the running: a queue of 2
    # per ready replica on top read 18.7 of max 29 after a push to 26 ready, and the guard
    # went to max on that reading, as it should.
    p = policy(replicas={"min": 1, "max": top},
               signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2},
                        "tokensPerSecond": {"capacityPerReplica": 1000},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}})
    half = top / 2 - 1          # strictly under half, whatever the rounding
    sim = Sim(p, current=1)
    t = 0.0
    for dt, running, tokens, rate, slo_multiple in timeline:
        t += dt
        ready = sim.current
        in_system = running * half * 10
        waiting = min(2.0 * ready * min(running, 1.0), in_system)
        sim.step(t, types.SignalSnapshot(
            in_flight=types.SignalValue(in_system - waiting, 0.0, True),
            tokens_per_second=types.SignalValue(tokens * half * 1000 * 0.8, 0.0, True),
            queue_depth=types.SignalValue(waiting, 0.0, True),
            arrival_rate=types.SignalValue(rate * half * 10, 0.0, True),
            completion_rate=types.SignalValue(rate * half * 10, 0.0, True),
            p95_latency=types.SignalValue(2.0 * slo_multiple, 0.0, True)))
        assert sim.current < top, sim.last


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 900), st.floats(min_value=1, max_value=400),
       st.lists(st.tuples(st.floats(min_value=0.5, max_value=120), st.integers(0, 40),
                          st.none() | st.integers(0, 40)), min_size=1, max_size=200))
def test_a_learned_hold_is_never_shorter_than_a_pod_start_nor_longer_than_the_window(
        window: int, pod_start: float, timeline: list[tuple[float, int, int | None]]) -> None:
    # Whatever levels came and went (a backlog's load level among them), the down window
    # learned is between one pod start (or the window, if shorter) and the policy's own.
    spec = engine_spec.resolve(policy(behavior={
        "scaleUp": {"stabilizationSeconds": 0, "policies": []},
        "scaleDown": {"stabilizationSeconds": window, "policies": []},
        "restartAware": True}))
    state, now = types.EngineState(), 0.0
    for dt, level, load in timeline:
        now += dt
        draft = engine_decide.Draft(spec=spec, snapshot=types.SignalSnapshot(),
                                    cluster=types.ClusterState(current=level, ready=level),
                                    state=state,
                                    now=now)
        draft.raw, draft.load_raw = level, load
        draft.times = forecast.StartTimes(pod_start_s=pod_start, node_boot_s=0.0)
        hold, _ = engine_decide.learned_hold(draft, window)
        assert min(window, math.ceil(pod_start)) <= hold <= window
        kept = tuple(r for r in draft.state.recommendations
                     if r.at > now - spec.keep_recommendations_s)
        state = dataclasses.replace(draft.state, recommendations=(
            *kept, types.Recommendation(at=now, replicas=level, load=load)))
        assert len(state.level_returns) <= engine_decide.HOLD_SAMPLES
        # From the longest down, oldest first: the first is the longest of the hour.
        returned = [r.after_s for r in state.level_returns]
        assert returned == sorted(set(returned), reverse=True)
        assert len(state.level_leaves) <= engine_decide.HOLD_SAMPLES
