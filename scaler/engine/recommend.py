"""Per-signal replica recommendations (DESIGN 3.1): each signal alone, in replicas."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaler.engine import types
from scaler.policy import model

# Fractional replica counts are rounded up, but float noise must not add a replica:
# 96 requests / 48 per replica is 2.0000000000000004 after some arithmetic, not 3.
_EPSILON = 1e-9


def ceil_replicas(value: float) -> int:
    return max(0, math.ceil(value - _EPSILON))


@dataclass(frozen=True, slots=True)
class SignalOpinion:
    """A signal's reading: `demand` in fractional replicas (None = no opinion)."""

    reason: types.SignalReason
    demand: float | None
    is_guard: bool = False

    @property
    def replicas(self) -> int | None:
        return None if self.demand is None else ceil_replicas(self.demand)


def _fresh(value: types.SignalValue | None, stale_after_s: float) -> bool:
    return (
        value is not None
        and math.isfinite(value.value)
        and value.value >= 0
        and value.age_s <= stale_after_s
    )


def _opinion(
    name: str,
    *,
    value: types.SignalValue | None,
    fresh: bool,
    demand: float | None,
    detail: str,
    is_guard: bool = False,
) -> SignalOpinion:
    """A signal's opinion with its reason; `demand` None means no opinion."""
    reason = types.SignalReason(
        name=name,
        value=None if value is None else value.value,
        age_s=None if value is None else value.age_s,
        fresh=fresh,
        recommendation=None if demand is None else ceil_replicas(demand),
        detail=detail,
    )
    return SignalOpinion(reason=reason, demand=demand, is_guard=is_guard)


def _unusable(name: str, label: str, value: types.SignalValue | None, *,
              is_guard: bool = False) -> SignalOpinion:
    """No opinion because the value is missing or stale."""
    detail = f"{label} missing" if value is None else f"{label} stale"
    return _opinion(name, value=value, fresh=False, demand=None, detail=detail,
                    is_guard=is_guard)


def concurrency(
    spec: model.ConcurrencySignal,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    stale_after_s: float,
) -> SignalOpinion:
    """ceil((waiting + running) / target): the capacity measure.

    It stays high while replicas are busy, so it does not collapse when the queue empties
    because capacity is finally enough. Running requests are reported by ready replicas;
    with none ready nothing runs and nobody can report, so the queue alone (from the
    gateway or the message queue) stands for demand: that is how a model is activated
    from zero.
    Example: 30 running + 12 waiting at 48 per replica -> ceil(42 / 48) = 1 replica.
    """
    running, waiting = snapshot.in_flight, snapshot.queue_depth
    running_fresh = _fresh(running, stale_after_s)
    waiting_fresh = _fresh(waiting, stale_after_s)
    no_ready_replica = cluster.ready == 0
    if running_fresh or (no_ready_replica and waiting_fresh):
        parts = [v for v in (running, waiting) if v is not None and _fresh(v, stale_after_s)]
        total = sum(v.value for v in parts)
        demand = total / spec.target_per_replica
        detail = f"({total:g} running+waiting) / {spec.target_per_replica:g} per replica"
        combined = types.SignalValue(value=total, age_s=max(v.age_s for v in parts))
        return _opinion("concurrency", value=combined, fresh=True, demand=demand,
                        detail=detail)
    return _unusable("concurrency", "in-flight count", running)


def queue_depth(
    spec: model.QueueDepthSignal,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    stale_after_s: float,
) -> SignalOpinion:
    """Queue pressure: waiting beyond the target per ready replica pushes up in proportion.

    ceil(waiting / target) replicas when waiting > target * ready; otherwise no opinion,
    so an empty queue never pushes the count down on its own.
    Example: 40 waiting, 4 per replica, 2 ready -> 40 > 8, so 10 replicas.
    """
    waiting = snapshot.queue_depth
    if not _fresh(waiting, stale_after_s) or waiting is None:
        return _unusable("queue_depth", "queue depth", waiting)
    allowed = spec.target_waiting_per_replica * cluster.ready
    if waiting.value > allowed:
        demand = waiting.value / spec.target_waiting_per_replica
        detail = (f"{waiting.value:g} waiting > {allowed:g} allowed "
                  f"({spec.target_waiting_per_replica:g} x {cluster.ready} ready)")
        return _opinion("queue_depth", value=waiting, fresh=True, demand=demand, detail=detail)
    return _opinion("queue_depth", value=waiting, fresh=True, demand=None,
                    detail=f"{waiting.value:g} waiting within {allowed:g}: no opinion")


