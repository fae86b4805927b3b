"""Per-signal opinions (DESIGN 3.1): each signal alone, in replicas, with its kind."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaler.engine import spec as engine_spec
from scaler.engine import types

# Fractional replica counts are rounded up, but float noise must not add a replica:
# 96 requests / 48 per replica is 2.0000000000000004 after some arithmetic, not 3.
_EPSILON = 1e-9

MAX_DEMAND_REPLICAS = 1e6
"""No opinion may ask for more: a million replicas of one model is past any fleet, so a
larger figure is a broken input (1e300 in flight), and the cap keeps every later step's
arithmetic finite (a trend through 1e300s would overflow)."""


def ceil_replicas(value: float) -> int:
    if not value < MAX_DEMAND_REPLICAS:  # also NaN
        return int(MAX_DEMAND_REPLICAS)
    replicas = math.ceil(value - _EPSILON)
    return replicas if replicas > 0 else 0  # max(0, ...) without a call: 8 a decision


def bounded(demand: float) -> float:
    """A demand in [0, MAX_DEMAND_REPLICAS]; NaN counts as the cap (never as zero)."""
    if not demand < MAX_DEMAND_REPLICAS:
        return MAX_DEMAND_REPLICAS
    return demand if demand > 0.0 else 0.0  # -0.0 -> 0.0, as max(0.0, -0.0)


@types.fast_init
@dataclass(frozen=True, slots=True)
class Opinion:
    """One rule's reading: `demand` in fractional replicas (None = no opinion)."""

    reason: types.SignalReason
    demand: float | None

    @property
    def rule(self) -> types.Rule:
        return self.reason.name

    @property
    def kind(self) -> types.OpinionKind:
        return self.reason.name.kind

    @property
    def replicas(self) -> int | None:
        return None if self.demand is None else ceil_replicas(self.demand)

    def restated(self, demand: float, why: str) -> Opinion:
        """The same reading as `demand` replicas (held to a load, or rescaled to what
        replicas were seen to serve), the reason saying why."""
        demand = bounded(demand)
        reason = dataclasses.replace(self.reason, recommendation=ceil_replicas(demand),
                                     detail=f"{self.reason.detail}; {why}")
        return Opinion(reason=reason, demand=demand)


def _fresh(value: types.SignalValue | None) -> bool:
    """Usable: present and fresh (freshness was decided when the snapshot was built)."""
    return value is not None and value.fresh


def opinion(
    rule: types.Rule,
    *,
    value: types.SignalValue | None,
    fresh: bool,
    demand: float | None,
    detail: str,
) -> Opinion:
    """A rule's opinion with its reason; `demand` None means no opinion."""
    return _reading(rule, value=None if value is None else value.value,
                    age_s=None if value is None else value.age_s, fresh=fresh,
                    demand=demand, detail=detail)


def _reading(rule: types.Rule, *, value: float | None, age_s: float | None, fresh: bool,
             demand: float | None, detail: str) -> Opinion:
    """`opinion` from the value and age themselves: a reading combined from several
    signals (concurrency, tokens/s) needs no SignalValue built only to be read back."""
    if demand is not None:
        demand = bounded(demand)
    reason = types.SignalReason(
        name=rule,
        value=value,
        age_s=age_s,
        fresh=fresh,
        recommendation=None if demand is None else ceil_replicas(demand),
        detail=detail,
    )
    return Opinion(reason=reason, demand=demand)


def _unusable(rule: types.Rule, label: str, value: types.SignalValue | None) -> Opinion:
    """No opinion because the value is missing or stale."""
    detail = f"{label} missing" if value is None else f"{label} stale"
    return opinion(rule, value=value, fresh=False, demand=None, detail=detail)


def concurrency(
    rule: engine_spec.ConcurrencyRule,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
) -> Opinion:
    """ceil((waiting + running) / target): the capacity measure.

    It stays high while replicas are busy, so it does not collapse when the queue empties
    because capacity is finally enough. Running requests are reported by ready replicas;
    with none ready nothing runs and nobody can report, so the queue alone (from the
    gateway or the message queue) stands for demand: that is how a model is activated
    from zero.
    Example: 30 running + 12 waiting at 48 per replica -> ceil(42 / 48) = 1 replica.
    """
    running, waiting = snapshot.in_flight, snapshot.queue_depth
    no_ready_replica = cluster.ready == 0
    if _fresh(running) or (no_ready_replica and _fresh(waiting)):
        # Lists, not generators, in the hot path: the same sums, a generator object fewer.
        parts = [v for v in (running, waiting) if v is not None and v.fresh]
        total = sum([v.value for v in parts])  # inf, not OverflowError, at 1e308
        detail = f"({total:g} running+waiting) / {rule.target_per_replica:g} per replica"
        return _reading(types.Rule.CONCURRENCY, value=total,
                        age_s=max([v.age_s for v in parts]), fresh=True,
                        demand=total / rule.target_per_replica, detail=detail)
    return _unusable(types.Rule.CONCURRENCY, "in-flight count", running)


