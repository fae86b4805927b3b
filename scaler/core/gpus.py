"""GPU health and activity as dcgm-exporter reports them, shared by signals and actuators."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application, not the GPU (graphics engine exception, MMU fault, a
stopped or preempted channel...): the NVIDIA device plugin does not mark a GPU unhealthy
for them (its `applicationErrorXids`), and neither does the scaler."""


@dataclass(frozen=True, slots=True)
class GpuFault:
    """One GPU that cannot serve: its node (the exporter's `Hostname`), index and UUID, the
    XID codes seen in the window and the double-bit ECC errors added in it."""

    node: str
    gpu: str
    uuid: str = ""
    xids: tuple[int, ...] = ()
    dbe_errors: float = 0.0

    @property
    def reason(self) -> str:
        """'XID 79', 'XID 48, 79', 'double-bit ECC' or both, for the explanation."""
        parts = []
        if self.xids:
            parts.append("XID " + ", ".join(str(x) for x in self.xids))
        if self.dbe_errors > 0:
            parts.append("double-bit ECC")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """One reading of the DCGM exporter through Prometheus, taken at wall time `at`.

    faults: the GPUs with health errors, sorted by node and GPU index.
    gpus_per_node: how many GPUs the exporter reports per node (every GPU exports its XID
      gauge, 0 without error), for MIG pools where one GPU holds several devices.
    sm_active: mean SM-active ratio (0..1) of each pod's GPUs, by (namespace, pod).
    """

    at: float
    faults: tuple[GpuFault, ...] = ()
    gpus_per_node: Mapping[str, int] = field(default_factory=dict)
    sm_active: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def faults_on(self, node: str) -> tuple[GpuFault, ...]:
        return tuple(f for f in self.faults if f.node == node)
