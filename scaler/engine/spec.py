"""Resolve, then decide: a ScalePolicy turned once into what the engine reads.

The policy file model (`scaler.policy.model`) is for parsing and errors; `EngineSpec` is
the policy with defaults applied, units converted and choices made (the latency metric,
the queue bound that means overload, the pod start time), as Knative's `MakeDecider` does
before any scaling math. `decide` never looks at raw config.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from scaler.core import vocabulary
from scaler.policy import model


@dataclass(frozen=True, slots=True)
class ConcurrencyRule:
    target_per_replica: float
    """Requests (running + waiting) one replica should hold."""


@dataclass(frozen=True, slots=True)
class QueueRule:
    target_waiting_per_replica: float
    """Requests waiting per ready replica before the queue pushes up."""


@dataclass(frozen=True, slots=True)
class TokensRule:
    capacity_per_replica: float
    """Generated tokens/s of one replica that only decodes."""
    prompt_capacity_per_replica: float | None
    """Prompt tokens/s of one replica that only prefills (None: prompts not counted)."""
    target_utilization: float


@dataclass(frozen=True, slots=True)
class KvCacheRule:
    target_utilization: float
    """Mean share of the KV cache the ready replicas should use."""


@dataclass(frozen=True, slots=True)
class LatencyRule:
    metric: vocabulary.LatencyMetric
    slo_s: float


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine needs of one policy, resolved.

    overload_waiting_per_replica: waiting requests per ready replica above which the model
      is overloaded and throughput reads capacity, not load (the queue-pressure target,
      and at least 1: a few waiting requests are normal under continuous batching).
    pod_start_s / node_boot_s: the configured start times (learned ones refine them).
    """

    key: str
    stale_after_s: float
    min_replicas: int
    max_replicas: int
    warm_floor: model.WarmFloor
    behavior: model.Behavior
    tolerance: float
    concurrency: ConcurrencyRule | None
    queue: QueueRule | None
    tokens: TokensRule | None
    latency: LatencyRule | None
    kv_cache: KvCacheRule | None
    overload_waiting_per_replica: float
    forecast_enabled: bool
    forecast_window_s: float
    learn_start_times: bool
    pod_start_s: float
    node_boot_s: float
    gpus_per_replica: int
    budget_gpus: int | None
    headroom_replicas: int = 0
    headroom_fraction: float = 0.0
    restart_aware: bool = False
    keep_recommendations_s: int = 0
    """How long recommendations are remembered: the longest stabilization window."""
    keep_events_s: int = 0
    """How long scale events are remembered: the longest rate-limit period (0: none)."""

    def with_headroom(self, demand: float) -> float:
        """Capacity demand plus the policy's spare capacity: demand x (1 + fraction) +
        replicas. Example: 3.2 replicas of load, fraction 0.25, 1 spare -> 5.0."""
        return demand * (1.0 + self.headroom_fraction) + self.headroom_replicas

    def floor_at(self, now: float) -> tuple[int, bool]:
        """(the lower bound now, whether the warm floor is what sets it)."""
        # Without schedules the floor is its base: no list of active schedules to build,
        # three times a model a cycle (its decision, the fleet's cap and its ask).
        floor = self.warm_floor
        warm = floor.at(now) if floor.schedules else floor.replicas
        return (warm, True) if warm > self.min_replicas else (self.min_replicas, False)


def resolve(policy: model.ScalePolicy) -> EngineSpec:
    """The policy resolved, cached per policy object (policies are immutable)."""
    entry = _SPECS.get(id(policy))
    if entry is not None and entry[0]() is policy:
        return entry[1]
    spec = _resolve(policy)
    key = id(policy)

    def forget(ref: weakref.ref[model.ScalePolicy]) -> None:
        held = _SPECS.get(key)
        if held is not None and held[0] is ref:  # not a newer policy at the same id
            del _SPECS[key]

    _SPECS[key] = (weakref.ref(policy, forget), spec)
    return spec


_SPECS: dict[int, tuple[weakref.ref[model.ScalePolicy], EngineSpec]] = {}
"""Resolved specs by policy identity (pydantic models with dict fields are not hashable),
each dropped when its policy is collected: as many as the policies alive, whatever their
number. A bounded LRU (4,096) missed on every call at 10,000 models evaluated in turn, and
each miss rebuilt the spec from the pydantic model three times a model a cycle (the
decision, the fleet's cap and its ask)."""


def _resolve(policy: model.ScalePolicy) -> EngineSpec:
    spec = policy.spec
    signals = spec.signals
    queue = signals.queue_depth
    tokens = signals.tokens_per_second
    latency = signals.p95_latency
    return EngineSpec(
        key=policy.key,
        stale_after_s=spec.stale_after_seconds,
        min_replicas=spec.replicas.min,
        max_replicas=spec.replicas.max,
        warm_floor=spec.warm_floor,
        behavior=spec.behavior,
        tolerance=spec.behavior.tolerance,
        concurrency=(None if signals.concurrency is None
                     else ConcurrencyRule(signals.concurrency.target_per_replica)),
        queue=None if queue is None else QueueRule(queue.target_waiting_per_replica),
        tokens=None if tokens is None else TokensRule(
            capacity_per_replica=tokens.capacity_per_replica,
            prompt_capacity_per_replica=tokens.prompt_capacity_per_replica,
            target_utilization=tokens.target_utilization),
        latency=None if latency is None else LatencyRule(latency.metric, latency.slo_seconds),
        kv_cache=(None if signals.kv_cache is None
                  else KvCacheRule(signals.kv_cache.target_utilization)),
        overload_waiting_per_replica=max(
            1.0, queue.target_waiting_per_replica if queue is not None else 1.0),
        forecast_enabled=spec.forecast.enabled,
        forecast_window_s=spec.forecast.window_seconds,
        learn_start_times=spec.cold_start.learn,
        pod_start_s=spec.cold_start.pod_start_seconds,
        node_boot_s=spec.cold_start.node_boot_seconds,
        gpus_per_replica=spec.resources.gpus_per_replica,
        budget_gpus=None if spec.budget is None else spec.budget.max_gpus,
        headroom_replicas=spec.headroom.replicas,
        headroom_fraction=spec.headroom.fraction,
        restart_aware=spec.behavior.restart_aware,
        keep_recommendations_s=max(spec.behavior.scale_up.stabilization_seconds,
                                   spec.behavior.scale_down.stabilization_seconds),
        keep_events_s=max([rule.period_seconds for rule in (
            *spec.behavior.scale_up.policies, *spec.behavior.scale_down.policies)] or [0]),
    )
