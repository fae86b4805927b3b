"""The real engine, unchanged, fed what the service would see of the simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from scaler.core import vocabulary
from scaler.engine import decide as engine_decide
from scaler.engine import nodes as engine_nodes
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
            latency_metric=guard.metric if guard else vocabulary.DEFAULT_LATENCY_METRIC,
            delay_s=self.report_delay_s,
            interval_s=self.period_s)

    def snapshot(self, cluster: sim_cluster.SimCluster, *, now: float
                 ) -> engine_types.SignalSnapshot:
        """Publish and deliver due samples, then read the store as the service does."""
        self.feed.advance(cluster, now=now)
        return self.feed.snapshot(now=now,
                                  stale_after_s=self.policy.spec.stale_after_seconds)

    def cluster_state(self, cluster: sim_cluster.SimCluster, *, now: float
                      ) -> engine_types.ClusterState:
        return sim_feed.cluster_state(cluster, start_epoch_s=self.start_epoch_s, now=now)

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
