"""HorizontalPodAutoscaler v2 on GPU utilisation, with its replica calculator and behaviors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scaler.engine import stabilize as engine_stabilize
from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster


@dataclass(frozen=True, slots=True)
class HpaConfig:
    """HorizontalPodAutoscaler v2 defaults (kube-controller-manager and autoscaling/v2).

    sync_s: --horizontal-pod-autoscaler-sync-period, 15 s.
    tolerance: --horizontal-pod-autoscaler-tolerance, 0.1 (no change within 10 %).
    behavior: the autoscaling/v2 default behavior: up max(4 pods, 100 %) per 15 s with no
      window; down 100 % per 15 s after a 300 s stabilization window.
    """

    sync_s: float = 15.0
    tolerance: float = 0.1
    behavior: policy_model.Behavior = field(default_factory=policy_model.Behavior)


@dataclass(slots=True)
class HpaController:
    """The HPA's replica calculator plus behaviors, fed one metric.

    Stabilization and rate limits are the engine's `stabilize` module, which implements the
    HPA's algorithm (normalizeDesiredReplicasWithBehaviors) with the HPA defaults here.
    """

    policy: policy_model.ScalePolicy
    config: HpaConfig = field(default_factory=HpaConfig)
    recommendations: list[engine_types.Recommendation] = field(default_factory=list)
    events: list[engine_types.ScaleEvent] = field(default_factory=list)

    def normalize(self, *, current: int, proposal: int, now: float) -> int:
        behavior = self.config.behavior
        if not self.recommendations:
            self.recommendations.append(engine_types.Recommendation(at=now, replicas=current))
        desired = engine_stabilize.stabilize(behavior, current=current, recommendation=proposal,
                                             history=self.recommendations, now=now)
        keep = max(behavior.scale_up.stabilization_seconds,
                   behavior.scale_down.stabilization_seconds)
        self.recommendations = [r for r in self.recommendations if r.at > now - keep]
        self.recommendations.append(engine_types.Recommendation(at=now, replicas=proposal))
        if desired != current:
            up = desired > current
            direction = behavior.scale_up if up else behavior.scale_down
            limit = engine_stabilize.rate_limit(direction, up=up, current=current,
                                                events=self.events, now=now)
            if limit is not None:
                desired = min(desired, max(limit, current)) if up else max(
                    desired, min(limit, current))
        # The HPA never goes below 1 (minReplicas >= 1 unless HPAScaleToZero).
        desired = min(max(desired, max(1, self.policy.spec.replicas.min)),
                      self.policy.spec.replicas.max)
        self.events = [e for e in self.events if e.at > now - 1800]
        if desired != current:
            self.events.append(engine_types.ScaleEvent(at=now, delta=desired - current))
        return desired


def plain_metric_replicas(
    *, current: int, values_sum: float, with_metrics: int, missing: int, target: float,
    tolerance: float, unready: int = 0,
) -> int:
    """The HPA's calcPlainMetricReplicas for a per-pod metric with an average target.

    Pods are split as groupPods does: with a metric, `missing` (running, no sample yet)
    and `unready` (phase Pending: waiting for a node or pulling the image). Missing pods
    count as 0 when scaling up and as the target when scaling down; Pending pods count
    as 0 when scaling up and are ignored otherwise; a change that flips direction or lands
    within tolerance is dropped. Example: 4 pods at 100 % GPU use, target 70 %: ratio
    1.43 -> ceil(5.7) = 6; with 2 more pods pulling their image: (4 x 1.0 + 0 + 0) / 6 /
    0.7 = 0.95, within tolerance -> no change.
    """
    if with_metrics == 0:
        return current
    ratio = values_sum / with_metrics / target
    up_with_unready = unready > 0 and ratio > 1.0
    if not up_with_unready and missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * with_metrics - 1e-9)
    fill = target if ratio < 1.0 else 0.0
    pods = with_metrics + missing + (unready if up_with_unready else 0)
    new_ratio = (values_sum + fill * missing) / pods / target
    if (abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio)
            or (ratio > 1.0 > new_ratio)):
        return current
    proposal = math.ceil(new_ratio * pods - 1e-9)
    if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
        return current
    return proposal


@dataclass(slots=True)
class Hpa:
    """HPA on GPU utilisation (DCGM_FI_DEV_GPU_UTIL through a Prometheus adapter), target 70 %.

    The metric the HPA sees at `now` is the utilisation averaged over [now-60, now-30]:
    DCGM exporter scrape (15 s) + Prometheus scrape (15 s) + a 30 s rate window in the
    adapter rule. A pod ready for less than 30 s has no sample yet (missing).
    """

    policy: policy_model.ScalePolicy
    target_utilization: float = 0.70
    lag_s: tuple[float, float] = (60.0, 30.0)
    config: HpaConfig = field(default_factory=HpaConfig)
    controller: HpaController = field(init=False)
    name: str = "hpa"

    def __post_init__(self) -> None:
        self.controller = HpaController(self.policy, self.config)

    @property
    def period_s(self) -> float:
        return self.config.sync_s

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        current = cluster.spec_replicas
        pods = cluster.replicas()
        start, end = now - self.lag_s[0], now - self.lag_s[1]
        pull = cluster.profile.cold_start.image_pull_seconds
        busy = cluster.window(cluster.history.busy_ready, start=start, end=end)
        ready = cluster.window(cluster.history.ready, start=start, end=end)
        per_pod = float(busy.sum()) / float(ready.sum()) if ready.sum() else 0.0
        values_sum, with_metrics, missing, unready = 0.0, 0, 0, 0
        for pod in pods:
            running_from = None if pod.scheduled_at is None else pod.scheduled_at + pull
            if running_from is None or running_from > now:
                unready += 1          # Pending: no node yet, or pulling the image
            elif running_from > end:
                missing += 1          # running, but no sample through the lag yet
            else:
                with_metrics += 1
                # A pod still loading its model reports its GPU idle (DCGM sees 0 %).
                if pod.ready_at is not None and pod.ready_at <= end:
                    values_sum += per_pod
        proposal = plain_metric_replicas(
            current=current, values_sum=values_sum, with_metrics=with_metrics,
            missing=missing, unready=unready, target=self.target_utilization,
            tolerance=self.config.tolerance,
        )
        return self.controller.normalize(current=current, proposal=proposal, now=now)
