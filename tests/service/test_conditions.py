"""ScalePolicy status conditions (pure): HPA reasons from the decision's clamps, and a
lastTransitionTime that moves only when a condition's status does."""

from __future__ import annotations

import pytest

from scaler.engine import types
from scaler.policy import loader
from scaler.service import conditions, explain

from . import factories


def _by_type(status: conditions.Status) -> dict[str, dict[str, str]]:
    return {item["type"]: item for item in status["conditions"]}


@pytest.mark.parametrize(("clamp", "status", "reason"), [
    (None, "False", "DesiredWithinRange"),
    (types.ClampName.MAX, "True", "TooManyReplicas"),
    (types.ClampName.BUDGET, "True", "TooManyReplicas"),
    (types.ClampName.MIN, "True", "TooFewReplicas"),
    (types.ClampName.WARM_FLOOR, "True", "TooFewReplicas"),
    (types.ClampName.RATE_LIMIT_UP, "True", "ScaleUpLimit"),
    (types.ClampName.RATE_LIMIT_DOWN, "True", "ScaleDownLimit"),
])
def test_scaling_limited_names_the_bound(clamp: types.ClampName | None, status: str,
                                         reason: str) -> None:
    clamps = () if clamp is None else (types.Clamp(clamp, before=20, after=16, detail=""),)
    found = conditions.status(factories.policy(), factories.observation(clamps=clamps),
                              problems=(), previous=None, generation=1, now=factories.NOW)
    limited = _by_type(found)["ScalingLimited"]
    assert (limited["status"], limited["reason"]) == (status, reason)


def test_a_down_window_is_reported_as_stabilized_and_disabled_both_ways_as_backoff() -> None:
    held = (types.Clamp(types.ClampName.STABILIZATION_DOWN, before=2, after=4, detail=""),)
    found = conditions.status(factories.policy(), factories.observation(clamps=held),
                              problems=(), previous=None, generation=1, now=factories.NOW)
    assert _by_type(found)["AbleToScale"]["reason"] == "ScaleDownStabilized"
    disabled = factories.policy(spec={"behavior": {
        "scaleUp": {"stabilizationSeconds": 0, "selectPolicy": "Disabled"},
        "scaleDown": {"stabilizationSeconds": 0, "selectPolicy": "Disabled"}}})
    found = conditions.status(disabled, factories.observation(), problems=(), previous=None,
                              generation=1, now=factories.NOW)
    able = _by_type(found)["AbleToScale"]
    assert (able["status"], able["reason"]) == ("False", "BackoffBoth")


def test_last_transition_time_moves_only_with_the_status() -> None:
    policy = factories.policy()
    first = conditions.status(policy, factories.observation(), problems=(), previous=None,
                              generation=1, now=factories.NOW)
    at_max = (types.Clamp(types.ClampName.MAX, before=20, after=16, detail=""),)
    later = factories.NOW + 60
    second = conditions.status(policy, factories.observation(clamps=at_max, at=later),
                               problems=(), previous=first, generation=1, now=later)
    before, after = _by_type(first), _by_type(second)
    assert after["ScalingLimited"]["lastTransitionTime"] == "2025-11-29T09:54:20Z"
    assert after["PolicyValid"]["lastTransitionTime"] == before["PolicyValid"][
        "lastTransitionTime"] == "2025-11-29T09:53:20Z"
    # A new message with the same status and reason keeps the time, and is no transition.
    third = conditions.status(policy, factories.observation(clamps=at_max, desired=5,
                                                            at=later + 5),
                              problems=(), previous=second, generation=1, now=later + 5)
    assert _by_type(third)["ScalingLimited"]["lastTransitionTime"] == "2025-11-29T09:54:20Z"
    assert not conditions.transitions(second, third)
    assert conditions.transitions(first, second)


def test_invalid_and_stale_are_reported_with_their_causes() -> None:
    policy = factories.policy()
    stale = factories.observation(age_s=45.0)
    stale = type(stale)(decision=types.Decision(
        model=policy.key, at=factories.NOW, current=2, desired=2, recommendation=None,
        winner=None, signals=(types.SignalReason(
            name=types.Rule.CONCURRENCY, value=30.0, age_s=45.0, fresh=False,
            recommendation=None, detail="in flight stale"),), held=True),
        snapshot=stale.snapshot, cluster=stale.cluster, at=factories.NOW)
    problem = loader.PolicyError(path="scalepolicies/inference/llama-70b", document=0,
                                 field="spec.replicas", message="min (9) is greater than max")
    found = _by_type(conditions.status(policy, stale, problems=[problem], previous=None,
                                       generation=2, now=factories.NOW))
    assert (found["SignalsFresh"]["status"], found["SignalsFresh"]["reason"]) == (
        "False", "SignalsStale")
    assert "concurrency 45 s old (staleAfterSeconds 30)" in found["SignalsFresh"]["message"]
    assert (found["ScalingActive"]["status"], found["ScalingActive"]["reason"]) == (
        "False", "NoFreshSignal")
    assert found["PolicyValid"]["reason"] == "InvalidSpec"
    assert "last good version stays in force" in found["PolicyValid"]["message"]
    assert "min (9) is greater than max" in found["PolicyValid"]["message"]


def test_a_file_policy_shows_the_same_conditions_in_explain() -> None:
    policy = factories.policy()
    service = factories.loaded_state(policy)
    at_max = (types.Clamp(types.ClampName.MAX, before=20, after=16, detail=""),)
    service.record(policy.key, factories.observation(clamps=at_max))
    status = service.status(policy.key)
    assert status is not None and status.last is not None
    document = explain.decision_document(status, status.last)
    limited = next(c for c in document["conditions"] if c["type"] == "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "TooManyReplicas")
    assert "PolicyValid" not in {c["type"] for c in document["conditions"]}
    assert "  ScalingLimited  True    TooManyReplicas: " in explain.describe(document)
