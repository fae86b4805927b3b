"""Protocols the service calls to read and change a cluster (a simulated cluster too)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scaler.engine import types
from scaler.policy import model


class Outcome(enum.StrEnum):
    """What an actuator did with a decision or a node plan."""

    APPLIED = "applied"  # the change was written
    UNCHANGED = "unchanged"  # desired equals what the cluster has: nothing was written
    # spec.replicas changed under us (another writer): re-read and re-decide. A write of
    # status alone (a controller's, moving only the resourceVersion) is never a conflict.
    CONFLICT = "conflict"
    SKIPPED_HPA_OWNED = "skipped_hpa_owned"  # an HPA or KEDA ScaledObject owns the target
    NOT_LEADER = "not_leader"  # another replica holds the Lease: only the leader writes
    DRY_RUN = "dry_run"  # computed and logged; nothing was written
    FAILED = "failed"  # gave up after the retry settings; the reason says why


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """The result of one apply.

    previous: replicas (or nodes, placeholder pods) the cluster had when we read it;
      None when it could not be read.
    desired: what we wanted (after clamping, e.g. to a MachineDeployment's max).
    reason: one line for logs and the audit trail.
    owner: the HPA or KEDA ScaledObject that scales the target (SKIPPED_HPA_OWNED), as
      'HorizontalPodAutoscaler/<name>'; None otherwise.
    """

    outcome: Outcome
    target: str
    previous: int | None
    desired: int
    reason: str = ""
    owner: str | None = None

    @property
    def written(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def left_to_owner(self, decision: types.Decision) -> bool:
        """A part of a mix its HPA owns that the mix (`decision`) leaves as it is: not
        written, and no refusal (`KubeReplicaActuator.apply_all`, `service.variants`)."""
        return self.owner is not None and not decision.changed


@runtime_checkable
class ClusterReader(Protocol):
    """What the engine needs to know about a policy's target, read from the cluster."""

    async def read(self, policy: model.ScalePolicy) -> types.ClusterState: ...


@runtime_checkable
class PodNamer(Protocol):
    """A cluster reader that names the live pods of a policy's target (those its latest
    `read` counted as replicas), and the ready ones among them; None when it cannot."""

    def pod_names(self, policy: model.ScalePolicy) -> frozenset[str] | None: ...

    def ready_pod_names(self, policy: model.ScalePolicy) -> frozenset[str] | None: ...


@runtime_checkable
class VariantBusyReader(Protocol):
    """A cluster reader that counts one variant's replicas reporting unfinished work:
    `view` is `policy` as that variant, read just before; None = no such count."""

    def variant_busy(self, policy: model.ScalePolicy, view: model.ScalePolicy) -> int | None: ...


@runtime_checkable
class ReplicaActuator(Protocol):
    """Writes a decision's replicas to the target's scale subresource (or would, in dry-run)."""

    async def apply(self, policy: model.ScalePolicy, decision: types.Decision) -> ApplyOutcome: ...


@runtime_checkable
class MixActuator(Protocol):
    """Writes several targets' decisions as one change (a model's variants): every target
    is checked (leader, owner, replicas as decided on) before any is written, so a refusal
    found by the checks writes none. One outcome per part, in order."""

    async def apply_all(self, parts: Sequence[tuple[model.ScalePolicy, types.Decision]]
                        ) -> list[ApplyOutcome]: ...


@runtime_checkable
class NodePoolActuator(Protocol):
    """Makes a node pool match a NodePlan (placeholder pods, Cluster API, ...)."""

    async def apply(self, pool: model.NodePool, plan: types.NodePlan) -> ApplyOutcome: ...


@runtime_checkable
class LeaderElector(Protocol):
    """Only the leader writes. `is_leader` must turn False before another replica can take
    over, so two replicas never both believe they lead."""

    @property
    def identity(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    async def run(self) -> None:
        """Acquire and renew until cancelled."""

    async def release(self) -> None:
        """Give the lease up (on shutdown), so another replica takes over at once."""


class AlwaysLeader:
    """A LeaderElector for a single replica, the simulator and tests without a Lease."""

    def __init__(self, identity: str = "single") -> None:
        self._identity = identity

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def is_leader(self) -> bool:
        return True

    async def run(self) -> None:
        return None

    async def release(self) -> None:
        return None
