"""The real engine, unchanged, fed what the service would see of the simulated cluster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scaler.core import vocabulary
from scaler.engine import decide as engine_decide
from scaler.engine import nodes as engine_nodes
from scaler.engine import spare as engine_spare
from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed as sim_feed


@dataclass(slots=True)
class ScalerStrategy:
    """The real engine, unchanged, fed what the service would see.

    Every `period_s` (replicas push signals about once a second) each simulated replica
    publishes its queue, batch, tokens/s and latency histogram into the real
    SignalStore, where they arrive `report_delay_s` later (see `feed.SignalFeed`); the
    engine decides from `SignalStore.snapshot` and a ClusterState built from the pods,
    including starting ones and observed start timelines. If the policy has a node
    pool, the engine's node plan sets the placeholder pods.

    Work-sparing scale-down, as the service does it (DESIGN, issue 16): before each
    scale-down the pods' `pod-deletion-cost` is set from the work each reported
    (`annotate`; `deletion_cost=False` is the service's kube.deletionCost.enabled off),
    and a batch-tier policy's ClusterState carries the replicas reporting unfinished
    work (`busy_replicas`, the engine's UNFINISHED_WORK clamp). Both read the same
    per-pod reports the engine's store holds, `report_delay_s` old.
    """

    policy: policy_model.ScalePolicy
    start_epoch_s: float = 0.0
    period_s: float = 1.0
    report_delay_s: float = 1.0
    state: engine_types.EngineState = field(default_factory=engine_types.EngineState)
    feed: sim_feed.SignalFeed = field(init=False)
    decisions: int = 0
    deletion_cost: bool = True
    name: str = "scaler"

    def __post_init__(self) -> None:
        guard = self.policy.spec.signals.p95_latency
        self.feed = sim_feed.SignalFeed(
            model_key=self.policy.key, start_epoch_s=self.start_epoch_s,
            latency_metric=guard.metric if guard else vocabulary.DEFAULT_LATENCY_METRIC,
            delay_s=self.report_delay_s,
            interval_s=self.period_s)

    def restart(self, state: engine_types.EngineState) -> None:
        """A new scaler process: an empty signal store (its replicas report again from
        the next period) and the engine `state` it starts from."""
        self.state = state
        self.__post_init__()

    def snapshot(self, cluster: sim_cluster.SimCluster, *, now: float
                 ) -> engine_types.SignalSnapshot:
        """Publish and deliver due samples, then read the store as the service does."""
        self.feed.advance(cluster, now=now)
        return self.feed.snapshot(now=now,
                                  stale_after_s=self.policy.spec.stale_after_seconds)

    def work(self, *, now: float) -> dict[str, engine_spare.PodWork]:
        """Each source's fresh in-flight and queued requests in the store at `now`, as
        the service's `pod_work` reads them (sources are the feed's `pod-<slot>`; a
        model with variants has '<variant>/pod-<slot>'; a work queue's depth is the
        model's, no replica's, and left out: `feed.replica_work`)."""
        store, key = self.feed.store, self.policy.key
        at, stale = self.start_epoch_s + now, self.policy.spec.stale_after_seconds
        return sim_feed.replica_work(engine_spare.work_by_source(
            in_flight=store.per_source(key, vocabulary.Signal.IN_FLIGHT, now=at,
                                       stale_after_s=stale),
            queue_depth=store.per_source(key, vocabulary.Signal.QUEUE_DEPTH, now=at,
                                         stale_after_s=stale)))

    def cluster_state(self, cluster: sim_cluster.SimCluster, *, now: float
                      ) -> engine_types.ClusterState:
        """The cluster reader's view; for a batch tier with the busy replicas added, as
        the service's `BusyReader` adds them (the gateway's held requests, published
        under a source of its own, count as one, as there)."""
        state = sim_feed.cluster_state(cluster, start_epoch_s=self.start_epoch_s, now=now)
        if self.policy.spec.tier is not vocabulary.Tier.BATCH:
            return state
        return dataclasses.replace(
            state, busy_replicas=engine_spare.busy_replicas(self.work(now=now)))

    def annotate(self, cluster: sim_cluster.SimCluster, *, desired: int, now: float,
                 prefix: str = "") -> None:
        """Before a scale-down (desired below spec.replicas), write every replica's
        deletion cost from its reported work (`spare.costs`: a pod without a fresh report
        never ranks below an idle one, and in a batch tier ranks as a busy one), as the
        service's DeletionCoster does; the ReplicaSet's order in `scale_to` then removes
        the idlest first. `prefix` names a variant's sources ('<variant>/')."""
        if not self.deletion_cost or desired >= cluster.spec_replicas:
            return
        pods = {f"{prefix}pod-{p.slot}": p for p in cluster.replicas()}
        for name, cost in engine_spare.costs(pods, self.work(now=now),
                                             tier=self.policy.spec.tier).items():
            pods[name].deletion_cost = cost

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
        self.annotate(cluster, desired=decision.desired, now=now)
        return decision.desired
