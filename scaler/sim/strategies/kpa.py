"""Knative Pod Autoscaler (KPA) on concurrency, with its stable and panic windows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim.strategies import bounds


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
        return bounds.bounded(self.policy, desired)

    @property
    def panicking(self) -> bool:
        return self.panic_time is not None