def queue_depth(
    rule: engine_spec.QueueRule,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
) -> Opinion:
    """Queue pressure: waiting beyond the target per ready replica pushes up in proportion.

    ceil(waiting / target) replicas when waiting > target * ready; otherwise no opinion,
    so an empty queue never pushes the count down on its own.
    Example: 40 waiting, 4 per replica, 2 ready -> 40 > 8, so 10 replicas.
    """
    waiting = snapshot.queue_depth
    if not _fresh(waiting) or waiting is None:
        return _unusable(types.Rule.QUEUE_DEPTH, "queue depth", waiting)
    target = rule.target_waiting_per_replica
    allowed = target * cluster.ready
    if waiting.value > allowed:
        detail = f"{waiting.value:g} waiting > {allowed:g} allowed ({target:g} x " \
                 f"{cluster.ready} ready)"
        return opinion(types.Rule.QUEUE_DEPTH, value=waiting, fresh=True,
                       demand=waiting.value / target, detail=detail)
    return opinion(types.Rule.QUEUE_DEPTH, value=waiting, fresh=True, demand=None,
                   detail=f"{waiting.value:g} waiting within {allowed:g}: no opinion")


def tokens_per_second(
    rule: engine_spec.TokensRule,
    *,
    snapshot: types.SignalSnapshot,
) -> Opinion:
    """Work in replicas: (generated / capacity + prompt / prompt capacity) / utilisation.

    A replica's time is split between decoding and prefilling, so each stream uses a share
    of one replica and the shares add up. Example: 2,000 generated tok/s at 2,400 per
    replica and 60,000 prompt tok/s at 25,000 per replica, at 0.8 utilisation:
    (0.83 + 2.4) / 0.8 = 4.04 -> 5 replicas, where generated tokens alone say 2. Without
    a prompt capacity, only generated tokens count.
    """
    generated = snapshot.tokens_per_second
    prompt = snapshot.prompt_tokens_per_second
    parts = [("generated", generated, rule.capacity_per_replica)]
    if rule.prompt_capacity_per_replica is not None:
        parts.append(("prompt", prompt, rule.prompt_capacity_per_replica))
    missing = [name for name, value, _ in parts if not _fresh(value)]
    if missing:
        detail = " and ".join(missing) + " tokens/s " + (
            "missing" if all(v is None for n, v, _ in parts if n in missing) else "stale")
        return opinion(types.Rule.TOKENS_PER_SECOND, value=generated, fresh=False,
                       demand=None, detail=detail)
    shares = [(name, v.value, cap) for name, v, cap in parts if v is not None]
    busy = sum([value / cap for _, value, cap in shares])
    detail = " + ".join([f"{value:g} {name} tok/s / {cap:g}" for name, value, cap in shares])
    return _reading(types.Rule.TOKENS_PER_SECOND,
                    value=sum([value for _, value, _ in shares]),  # inf, not OverflowError
                    age_s=max([v.age_s for _, v, _ in parts if v is not None]), fresh=True,
                    demand=busy / rule.target_utilization,
                    detail=f"({detail}) / {rule.target_utilization:g} utilisation")


# A replica ready for less than this may not be in the KV cache's mean yet: pods report
# every second over NATS, but Prometheus scrapes every 15 s by default.
KV_REPORT_S = 15.0


def kv_cache(
    rule: engine_spec.KvCacheRule,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    now: float,
) -> Opinion:
    """Memory in replicas: ready x mean KV-cache usage / target utilisation.

    Tokens/s counts work, not the memory it holds: a request keeps its prompt and answer
    in the KV cache until it finishes, so long prompts with long answers fill the cache
    while compute is still free, and new requests then wait for memory. Usage is a mean
    over the replicas that report it, which are the ready ones. Example: 5 ready at 90 %
    used, target 0.8 -> 5 x 0.9 / 0.8 = 5.6 -> 6 replicas (at 85 %, 5.3 is within the
    10 % tolerance of 5: no change). A full cache reads at most ready / target: it measures a
    shortfall of memory, not how large it is, so while a backlog is served it is held to
    the load like the other backlog readings (decide.BACKLOG_READINGS).
    A replica ready for less than KV_REPORT_S is not counted while others are: its cache
    is empty and it may not have reported, so the mean is still the old replicas' (2
    replicas at 95 %, a third just ready: 3 x 0.95 / 0.8 = 3.6 read a fourth replica the
    moment the third arrived; 2 x 0.95 / 0.8 = 2.4 is the memory in use).
    """
    usage = snapshot.kv_cache_usage
    if not _fresh(usage) or usage is None:
        return _unusable(types.Rule.KV_CACHE, "KV-cache usage", usage)
    ready, target = cluster.ready, rule.target_utilization
    if ready == 0:
        return opinion(types.Rule.KV_CACHE, value=usage, fresh=True, demand=None,
                       detail="no ready replica holds a cache")
    new = sum(1 for o in cluster.observations if now - o.ready_at < KV_REPORT_S)
    counted = ready - new if 0 < new < ready else ready
    return opinion(types.Rule.KV_CACHE, value=usage, fresh=True,
                   demand=counted * min(usage.value, 1.0) / target,
                   detail=f"{counted} ready x {usage.value:.0%} of the KV cache used / "
                   f"{target:g} target" + (f" ({new} more ready for less than "
                                           f"{KV_REPORT_S:.0f} s, not yet in it)"
                                           if counted < ready else ""))