def tokens_per_second(
    spec: model.TokensPerSecondSignal,
    *,
    snapshot: types.SignalSnapshot,
    stale_after_s: float,
) -> SignalOpinion:
    """Work in replicas: (generated / capacity + prompt / prompt capacity) / utilisation.

    A replica's time is split between decoding and prefilling, so each stream uses a share
    of one replica and the shares add up. Example: 2,000 generated tok/s at 2,400 per
    replica and 60,000 prompt tok/s at 25,000 per replica, at 0.8 utilisation:
    (0.83 + 2.4) / 0.8 = 4.04 -> 5 replicas, where generated tokens alone say 2. Without
    a prompt capacity, only generated tokens count.
    """
    generated = snapshot.tokens_per_second
    prompt = snapshot.prompt_tokens_per_second
    parts = [("generated", generated, spec.capacity_per_replica)]
    if spec.prompt_capacity_per_replica is not None:
        parts.append(("prompt", prompt, spec.prompt_capacity_per_replica))
    missing = [name for name, value, _ in parts if not _fresh(value, stale_after_s)]
    if missing:
        detail = " and ".join(missing) + " tokens/s " + (
            "missing" if all(v is None for n, v, _ in parts if n in missing) else "stale")
        return _opinion("tokens_per_second", value=generated, fresh=False, demand=None,
                        detail=detail)
    shares = [(name, v.value, cap) for name, v, cap in parts if v is not None]
    busy = sum(value / cap for _, value, cap in shares)
    demand = busy / spec.target_utilization
    detail = " + ".join(f"{value:g} {name} tok/s / {cap:g}" for name, value, cap in shares)
    combined = types.SignalValue(
        value=sum(value for _, value, _ in shares),
        age_s=max(v.age_s for _, v, _ in parts if v is not None),
    )
    return _opinion("tokens_per_second", value=combined, fresh=True, demand=demand,
                    detail=f"({detail}) / {spec.target_utilization:g} utilisation")


def saturated(policy: model.ScalePolicySpec, *, snapshot: types.SignalSnapshot, ready: int
              ) -> bool:
    """A queue beyond what the ready replicas should hold: throughput reads capacity, not load.

    The bound is the queue-pressure target (`targetWaitingPerReplica` per ready replica,
    1 without one): a few waiting requests are normal under continuous batching and say
    nothing about overload.
    """
    waiting = snapshot.queue_depth
    per_replica = (policy.signals.queue_depth.target_waiting_per_replica
                   if policy.signals.queue_depth else 1.0)
    return (waiting is not None and _fresh(waiting, policy.stale_after_seconds)
            and waiting.value > max(1.0, per_replica) * ready)


def arrival_rate(
    policy: model.ScalePolicySpec,
    *,
    snapshot: types.SignalSnapshot,
    replicas_per_request_rate: float | None,
    ready: int,
) -> SignalOpinion | None:
    """Under overload, requests/s x the learned load of one request/s.

    Measured throughput (tokens/s, requests running) cannot exceed the replicas serving
    it, so when the model is saturated it reads the capacity, not the demand; the arrival
    rate (from the gateway or the stream's sequence numbers) keeps counting. Only then,
    and once the load of a request has been learned (see decide._learn_load_per_request):
    unsaturated, throughput is the better measure and a second estimate would only add
    noise to the max. Example: 40 req/s x 0.127 replicas per req/s = 5.1 -> 6 replicas.
    """
    rate = snapshot.arrival_rate
    if (replicas_per_request_rate is None or rate is None
            or not _fresh(rate, policy.stale_after_seconds)
            or not saturated(policy, snapshot=snapshot, ready=ready)):
        return None
    demand = rate.value * replicas_per_request_rate
    return _opinion("arrival_rate", value=rate, fresh=True, demand=demand,
                    detail=f"{rate.value:.3g} req/s x {replicas_per_request_rate:.3g} "
                    "replicas per req/s (learned)")


def p95_latency(
    spec: model.P95LatencySignal,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    stale_after_s: float,
) -> SignalOpinion:
    """A guard: above the SLO, ready replicas x (p95 / SLO); below it, no opinion.

    Scaled from *ready* replicas, so replicas still starting are counted once they are
    compared with the total: a slow start never makes the guard add yet another replica.
    Example: p95 3.0 s against a 2.0 s SLO with 4 ready -> 4 x 1.5 = 6 replicas.
    """
    value = snapshot.p95_latency_s
    if not _fresh(value, stale_after_s) or value is None:
        return _unusable("p95_latency", "p95 latency", value, is_guard=True)
    if value.value > spec.slo_seconds and cluster.ready > 0:
        demand = cluster.ready * value.value / spec.slo_seconds
        detail = (f"p95 {value.value:.3g}s > SLO {spec.slo_seconds:g}s: "
                  f"{cluster.ready} ready x {value.value / spec.slo_seconds:.2f}")
        return _opinion("p95_latency", value=value, fresh=True, demand=demand, detail=detail,
                        is_guard=True)
    return _opinion("p95_latency", value=value, fresh=True, demand=None, is_guard=True,
                    detail=f"p95 {value.value:.3g}s within SLO {spec.slo_seconds:g}s")


def all_opinions(
    policy: model.ScalePolicySpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
) -> list[SignalOpinion]:
    """Every configured signal's opinion, in a fixed order."""
    stale_after = policy.stale_after_seconds
    signals = policy.signals
    opinions = []
    if signals.concurrency:
        opinions.append(concurrency(signals.concurrency, snapshot=snapshot, cluster=cluster,
                                    stale_after_s=stale_after))
    if signals.queue_depth:
        opinions.append(queue_depth(signals.queue_depth, snapshot=snapshot, cluster=cluster,
                                    stale_after_s=stale_after))
    if signals.tokens_per_second:
        opinions.append(tokens_per_second(signals.tokens_per_second, snapshot=snapshot,
                                          stale_after_s=stale_after))
    if signals.p95_latency:
        opinions.append(p95_latency(signals.p95_latency, snapshot=snapshot, cluster=cluster,
                                    stale_after_s=stale_after))
    return opinions
