"""The README's worked example, computed by the engine (so the document cannot drift)."""

from __future__ import annotations

from pathlib import Path

from scaler.engine import decide as engine_decide
from scaler.engine import types
from scaler.policy import loader
from tests.engine.helpers import MONDAY_0600_UTC

REPO = Path(__file__).resolve().parents[2]
SATURDAY_NOON_UTC = MONDAY_0600_UTC + 5 * 86400 + 6 * 3600   # no business-hours floor


def test_worked_example() -> None:
    (policy,) = loader.load_paths([REPO / "config" / "llama-8b.yaml"]).policies
    now = SATURDAY_NOON_UTC
    # Demand rising 0.02 replicas/s over the last two minutes, reaching 4.0 now.
    history = tuple(types.DemandSample(at=now - s, demand=4.0 - 0.02 * s)
                    for s in range(120, 0, -5))
    state = types.EngineState(demand=history, last_desired=3,
                              recommendations=(types.Recommendation(at=now - 5, replicas=3),))
    snapshot = types.SignalSnapshot(
        in_flight=types.SignalValue(152), queue_depth=types.SignalValue(40),
        tokens_per_second=types.SignalValue(3000),
        prompt_tokens_per_second=types.SignalValue(60000), p95_latency_s=types.SignalValue(1.4))
    cluster = types.ClusterState(current=3, ready=3, free_replica_slots=8)
    decision, state = engine_decide.decide(policy, snapshot=snapshot, cluster=cluster,
                                           state=state, now=now)
    recs = {s.name: s.recommendation for s in decision.signals}
    assert recs == {"concurrency": 4, "queue_depth": 5, "tokens_per_second": 4,
                    "p95_latency": None}
    assert decision.forecast is not None
    assert decision.forecast.time_to_ready_s == 90
    assert round(decision.forecast.demand_at_ready, 2) == 5.8
    assert decision.forecast.replicas_at_ready == 6
    assert (decision.recommendation, decision.winner) == (6, "forecast")
    assert (decision.current, decision.desired) == (3, 6)

    # The queue drains and concurrency falls to 2 replicas' worth: 300 s down window,
    # then at most 25 % a minute.
    quiet = types.SignalSnapshot(
        in_flight=types.SignalValue(90), queue_depth=types.SignalValue(0),
        tokens_per_second=types.SignalValue(2000),
        prompt_tokens_per_second=types.SignalValue(20000), p95_latency_s=types.SignalValue(0.5))
    current, seen = 6, [6]
    for t in range(10, 900, 10):
        decision, state = engine_decide.decide(
            policy, snapshot=quiet, cluster=types.ClusterState(current=current, ready=current),
            state=state, now=now + t)
        if decision.desired != current:
            seen.append(decision.desired)
            assert t >= 300
        current = decision.desired
    assert seen == [6, 4, 3, 2]