def overloaded(spec: engine_spec.EngineSpec, *, snapshot: types.SignalSnapshot, ready: int
               ) -> bool:
    """A queue beyond what the ready replicas should hold: throughput reads capacity, not
    load (`EngineSpec.overload_waiting_per_replica` per ready replica)."""
    waiting = snapshot.queue_depth
    return (_fresh(waiting) and waiting is not None
            and waiting.value > spec.overload_waiting_per_replica * ready)


def arrival_rate(
    *,
    snapshot: types.SignalSnapshot,
    replicas_per_request_rate: float | None,
    backlogged: bool,
) -> Opinion | None:
    """With a backlog, requests/s x the learned load of one request/s.

    Measured throughput (tokens/s, requests running) cannot exceed the replicas serving
    it, so while a backlog builds or drains it reads the capacity, not the demand; the
    arrival rate (from the gateway, the stream's sequence numbers or flow balance) keeps
    counting. Only then (`backlogged`: see decide.estimate_load), and once the load of a
    request has been learned (decide.learn_load): in a steady state throughput is the
    better measure and a second estimate would only add noise to the max. Example: 40
    req/s x 0.127 replicas per req/s = 5.1 -> 6 replicas.
    """
    rate = snapshot.arrival_rate
    if replicas_per_request_rate is None or rate is None or not _fresh(rate) or not backlogged:
        return None
    return opinion(types.Rule.ARRIVAL_RATE, value=rate, fresh=True,
                   demand=rate.value * replicas_per_request_rate,
                   detail=f"{rate.value:.3g} req/s x {replicas_per_request_rate:.3g} "
                   "replicas per req/s (learned)")


GUARD_QUANTILE = 0.95
"""The guard's quantile: p95."""
GUARD_MAX_STEP = 2.0
"""The most the guard multiplies the ready replicas by in one decision. Waiting time grows
steeply near saturation and falls as steeply once capacity is added: doubling the
replicas of a saturated model takes it to half load, where queueing has all but
vanished. A larger push buys replicas that arrive after the SLO is restored (the guard
asked for 37 x ready when it read waits of a backlog already drained); later decisions
can push again, counted from the replicas ready by then."""

SHORT_QUEUE_BOUND = 1.5
"""A push on a short queue's wait (not an overload) is at most this x the largest capacity
reading: memory-bound replicas under-read their need (a mean KV cache at its target while
the replicas long answers were routed to are full), but by a share, not by multiples; and
under 2, so a model whose every capacity signal reads under half of max is never pushed to
it (for max of 4 and more)."""


def queue_wait_s(waiting: types.SignalValue,
                 completed: types.SignalValue | None) -> float | None:
    """How long a request joining the queue now waits, by Little's law: the requests
    waiting / the requests finishing per second (each one that ends frees the batch slot
    and the KV-cache room the head of the queue takes). None without a fresh, positive
    completion rate. Example: 13 waiting while 3 answers of 5,000 tokens end a second ->
    4.3 s, though 13 is far below what 5 replicas admit at once when memory is free.
    """
    if completed is None or not _fresh(completed) or completed.value <= 0:
        return None
    return waiting.value / completed.value


