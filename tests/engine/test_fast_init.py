"""`types.fast_init` builds the same objects as the frozen dataclass `__init__` it replaces."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from scaler.engine import forecast, recommend, types

# Twins: the dataclass `__init__`, and the same class built by fast_init.
FIELDS: list[tuple[str, Any] | tuple[str, Any, Any]] = [
    ("name", str), ("count", int), ("share", float, dataclasses.field(default=0.5)),
    ("notes", tuple, dataclasses.field(default=())),
    ("reason", object, dataclasses.field(default=None)),
]
Plain = dataclasses.make_dataclass("Plain", FIELDS, frozen=True, slots=True)
Fast = types.fast_init(dataclasses.make_dataclass("Fast", FIELDS, frozen=True, slots=True))


CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    (("a", 1), {}),
    (("a", 1, 0.25), {}),
    (("a",), {"count": 2, "reason": "why"}),
    ((), {"name": "b", "count": 3, "notes": ("x",), "share": 1.0}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_same_fields_repr_and_equality_as_the_dataclass_init(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    plain, fast = Plain(*args, **kwargs), Fast(*args, **kwargs)
    assert repr(fast) == repr(plain).replace("Plain(", "Fast(", 1)
    assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
    assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
    assert hash(fast) == hash(Fast(*args, **kwargs))
    assert fast == Fast(*args, **kwargs)
    assert dataclasses.replace(fast, count=9) == Fast(**{**dataclasses.asdict(fast), "count": 9})


def test_same_signature_and_errors_as_the_dataclass_init() -> None:
    plain, fast = inspect.signature(Plain), inspect.signature(Fast)
    assert [(p.name, p.kind, p.default) for p in fast.parameters.values()] == [
        (p.name, p.kind, p.default) for p in plain.parameters.values()]
    for bad_args, bad_kwargs in [(("a",), {}), (("a", 1), {"name": "b"}),
                                 (("a", 1), {"colour": "red"}),
                                 (("a", 1, 0.5, (), None, "extra"), {})]:
        with pytest.raises(TypeError):
            Plain(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError):
            Fast(*bad_args, **bad_kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fast("a", 1).count = 2


def test_the_engine_classes_take_their_fields_in_order_with_their_defaults() -> None:
    """Every class built the fast way: its parameters are its fields, as the dataclass
    `__init__` takes them (a field added later cannot be skipped or reordered)."""
    classes = [types.SignalValue, types.SignalSnapshot, types.ClusterState,
               types.Recommendation, types.ScaleEvent, types.DemandSample,
               types.BacklogSample, types.ForecastCheck, types.EngineState, types.Step,
               types.SignalReason, types.Clamp, types.Forecast, types.Decision,
               recommend.Opinion, forecast.StartTimes, forecast.Trend]
    for cls in classes:
        assert cls.__dict__["__init__"].__qualname__ == f"{cls.__qualname__}.__init__"
        parameters = list(inspect.signature(cls).parameters.values())
        fields = dataclasses.fields(cls)
        assert [p.name for p in parameters] == [f.name for f in fields], cls
        assert [p.default for p in parameters] == [
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            for f in fields], cls


def test_refuses_what_it_cannot_copy() -> None:
    with pytest.raises(TypeError, match="items"):
        @types.fast_init
        @dataclasses.dataclass(frozen=True, slots=True)
        class WithFactory:
            items: list[int] = dataclasses.field(default_factory=list)
