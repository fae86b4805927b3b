"""`static-peak`: the oracle's peak replica count held from start to end (no autoscaler)."""

from __future__ import annotations

from dataclasses import dataclass

from scaler.sim import cluster as sim_cluster


@dataclass(slots=True)
class StaticPeak:
    """What a user without an autoscaler provisions: enough for the busiest minute, always.

    `replicas` is the largest count the oracle's schedule holds; the run starts with them
    ready (`initial_replicas`), so the reference pays no cold start.
    """

    replicas: int
    period_s: float = 60.0
    name: str = "static-peak"

    @property
    def initial_replicas(self) -> int:
        return self.replicas

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        return self.replicas
