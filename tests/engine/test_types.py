"""The engine types' fast paths agree with what they stand in for."""

from __future__ import annotations

import dataclasses

from scaler.engine import types


def _every_field_set() -> types.EngineState:
    """A state whose every field differs from its default, so a field the copy missed
    would show."""
    values: dict[str, object] = {}
    for index, spec in enumerate(dataclasses.fields(types.EngineState)):
        default = spec.default
        if isinstance(default, tuple):
            values[spec.name] = (types.Recommendation(at=float(index), replicas=index),)
        elif isinstance(default, bool):
            values[spec.name] = not default
        elif isinstance(default, int):
            values[spec.name] = default + index + 1
        else:  # floats and None-defaulted floats
            values[spec.name] = float(index) + 0.5
    state = types.EngineState(**values)  # type: ignore[arg-type]
    for spec in dataclasses.fields(types.EngineState):
        assert getattr(state, spec.name) != spec.default, spec.name
    return state


def test_remembering_is_replace_of_the_windows_and_count() -> None:
    state = _every_field_set()
    windows = {
        "recommendations": (types.Recommendation(at=9.0, replicas=3, load=2),),
        "events": (types.ScaleEvent(at=9.0, delta=1),),
        "demand": (types.DemandSample(at=9.0, demand=2.5),),
        "backlog": (types.BacklogSample(at=9.0, requests=12.0, completion_rate=4.0),),
        "last_desired": 3,
    }
    remembered = state.remembering(**windows)  # type: ignore[arg-type]
    expected = dataclasses.replace(state, **windows)  # type: ignore[arg-type]
    assert remembered == expected
    assert repr(remembered) == repr(expected)
    assert hash(remembered) == hash(expected)
    assert state.last_desired != 3  # the original is left alone


def test_with_budget_is_replace_of_the_budget() -> None:
    cluster = types.ClusterState(
        current=4, ready=3, starting=(1.0,), free_replica_slots=2,
        observations=(types.ColdStartObservation(created_at=1.0, ready_at=9.0),),
        budget_gpus=64, budget_reason="before", busy_replicas=1, excluded_gpus=2,
        capacity_notes=("node gpu-3: 2 of 8 GPUs excluded",), gpu_sm_active=0.4)
    capped = cluster.with_budget(16, "capped by tenant search: 16 of 16 GPUs")
    expected = dataclasses.replace(cluster, budget_gpus=16,
                                   budget_reason="capped by tenant search: 16 of 16 GPUs")
    assert capped == expected
    assert repr(capped) == repr(expected)
    assert cluster.budget_gpus == 64


def test_rule_kinds() -> None:
    kinds = {rule: rule.kind for rule in types.Rule}
    assert kinds.pop(types.Rule.QUEUE_DEPTH) is types.OpinionKind.PRESSURE
    assert kinds.pop(types.Rule.P95_LATENCY) is types.OpinionKind.GUARD
    assert set(kinds.values()) == {types.OpinionKind.CAPACITY}
