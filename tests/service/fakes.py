"""Fakes at the cluster seam: a ClusterReader and ReplicaActuator over in-memory counts."""

from __future__ import annotations

import asyncio

from scaler.actuators import base as actuators
from scaler.engine import types
from scaler.policy import model


class FakeCluster:
    """ClusterReader and ReplicaActuator over in-memory replica counts.

    Applying a decision sets `current` (as a scale patch would); `gate`, when set, makes
    apply wait, so tests can hold an evaluation in flight.
    """

    def __init__(self, current: int = 2) -> None:
        self.current: dict[str, int] = {}
        self.default = current
        self.reads = 0
        self.applied: list[types.Decision] = []
        self.outcomes: list[actuators.Outcome] = []
        self.gate: asyncio.Event | None = None
        self.fail_reads: set[str] = set()

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState:
        self.reads += 1
        if policy.key in self.fail_reads:
            raise ConnectionError("API server unreachable")
        current = self.current.get(policy.key, self.default)
        return types.ClusterState(current=current, ready=current, free_replica_slots=100)

    async def apply(self, policy: model.ScalePolicy, decision: types.Decision
                    ) -> actuators.ApplyOutcome:
        if self.gate is not None:
            await self.gate.wait()
        self.applied.append(decision)
        outcome = self.outcomes.pop(0) if self.outcomes else actuators.Outcome.APPLIED
        if outcome is actuators.Outcome.APPLIED:
            self.current[policy.key] = decision.desired
        return actuators.ApplyOutcome(outcome, policy.key, decision.current, decision.desired)
