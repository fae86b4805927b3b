"""The service registry: cost accounting, outcomes, policy swaps, readiness."""

from __future__ import annotations

import pytest

from scaler.actuators import timefmt
from scaler.engine import cost as engine_cost
from scaler.engine import types
from scaler.policy import loader
from scaler.service import conditions
from scaler.service import state as service_state

from . import factories

DAY = 24 * 3600.0


def test_cost_worked_example_from_the_design() -> None:
    # 4 one-GPU replicas for 24 h at 2.50/GPU-hour: 96 GPU-hours, 240; 35 % busy -> 156 idle.
    # 35 % busy: 67.2 requests in flight over 4 ready x 48 per replica = 192 capacity.
    policy = factories.policy()
    since = factories.observation(ready=4, current=4, in_flight=67.2)
    totals = service_state.accrue(engine_cost.Cost(), policy=policy, since=since,
                                  until=factories.NOW + DAY)
    assert totals.allocated_gpu_hours == pytest.approx(96.0)
    assert totals.cost == pytest.approx(240.0)
    assert totals.idle_cost == pytest.approx(156.0)
    assert totals.useful_gpu_seconds / 3600 == pytest.approx(33.6)


def test_starting_replicas_hold_gpus_but_do_no_work() -> None:
    # 8 GPUs per replica, 1 ready (fully busy) and 1 starting, for one hour at 2.50.
    policy = factories.policy(spec={"resources": {"gpusPerReplica": 8}})
    since = factories.observation(ready=1, starting=(factories.NOW,), in_flight=48.0)
    totals = service_state.accrue(engine_cost.Cost(), policy=policy, since=since,
                                  until=factories.NOW + 3600)
    assert totals.allocated_gpu_hours == pytest.approx(16.0)
    assert totals.cost == pytest.approx(40.0)
    assert totals.idle_cost == pytest.approx(20.0)


def test_requests_from_arrival_rate_give_cost_per_1k() -> None:
    # 2 replicas x 1 GPU for 1 h = 5.00; 2 requests/s for 3600 s = 7200 requests.
    policy = factories.policy()
    since = factories.observation(ready=2, arrival_rate=2.0)
    totals = service_state.accrue(engine_cost.Cost(), policy=policy, since=since,
                                  until=factories.NOW + 3600)
    assert totals.requests == pytest.approx(7200.0)
    assert totals.cost_per_1k_requests == pytest.approx(5.0 / 7200 * 1000)
    assert engine_cost.Cost().cost_per_1k_requests is None


def test_busy_ratio_falls_back_to_tokens_then_to_one() -> None:
    tokens_only = factories.policy(spec={"signals": {
        "tokensPerSecond": {"capacityPerReplica": 2400}}})
    obs = factories.observation(ready=2, tokens_per_second=1200.0)
    assert service_state.busy_ratio(tokens_only, obs) == pytest.approx(0.25)
    queue_only = factories.policy(spec={"signals": {
        "queueDepth": {"targetWaitingPerReplica": 4}}})
    assert service_state.busy_ratio(queue_only, obs) == 1.0
    assert service_state.busy_ratio(tokens_only, factories.observation(ready=0)) == 0.0
    overloaded = factories.observation(ready=1, in_flight=500.0)
    assert service_state.busy_ratio(factories.policy(), overloaded) == 1.0


@pytest.mark.parametrize(
    ("current", "desired", "held", "outcome"),
    [(2, 3, False, "up"), (3, 2, False, "down"), (2, 2, False, "hold"), (2, 2, True, "held"),
     (2, 3, True, "up")],
)
def test_decision_outcomes(current: int, desired: int, held: bool, outcome: str) -> None:
    obs = factories.observation(current=current, desired=desired, held=held)
    assert service_state.decision_outcome(obs.decision) == outcome


def test_record_counts_and_accrues_between_evaluations() -> None:
    registry = factories.loaded_state(factories.policy())
    key = "inference/llama-70b"
    clamp = types.Clamp(name="max", before=20, after=16, detail="replicas.max")
    registry.record(key, factories.observation(ready=2, in_flight=96.0, clamps=(clamp,)))
    registry.record(key, factories.observation(at=factories.NOW + 1800, desired=2, current=2))
    registry.record_patch(key, "applied")
    registry.record_requests(key, 100)
    status = registry.status(key)
    assert status is not None
    assert status.decisions == {"up": 1, "hold": 1}
    assert status.clamps == {"max": 1}
    assert status.patches == {"applied": 1}
    assert status.cost.allocated_gpu_hours == pytest.approx(1.0)  # 2 GPUs for half an hour
    assert status.cost.requests == 100
    assert status.last is not None and status.last.at == factories.NOW + 1800


def test_policy_swap_keeps_history_and_drops_removed_models() -> None:
    registry = factories.loaded_state(factories.policy("a"), factories.policy("b"))
    registry.record("inference/a", factories.observation(model_name="inference/a"))
    newer = factories.policy("a", spec={"replicas": {"min": 2, "max": 4}})
    registry.set_policies([newer], status=service_state.PolicyLoadStatus(
        at=factories.NOW, policies=1,
        errors=(loader.PolicyError(path="b.yaml", document=0, field="spec", message="bad"),),
        kept=("inference/b",)))
    assert registry.keys() == ["inference/a"]
    status = registry.status("inference/a")
    assert status is not None and status.policy.spec.replicas.max == 4
    assert status.decisions == {"up": 1}
    assert registry.reloads == {"ok": 1, "invalid": 1}
    registry.record("inference/b", factories.observation())  # removed: ignored
    assert registry.status("inference/b") is None


def test_ready_needs_policies_and_leadership() -> None:
    registry = service_state.ServiceState()
    assert not registry.ready
    assert registry.not_ready_reasons() == ["policies not loaded yet", "leader state unknown"]
    registry.set_policies([], status=service_state.PolicyLoadStatus(at=0.0, policies=0))
    assert registry.not_ready_reasons() == ["leader state unknown"]
    registry.set_leader(False)  # a follower is ready: it keeps state warm
    assert registry.ready


def test_dropped_counters_and_lookup_by_name() -> None:
    registry = factories.loaded_state(factories.policy("m"),
                                      factories.policy("m", namespace="other"))
    registry.add_drop_counter("nats", lambda: {"malformed": 2, "stale": 1})
    assert registry.dropped() == {("nats", "malformed"): 2, ("nats", "stale"): 1}
    assert sorted(s.key for s in registry.find_by_name("m")) == ["inference/m", "other/m"]
    status = registry.status("other/m")
    assert status is not None
    assert status.labels == {"model": "m", "namespace": "other", "target": "m"}


def test_the_last_scale_outlives_the_decisions_after_it() -> None:
    # The status is written at the backstop tick's pace; a scale (2 -> 3) followed within
    # the tick by an unchanged decision (3 -> 3) must still reach lastScaleTime.
    policy = factories.policy()
    registry = factories.loaded_state(policy)
    registry.record(policy.key, factories.observation(current=2, desired=3))
    registry.record(policy.key, factories.observation(current=3, desired=3,
                                                      at=factories.NOW + 5))
    status = registry.status(policy.key)
    assert status is not None and status.last is not None
    assert status.last_scale_at == factories.NOW
    body = conditions.status(policy, status.last, problems=(), previous=None, generation=1,
                             now=factories.NOW + 10, last_scale_at=status.last_scale_at)
    assert body["lastScaleTime"] == timefmt.rfc3339(factories.NOW)