def p95_latency(
    rule: engine_spec.LatencyRule,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    overload_waiting_per_replica: float,
    capacity: float | None = None,
) -> Opinion:
    """A guard that reads the present: above the SLO while requests still wait, push up.

    - Latency histograms are filled when first tokens (or answers) come out, so requests
      that queued during a step report their waits after capacity arrived. The guard acts
      while the model is overloaded (more waiting than the ready replicas admit at once,
      `EngineSpec.overload_waiting_per_replica` each): once the queue is back within
      that, new requests start promptly and the long latencies read are of a backlog
      already served (two minutes after one drained, the guard read 75 s).
    - Or while a short queue itself waits longer than the SLO (`queue_wait_s`): where
      memory, not batch slots, admits requests (long answers holding the KV cache), one
      enters only when an answer ends, and a few waiting are seconds of queue. That push
      is bounded by the capacity signals: at most SHORT_QUEUE_BOUND x the largest of them
      (`capacity`), none without one, so a model is never pushed to max while every
      capacity signal reads under half of it.
    - A violation must be certain from the buckets: the share of observations within the
      SLO is bounded by the bucket edges around it (`Histogram.share_within`), and the
      guard pushes only when even the upper bound is below 95 %. Interpolating across a
      wide bucket that straddles the SLO overstates the p95 (with vLLM's (1, 2.5] bucket
      and a 2 s SLO it read a violation in 99.5 % of decisions where the exact p95
      exceeded 2 s in 50.6 %). Sources that send only a p95 are compared directly.
    - The push is ready x min(p95 / SLO, GUARD_MAX_STEP), from *ready* replicas, so
      replicas still starting never make it add yet another.
    Example: p95 3.0 s against a 2.0 s SLO, 4 ready, 30 waiting -> 4 x 1.5 = 6 replicas.
    With 5,000-token answers, 4 ready, 6 waiting (within the bound of 32) while 1.5
    answers end a second: the queue waits 4 s, p95 7 s, the KV cache reads 4.1 -> 4 x 2 = 8,
    at most 1.5 x 4.1 = 6.1: 7 replicas.
    """
    value = snapshot.p95_latency
    if not _fresh(value) or value is None:
        return _unusable(types.Rule.P95_LATENCY, "p95 latency", value)
    slo = rule.slo_s

    def no_push(detail: str) -> Opinion:
        return opinion(types.Rule.P95_LATENCY, value=value, fresh=True, demand=None,
                       detail=detail)

    if cluster.ready == 0:
        return no_push("no ready replica to measure")
    waiting = snapshot.queue_depth
    bound, present = math.inf, ""
    if (_fresh(waiting) and waiting is not None
            and waiting.value <= overload_waiting_per_replica * cluster.ready):
        wait = queue_wait_s(waiting, snapshot.completion_rate)
        if wait is None or wait <= slo:
            return no_push(f"p95 {value.value:.3g}s, but the queue ({waiting.value:g} "
                           "waiting) is within what the ready replicas admit at once: "
                           "those latencies are of requests already served")
        if capacity is None:
            return no_push(f"{waiting.value:g} waiting wait {wait:.3g}s, but no capacity "
                           "signal reads a need to bound a push by")
        bound = SHORT_QUEUE_BOUND * capacity
        present = (f"; {waiting.value:g} waiting wait {wait:.3g}s at the rate answers "
                   f"end (at most {SHORT_QUEUE_BOUND:g} x {capacity:.3g} replicas, the "
                   "capacity signals' most)")
    bounds = None if value.histogram is None else value.histogram.share_within(slo)
    if bounds is not None:
        low, high = bounds
        if high >= GUARD_QUANTILE:
            if low >= GUARD_QUANTILE:
                return no_push(f"{low:.1%} within SLO {slo:g}s")
            return no_push(f"{low:.1%} to {high:.1%} within SLO {slo:g}s: the bucket "
                           "around the SLO cannot tell, no push")
    elif value.value <= slo:
        return no_push(f"p95 {value.value:.3g}s within SLO {slo:g}s")
    ratio = min(value.value / slo, GUARD_MAX_STEP)
    detail = (f"p95 {value.value:.3g}s > SLO {slo:g}s: {cluster.ready} ready x {ratio:.2f}"
              + (f" (capped at {GUARD_MAX_STEP:g}x)" if ratio < value.value / slo else "")
              + present)
    return opinion(types.Rule.P95_LATENCY, value=value, fresh=True,
                   demand=min(cluster.ready * ratio, bound), detail=detail)


def signal_opinions(
    spec: engine_spec.EngineSpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    now: float,
) -> list[Opinion]:
    """Every configured signal's opinion, in a fixed order."""
    opinions = []
    if spec.concurrency is not None:
        opinions.append(concurrency(spec.concurrency, snapshot=snapshot, cluster=cluster))
    if spec.queue is not None:
        opinions.append(queue_depth(spec.queue, snapshot=snapshot, cluster=cluster))
    if spec.tokens is not None:
        opinions.append(tokens_per_second(spec.tokens, snapshot=snapshot))
    if spec.kv_cache is not None:
        opinions.append(kv_cache(spec.kv_cache, snapshot=snapshot, cluster=cluster, now=now))
    if spec.latency is not None:
        opinions.append(p95_latency(
            spec.latency, snapshot=snapshot, cluster=cluster,
            overload_waiting_per_replica=spec.overload_waiting_per_replica,
            capacity=max([o.demand for o in opinions
                          if o.kind is types.OpinionKind.CAPACITY and o.demand is not None],
                         default=None)))
    return opinions
