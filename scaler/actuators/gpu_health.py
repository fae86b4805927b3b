"""Pure: GPUs with DCGM health errors leave a node's capacity, with a one-line reason per node."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from scaler.actuators import timeline
from scaler.core import gpus

MIG_MARKER = "/mig-"  # nvidia.com/mig-1g.10gb: one GPU holds several such devices


@dataclass(frozen=True, slots=True)
class NodeExclusion:
    """Devices of a node not counted because GPUs on it have health errors."""

    node: str
    excluded: int
    of: int
    faults: tuple[gpus.GpuFault, ...]

    @property
    def text(self) -> str:
        """'node gpu-3: 2 of 8 GPUs excluded: XID 79 on GPU 5, 6' (faults grouped by reason)."""
        by_reason: dict[str, list[str]] = {}
        for fault in self.faults:
            by_reason.setdefault(fault.reason, []).append(fault.gpu)
        why = "; ".join(f"{reason} on GPU {', '.join(ids)}" for reason, ids in by_reason.items())
        return f"node {self.node}: {self.excluded} of {self.of} GPUs excluded: {why}"


def excluded_devices(*, faulty: int, allocatable: int, capacity: int, resource_name: str,
                     gpus_on_node: int | None) -> int:
    """How many of a node's `allocatable` devices the `faulty` GPUs take out.

    Whole GPUs: one each. A MIG profile: the faulty GPUs' share of the node's devices,
    rounded up (8 GPUs with 56 mig-1g.10gb devices, 2 faulty: ceil(56 x 2 / 8) = 14).
    Devices the device plugin already removed from allocatable (capacity - allocatable: it
    marks GPUs unhealthy on XIDs too) are not taken twice: capacity 8, allocatable 7, two
    faulty GPUs -> 1 more excluded.
    """
    if faulty <= 0 or allocatable <= 0:
        return 0
    share = faulty
    if MIG_MARKER in resource_name and gpus_on_node:
        share = math.ceil(max(capacity, allocatable) * faulty / gpus_on_node)
    already_out = max(0, capacity - allocatable)
    return min(allocatable, max(0, share - already_out))


def exclude_faulty(nodes: Iterable[timeline.NodeInfo], telemetry: gpus.GpuTelemetry | None,
                   *, resource_name: str
                   ) -> tuple[list[timeline.NodeInfo], tuple[NodeExclusion, ...]]:
    """The nodes with faulty GPUs taken out of `resource_name`'s allocatable, and why.

    Only nodes that count at all (Ready, not cordoned) get an exclusion: an unhealthy
    node's GPUs are already out, all of them.
    """
    out: list[timeline.NodeInfo] = []
    exclusions: list[NodeExclusion] = []
    for node in nodes:
        faults = telemetry.faults_on(node.name) if telemetry is not None else ()
        allocatable = node.allocatable.get(resource_name, 0)
        excluded = 0
        if faults and node.healthy:
            excluded = excluded_devices(
                faulty=len(faults), allocatable=allocatable,
                capacity=node.capacity.get(resource_name, allocatable),
                resource_name=resource_name,
                gpus_on_node=telemetry.gpus_per_node.get(node.name) if telemetry else None)
        if excluded == 0:
            out.append(node)
            continue
        exclusions.append(NodeExclusion(node=node.name, excluded=excluded, of=allocatable,
                                        faults=faults))
        out.append(dataclasses.replace(
            node, allocatable={**node.allocatable, resource_name: allocatable - excluded}))
    return out, tuple(sorted(exclusions, key=lambda e: e.node))
