"""The engine takes any number it is handed: extreme, subnormal, negative zero, NaN.

Values are bounded at the edge (the parsers drop the implausible), but the engine must not
depend on that: whatever a snapshot, a cluster state or an engine state holds, `decide`
returns a count within the policy's bounds and never raises.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.engine import decide as engine_decide
from scaler.engine import types
from tests.engine.helpers import MONDAY_0600_UTC, policy

EXTREMES = st.sampled_from([0.0, -0.0, 5e-324, 2.2e-308, 1e-12, 1.0, 1e12, 1e300, 1.7e308,
                            float("inf"), float("nan"), -1.0, -1e300])
numbers = EXTREMES | st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def values(draw: st.DrawFn) -> types.SignalValue | None:
    if draw(st.booleans()):
        return None
    # `fresh` drawn freely too: a caller that skipped `assess` must not break the engine.
    return types.SignalValue(value=draw(numbers), age_s=draw(EXTREMES | st.just(1.0)),
                             fresh=draw(st.booleans()), sources=draw(st.integers(0, 10**6)))


@st.composite
def snapshots(draw: st.DrawFn) -> types.SignalSnapshot:
    return types.SignalSnapshot(
        queue_depth=draw(values()), in_flight=draw(values()),
        tokens_per_second=draw(values()), prompt_tokens_per_second=draw(values()),
        p95_latency=draw(values()), arrival_rate=draw(values()),
        completion_rate=draw(values()), kv_cache_usage=draw(values()),
        shared_waiting=draw(values()))


@st.composite
def clusters(draw: st.DrawFn) -> types.ClusterState:
    current = draw(st.integers(0, 10**6))
    return types.ClusterState(
        current=current, ready=draw(st.integers(0, current)),
        starting=tuple(draw(st.lists(st.sampled_from([MONDAY_0600_UTC - 60.0, 0.0, 1e300]),
                                     max_size=3))),
        free_replica_slots=draw(st.none() | st.integers(0, 10**6)),
        observations=tuple(types.ColdStartObservation(created_at=c, ready_at=r)
                           for c, r in draw(st.lists(st.tuples(EXTREMES, EXTREMES),
                                                     max_size=2))),
        budget_gpus=draw(st.none() | st.integers(0, 10**6)))


POLICY: Any = policy(
    signals={"concurrency": {"targetPerReplica": 10},
             "queueDepth": {"targetWaitingPerReplica": 2},
             "tokensPerSecond": {"capacityPerReplica": 2400,
                                 "promptCapacityPerReplica": 25000},
             "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}},
    forecast={"enabled": True, "windowSeconds": 120},
    coldStart={"nodeBootSeconds": 300, "imagePullSeconds": 30, "modelLoadSeconds": 20,
               "readinessSeconds": 10, "learn": True},
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(snapshots(), clusters()), min_size=1, max_size=6))
def test_decide_never_raises_and_stays_in_bounds(
    timeline: list[tuple[types.SignalSnapshot, types.ClusterState]],
) -> None:
    state = types.EngineState()
    spec = POLICY.spec
    for step, (snapshot, cluster) in enumerate(timeline):
        now = MONDAY_0600_UTC + 10.0 * step
        decision, state = engine_decide.decide(POLICY, snapshot=snapshot, cluster=cluster,
                                               state=state, now=now)
        assert isinstance(decision.desired, int)
        budget = cluster.budget_gpus if cluster.budget_gpus is not None else spec.replicas.max
        assert decision.desired <= min(spec.replicas.max, budget) or (
            decision.desired == spec.replicas.min)
        assert decision.desired >= min(spec.replicas.min, budget)
        assert all(isinstance(s.replicas, int | None) for s in decision.steps)
