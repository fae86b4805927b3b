"""KEDA: a Prometheus trigger on waiting requests, fed to an HPA as an External metric."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim.strategies import hpa


def external_per_pod_replicas(*, status: int, metric: float, target: float,
                              tolerance: float) -> int:
    """The HPA's GetExternalPerPodMetricReplicas (External metric, AverageValue target).

    ceil(metric / target), unless metric / (target x pods) is within tolerance of 1.
    Example: 23 waiting, threshold 5, 2 pods: 23 / 10 = 2.3 -> ceil(4.6) = 5.
    """
    pods = max(status, 1)
    ratio = metric / (target * pods)
    if abs(1.0 - ratio) <= tolerance:
        return pods
    return math.ceil(metric / target - 1e-9)


@dataclass(slots=True)
class Keda:
    """KEDA ScaledObject with a Prometheus trigger on waiting requests, threshold 5.

    KEDA feeds `sum(vllm:num_requests_waiting)` to an HPA as an External metric with an
    AverageValue target of 5: replicas = ceil(waiting / 5), unless within the 10 %
    tolerance of the current pod count (GetExternalPerPodMetricReplicas). Prometheus
    scrapes every 15 s, so the value is the queue at the last scrape. With min 0, KEDA
    itself scales to 0 after cooldownPeriod (300 s) without activity and back to 1 on
    the first poll that sees any.
    """

    policy: policy_model.ScalePolicy
    threshold: float = 5.0
    polling_s: float = 15.0
    scrape_s: float = 15.0
    cooldown_s: float = 300.0
    config: hpa.HpaConfig = field(default_factory=hpa.HpaConfig)
    controller: hpa.HpaController = field(init=False)
    last_active: float = 0.0
    name: str = "keda"

    def __post_init__(self) -> None:
        self.controller = hpa.HpaController(self.policy, self.config)

    @property
    def period_s(self) -> float:
        return self.polling_s

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        scraped_at = math.floor(now / self.scrape_s) * self.scrape_s
        waiting = float(cluster.history.waiting[cluster.index(scraped_at)])
        current = cluster.spec_replicas
        if waiting > 0:
            self.last_active = now
        if self.policy.spec.replicas.min == 0:
            if current == 0:
                return 1 if waiting > 0 else 0
            if now - self.last_active >= self.cooldown_s:
                return 0
        proposal = external_per_pod_replicas(
            status=len(cluster.replicas()), metric=waiting, target=self.threshold,
            tolerance=self.config.tolerance)
        return self.controller.normalize(current=current, proposal=proposal, now=now)
