"""Builders for engine tests: policies from dicts, snapshots, and a timeline runner."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from scaler.engine import decide as engine_decide
from scaler.engine import types
from scaler.policy import model

# 2026-11-30 is a Monday; 06:00 UTC = 07:00 in Berlin (CET).
MONDAY_0600_UTC = 1796018400.0

BASE: dict[str, Any] = {
    "apiVersion": "scaler.io/v1alpha1",
    "kind": "ScalePolicy",
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {
        "target": {"name": "m"},
        "replicas": {"min": 1, "max": 20},
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "behavior": {
            "scaleUp": {"stabilizationSeconds": 0, "policies": []},
            "scaleDown": {"stabilizationSeconds": 300, "policies": []},
        },
        "coldStart": {"nodeBootSeconds": 0, "imagePullSeconds": 30, "modelLoadSeconds": 20,
                      "readinessSeconds": 10, "learn": False},
        "forecast": {"enabled": False},
        "staleAfterSeconds": 30,
    },
}


# A pod start of 120 s: the sawtooth's climb (`sawtooth_running`) reaches half its top 156 s
# after each drop, within a restart and its slack (120 + 60 s): a dip, no return to plan.
SLOW_START = {**BASE["spec"]["coldStart"], "imagePullSeconds": 90}


def sawtooth_running(t: float, *, period: int = 300) -> float:
    """Running requests of a sawtooth at `t`: 10 -> 100 over 240 s from each period's
    start, then 10 until the period ends (10 per replica at the tests' concurrency)."""
    into = t % period
    return 10.0 + 90.0 * into / 240 if into < 240 else 10.0


def policy(**spec_overrides: Any) -> model.ScalePolicy:
    """BASE with spec keys replaced (shallow: each given key replaces BASE's value)."""
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec_overrides)
    return model.ScalePolicy.model_validate(doc)


def value(v: float, *, age: float = 0.0, stale_after_s: float = 30.0) -> types.SignalValue:
    """A signal value with its freshness decided as the store does (BASE: 30 s limit)."""
    return types.SignalValue.assess(v, age_s=age, stale_after_s=stale_after_s)


def snap(*, running: float | None = None, waiting: float | None = None,
         tps: float | None = None, p95: float | None = None, age: float = 0.0
         ) -> types.SignalSnapshot:
    def given(v: float | None) -> types.SignalValue | None:
        return None if v is None else value(v, age=age)

    return types.SignalSnapshot(queue_depth=given(waiting), in_flight=given(running),
                                tokens_per_second=given(tps), p95_latency=given(p95))


@dataclass
class Sim:
    """Applies each decision at once, as the service does after a successful patch.

    Replicas become ready `ready_after` seconds after they are added, so starting
    replicas can be observed.
    """

    policy: model.ScalePolicy
    current: int = 1
    ready_after: float = 0.0
    start: float = MONDAY_0600_UTC
    state: types.EngineState = field(default_factory=types.EngineState)
    starts: list[float] = field(default_factory=list)
    last: types.Decision | None = None

    def __post_init__(self) -> None:
        self.starts = [self.start - 10_000.0] * self.current

    def cluster(self, now: float) -> types.ClusterState:
        ready = sum(1 for s in self.starts if now - s >= self.ready_after)
        starting = tuple(s for s in self.starts if now - s < self.ready_after)
        return types.ClusterState(current=self.current, ready=ready, starting=starting)

    def step(self, t: float, snapshot: types.SignalSnapshot, **cluster: Any) -> int:
        now = self.start + t
        state = self.cluster(now)
        if cluster:
            state = types.ClusterState(**{**_fields(state), **cluster})
        decision, self.state = engine_decide.decide(self.policy, snapshot=snapshot,
                                                    cluster=state, state=self.state, now=now)
        self.last = decision
        if decision.desired > self.current:
            self.starts.extend([now] * (decision.desired - self.current))
        else:
            self.starts = self.starts[: decision.desired]
        self.current = decision.desired
        return decision.desired


def _fields(state: types.ClusterState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in state.__slots__}
