"""Scaling strategies that drive the simulated cluster: scaler, hpa, keda, kpa and oracle."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from scaler.engine import decide as engine_decide
from scaler.engine import nodes as engine_nodes
from scaler.engine import stabilize as engine_stabilize
from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed as sim_feed
from scaler.sim import profiles, traces

STRATEGIES = ("scaler", "hpa", "keda", "kpa", "oracle")


class Strategy(Protocol):
    """Decides spec.replicas every `period_s` from what it can observe of the cluster."""

    @property
    def name(self) -> str: ...

    @property
    def period_s(self) -> float: ...

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int: ...


def _bounded(policy: policy_model.ScalePolicy, replicas: int) -> int:
    return min(max(replicas, policy.spec.replicas.min), policy.spec.replicas.max)


# ----- HPA -------------------------------------------------------------------------------


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
    config: HpaConfig = field(default_factory=HpaConfig)
    controller: HpaController = field(init=False)
    last_active: float = 0.0
    name: str = "keda"

    def __post_init__(self) -> None:
        self.controller = HpaController(self.policy, self.config)

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


# ----- Knative KPA -----------------------------------------------------------------------


@dataclass(slots=True)
class Kpa:
    """Knative Pod Autoscaler (pkg/autoscaler/scaling/autoscaler.go) on concurrency.

    Defaults from config-autoscaler: container-concurrency-target-default 100 x
    target-utilization 0.7 = 70 requests per pod; stable window 60 s; panic window 10 %
    of it (6 s); panic threshold 200 %; max scale-up rate 1000; max scale-down rate 2;
    tick 2 s; scale-to-zero grace 30 s (only with min 0). Concurrency is what the
    queue-proxies and the activator see: waiting + running, plus requests held at the
    gateway while no pod is ready.
    """

    policy: policy_model.ScalePolicy
    target_per_pod: float = 100 * 0.7
    stable_s: float = 60.0
    panic_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    tick_s: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    zero_since: float | None = None
    panic_time: float | None = None
    max_panic_pods: int = 0
    name: str = "kpa"

    @property
    def period_s(self) -> float:
        return self.tick_s

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        h = cluster.history
        if cluster.step == 0:
            # No metric bucket yet: Knative returns an invalid scale result (no change).
            return cluster.spec_replicas
        stable = (cluster.mean(h.waiting, start=now - self.stable_s, end=now)
                  + cluster.mean(h.running, start=now - self.stable_s, end=now))
        panic = (cluster.mean(h.waiting, start=now - self.panic_s, end=now)
                 + cluster.mean(h.running, start=now - self.panic_s, end=now))
        return self.scale(stable=stable, panic=panic,
                          ready=len(cluster.ready_slots), now=now)

    def scale(self, *, stable: float, panic: float, ready: int, now: float) -> int:
        """One KPA tick: observed stable and panic concurrency (totals) -> desired pods."""
        ready_count = float(max(1, ready))
        max_up = math.ceil(self.max_scale_up_rate * ready_count)
        max_down = math.floor(ready_count / self.max_scale_down_rate)
        dspc = math.ceil(stable / self.target_per_pod - 1e-9)
        dppc = math.ceil(panic / self.target_per_pod - 1e-9)
        desired_stable = int(min(max(dspc, max_down), max_up))
        desired_panic = int(min(max(dppc, max_down), max_up))
        over = dppc / ready_count >= self.panic_threshold
        if over:
            self.panic_time = now
        elif self.panic_time is not None and self.panic_time + self.stable_s < now:
            self.panic_time = None
            self.max_panic_pods = 0
        desired = desired_stable
        if self.panic_time is not None:
            # Panic: provision for the larger of the two windows and never scale down.
            desired = max(desired, desired_panic)
            self.max_panic_pods = max(self.max_panic_pods, desired)
            desired = self.max_panic_pods
        # Scale to zero only after scale-to-zero-grace-period (30 s) of wanting zero.
        if desired > 0:
            self.zero_since = None
        else:
            if self.zero_since is None:
                self.zero_since = now
            if now - self.zero_since < self.scale_to_zero_grace_s:
                desired = 1
        return _bounded(self.policy, desired)

    @property
    def panicking(self) -> bool:
        return self.panic_time is not None


# ----- oracle ----------------------------------------------------------------------------


def oracle_need(
    trace: traces.Trace,
    profile: profiles.ReplicaProfile,
    *,
    interval_s: float = 60.0,
    bucket_s: float = 10.0,
    utilization: float = 0.85,
) -> npt.NDArray[np.int64]:
    """Replicas each `interval_s` of the trace needs, from the future requests in it.

    Per 10 s bucket: arrival rate / (saturation rate of a replica for the bucket's mean
    lengths x utilization); per interval, the largest bucket. Example, Azure conv x 10:
    a bucket with 60 req/s of 1,155 in / 211 out, saturation 13.5 req/s at 0.85 ->
    ceil(60 / 11.5) = 6 replicas.
    """
    buckets = int(math.ceil((trace.duration_s + 1e-9) / bucket_s)) + 1
    index = (trace.arrival_s // bucket_s).astype(np.int64)
    count = np.bincount(index, minlength=buckets).astype(np.float64)
    inputs = np.bincount(index, weights=trace.input_tokens.astype(np.float64), minlength=buckets)
    outputs = np.bincount(index, weights=trace.output_tokens.astype(np.float64),
                          minlength=buckets)
    need = np.zeros(buckets)
    for b in np.flatnonzero(count).tolist():
        rate = count[b] / bucket_s
        capacity = profile.saturation_rate(input_tokens=inputs[b] / count[b],
                                           output_tokens=outputs[b] / count[b])
        need[b] = rate / (capacity * utilization)
    per_interval = int(round(interval_s / bucket_s))
    intervals = int(math.ceil(buckets / per_interval))
    padded = np.zeros(intervals * per_interval)
    padded[:buckets] = need
    peaks: npt.NDArray[np.float64] = padded.reshape(intervals, per_interval).max(axis=1)
    return np.ceil(peaks - 1e-9).astype(np.int64)


@dataclass(slots=True)
class Oracle:
    """Knows the future: each interval gets exactly the replicas it needs, ready on time.

    A replica needed from interval start s is created at s - pod start (the pod chain on
    a free GPU); nodes it will need are booted one node boot earlier by placeholder
    pods, which count as allocated GPUs while they hold a node. Its GPU-hours are the
    lower bound the other strategies are measured against.
    """

    policy: policy_model.ScalePolicy
    need: npt.NDArray[np.int64]
    profile: profiles.ReplicaProfile
    gpus_per_node: int
    gpus_per_replica: int
    interval_s: float = 60.0
    period_s: float = 1.0
    name: str = "oracle"

    def _need_over(self, start: float, end: float) -> int:
        lo = max(int(start // self.interval_s), 0)
        hi = min(int(end // self.interval_s), self.need.size - 1)
        if hi < lo:
            return _bounded(self.policy, 0)
        return _bounded(self.policy, int(self.need[lo:hi + 1].max()))

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        pod_start = self.profile.cold_start.pod_start_seconds
        boot = cluster.pool.node_boot_s
        replicas = self._need_over(now, now + pod_start)
        ahead = self._need_over(now, now + pod_start + boot)
        per_node = self.gpus_per_node // self.gpus_per_replica
        nodes_ahead = math.ceil(ahead / per_node)
        nodes_now = math.ceil(replicas / per_node)
        cluster.set_placeholders(max(0, nodes_ahead - max(nodes_now, _nodes_holding(cluster))),
                                 now=now)
        return replicas


def _nodes_holding(cluster: sim_cluster.SimCluster) -> int:
    """Live nodes with at least one real replica on them."""
    used = {p.node for p in cluster.replicas() if p.node is not None}
    return len(used)


# ----- the real engine -------------------------------------------------------------------


@dataclass(slots=True)
class ScalerStrategy:
    """The real engine, unchanged, fed what the service would see.

    Every `period_s` (replicas push signals about once a second) each simulated replica
    publishes its queue, batch, tokens/s and latency histogram into the real
    SignalStore, where they arrive `report_delay_s` later (see `feed.SignalFeed`); the
    engine decides from `SignalStore.snapshot` and a ClusterState built from the pods,
    including starting ones and observed start timelines. If the policy has a node
    pool, the engine's node plan sets the placeholder pods.
    """

    policy: policy_model.ScalePolicy
    start_epoch_s: float = 0.0
    period_s: float = 1.0
    report_delay_s: float = 1.0
    state: engine_types.EngineState = field(default_factory=engine_types.EngineState)
    feed: sim_feed.SignalFeed = field(init=False)
    decisions: int = 0
    name: str = "scaler"

    def __post_init__(self) -> None:
        guard = self.policy.spec.signals.p95_latency
        self.feed = sim_feed.SignalFeed(
            model_key=self.policy.key, start_epoch_s=self.start_epoch_s,
            latency_metric=guard.metric if guard else "ttft", delay_s=self.report_delay_s,
            interval_s=self.period_s)

    def snapshot(self, cluster: sim_cluster.SimCluster, *, now: float
                 ) -> engine_types.SignalSnapshot:
        """Publish and deliver due samples, then read the store as the service does."""
        self.feed.advance(cluster, now=now)
        return self.feed.snapshot(now=now,
                                  stale_after_s=self.policy.spec.stale_after_seconds)

    def cluster_state(self, cluster: sim_cluster.SimCluster, *, now: float
                      ) -> engine_types.ClusterState:
        pods = cluster.replicas()
        epoch = self.start_epoch_s
        starting = tuple(epoch + p.created_at for p in pods if p.phase != "ready")
        observations = tuple(
            dataclasses.replace(o, created_at=epoch + o.created_at, ready_at=epoch + o.ready_at)
            for o in cluster.observations[-20:]
        )
        return engine_types.ClusterState(
            current=cluster.spec_replicas,
            ready=len(cluster.ready_slots),
            starting=starting,
            free_replica_slots=cluster.free_replica_slots(now=now),
            observations=observations,
        )

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        decision, self.state = engine_decide.decide(
            self.policy,
            snapshot=self.snapshot(cluster, now=now),
            cluster=self.cluster_state(cluster, now=now),
            state=self.state,
            now=self.start_epoch_s + now,
        )
        self.decisions += 1
        pool = self.policy.spec.node_pool
        if pool is not None and pool.actuator != "none":
            plan = engine_nodes.plan_pool(
                pool, resource_name=self.policy.spec.resources.resource_name,
                demands=[engine_nodes.pool_demand(self.policy, decision)],
            )
            cluster.set_placeholders(plan.placeholder_pods, now=now)
        return decision.desired
