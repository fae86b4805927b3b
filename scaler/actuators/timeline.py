"""Pure readings of pods and nodes: start timelines, cold-start observations, GPU capacity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scaler.actuators import selectors, timefmt
from scaler.engine import types

Obj = Mapping[str, Any]

PLACEHOLDER_LABEL = "scaler.io/placeholder"


def _count(value: object) -> int:
    """An extended-resource quantity ('8', 8, '8.0') as a whole count; 0 if unreadable."""
    try:
        return int(float(str(value)))
    except ValueError:
        return 0


def condition(obj: Obj, kind: str) -> Obj | None:
    """The status condition of type `kind` (Ready, PodScheduled...), or None."""
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def is_true(obj: Obj, kind: str) -> bool:
    return (condition(obj, kind) or {}).get("status") == "True"


def _true_since(obj: Obj, kind: str) -> float | None:
    found = condition(obj, kind)
    if found is None or found.get("status") != "True":
        return None
    return timefmt.parse_time(found.get("lastTransitionTime"))


def extended_requests(pod: Obj) -> dict[str, int]:
    """Extended resources (nvidia.com/gpu, MIG profiles) a pod's containers request.

    Extended resources cannot be overcommitted, so requests equal limits; a container
    that sets only limits gets requests from them, as the API server defaults it.
    """
    total: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            if "/" in name:
                total[name] = total.get(name, 0) + _count(value)
    return total


@dataclass(frozen=True, slots=True)
class PodTimeline:
    """A pod's start, from its own status: created -> scheduled -> containers started -> Ready.

    Times are epoch seconds with the API's whole-second precision; None = not yet (or not
    stamped: `ready` is the Ready condition itself).
    """

    uid: str
    namespace: str
    name: str
    labels: dict[str, str]
    node_name: str | None
    created_at: float
    scheduled_at: float | None
    started_at: float | None
    ready_at: float | None
    ready: bool
    terminating: bool
    finished: bool
    requests: dict[str, int] = field(default_factory=dict)
    # spec.terminationGracePeriodSeconds (the API server defaults it to 30); None when
    # absent or not a whole number of seconds >= 0
    grace_period_s: float | None = None

    @property
    def placeholder(self) -> bool:
        return self.labels.get(PLACEHOLDER_LABEL) == "true"

    @property
    def live(self) -> bool:
        """Counts as a replica: not finished and not on its way out."""
        return not self.finished and not self.terminating


def pod_timeline(pod: Obj) -> PodTimeline:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    started = [
        timefmt.parse_time(((s.get("state") or {}).get("running") or {}).get("startedAt"))
        for s in status.get("containerStatuses") or []
    ]
    started_known = [s for s in started if s is not None]
    return PodTimeline(
        uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        node_name=(pod.get("spec") or {}).get("nodeName") or None,
        created_at=timefmt.parse_time(meta.get("creationTimestamp")) or 0.0,
        scheduled_at=_true_since(pod, "PodScheduled"),
        # The pod started when its last container did (a sidecar may start first).
        started_at=max(started_known) if started_known else None,
        ready_at=_true_since(pod, "Ready"),
        ready=is_true(pod, "Ready"),
        terminating=bool(meta.get("deletionTimestamp")),
        finished=status.get("phase") in ("Succeeded", "Failed"),
        requests=extended_requests(pod),
        grace_period_s=_grace_period(pod),
    )


def _grace_period(pod: Obj) -> float | None:
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return float(value)


def cold_start(timeline: PodTimeline, *, node_created_at: float | None
               ) -> types.ColdStartObservation | None:
    """The observation a Ready pod gives, or None if it is not Ready yet.

    The node-boot part is the wait for scheduling when the pod's node was created after the
    pod (it was brought up for it): pod created 10:00:00, node created 10:00:40, scheduled
    10:04:10, Ready 10:06:10 -> node_boot_s 250 and pod_start_s 120.
    """
    if timeline.ready_at is None:
        return None
    node_boot = 0.0
    if (node_created_at is not None and timeline.scheduled_at is not None
            and node_created_at > timeline.created_at):
        node_boot = max(0.0, timeline.scheduled_at - timeline.created_at)
    return types.ColdStartObservation(
        created_at=timeline.created_at, ready_at=timeline.ready_at, node_boot_s=node_boot)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    ready: bool
    cordoned: bool
    allocatable: dict[str, int]
    created_at: float | None
    # status.capacity: devices the plugin found, healthy or not (allocatable = healthy ones)
    capacity: dict[str, int] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """Capacity only counts on nodes that are Ready and not cordoned."""
        return self.ready and not self.cordoned


def node_info(node: Obj) -> NodeInfo:
    meta = node.get("metadata") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    return NodeInfo(
        name=str(meta.get("name") or ""),
        labels=dict(meta.get("labels") or {}),
        ready=is_true(node, "Ready"),
        cordoned=bool((node.get("spec") or {}).get("unschedulable")),
        allocatable={k: _count(v) for k, v in allocatable.items() if "/" in k},
        created_at=timefmt.parse_time(meta.get("creationTimestamp")),
        capacity={k: _count(v) for k, v in capacity.items() if "/" in k},
    )


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """GPUs of one pool. Only healthy nodes count; placeholder pods count as free, since
    real replicas preempt them.

    free_replica_slots: sum over healthy nodes of floor(free GPUs / GPUs per replica): two
    nodes with 3 and 5 free GPUs hold 0 + 1 replicas of 4 GPUs, not 2.
    """

    resource_name: str
    nodes: int
    healthy_nodes: int
    unhealthy: tuple[str, ...]
    allocatable_gpus: int
    used_gpus: int
    free_replica_slots: int

    @property
    def free_gpus(self) -> int:
        return self.allocatable_gpus - self.used_gpus


def pool_capacity(*, nodes: Iterable[NodeInfo], pods: Iterable[PodTimeline],
                  node_selector: Mapping[str, str], resource_name: str,
                  gpus_per_replica: int) -> PoolCapacity:
    selector = selectors.Selector(tuple(
        selectors.Requirement(k, "=", frozenset({v})) for k, v in sorted(node_selector.items())))
    members = [n for n in nodes if selector.matches(n.labels)
               and (node_selector or n.allocatable.get(resource_name, 0) > 0)]
    used: dict[str, int] = {}
    for pod in pods:
        if pod.node_name and pod.live and not pod.placeholder:
            used[pod.node_name] = used.get(pod.node_name, 0) + pod.requests.get(resource_name, 0)
    healthy = [n for n in members if n.healthy]
    allocatable = sum(n.allocatable.get(resource_name, 0) for n in healthy)
    in_use = sum(min(used.get(n.name, 0), n.allocatable.get(resource_name, 0)) for n in healthy)
    slots = sum(
        max(0, n.allocatable.get(resource_name, 0) - used.get(n.name, 0)) // gpus_per_replica
        for n in healthy
    )
    return PoolCapacity(
        resource_name=resource_name, nodes=len(members), healthy_nodes=len(healthy),
        unhealthy=tuple(sorted(n.name for n in members if not n.healthy)),
        allocatable_gpus=allocatable, used_gpus=in_use, free_replica_slots=slots,
    )
