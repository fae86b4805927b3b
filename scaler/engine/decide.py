"""The decision: policy, signals, cluster state, engine state and time in; decision out.

Pure: no I/O, no clock, no asyncio. The same function runs in the service and the
simulator. The caller keeps the returned state once the decision is applied (or logged
in dry-run); if applying fails, it keeps the old state and decides again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaler.engine import forecast, recommend, stabilize, types
from scaler.policy import model

# Recommendations that measure capacity needed (and so get the tolerance band), as opposed
# to the queue and latency guards, which measure pressure.
_CAPACITY = frozenset({"concurrency", "tokens_per_second", "arrival_rate", "forecast"})


def decide(
    policy: model.ScalePolicy,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    state: types.EngineState,
    now: float,
) -> tuple[types.Decision, types.EngineState]:
    """Decide the replicas for one model at `now` (epoch seconds)."""
    spec = policy.spec
    current = cluster.current
    opinions = recommend.all_opinions(spec, snapshot=snapshot, cluster=cluster)
    demand_opinions = [o for o in opinions if not o.is_guard]
    stale = [o.reason.name for o in demand_opinions if not o.reason.fresh]
    notes: list[str] = []

    # 1. Demand now, in fractional replicas: the max over the fresh capacity measures
    #    (concurrency, tokens/s, and the arrival rate once the load of a request has been
    #    learned). Queue pressure is left out of the trend: a queue builds
    #    while capacity lags and drains once it arrives, so its swings are the scaler's
    #    own echo, not a change in load. It is the demand only when nothing else is set.
    capacity = [o for o in demand_opinions if o.reason.name != "queue_depth"] or demand_opinions
    demand_values = [o.demand for o in capacity if o.demand is not None]
    demand_now = max(demand_values) if demand_values else None

    state = _learn_load_per_request(spec, snapshot=snapshot, cluster=cluster, state=state,
                                    demand_now=demand_now)
    arrival = recommend.arrival_rate(spec, snapshot=snapshot,
                                     replicas_per_request_rate=state.replicas_per_request_rate,
                                     ready=cluster.ready)
    if arrival is not None and arrival.demand is not None:
        opinions.append(arrival)
        demand_now = max(demand_now or 0.0, arrival.demand)

    # 2. Cold-start look-ahead.
    times, state = forecast.learn_start_times(spec.cold_start, state=state,
                                              observations=cluster.observations)
    samples = state.demand
    if demand_now is not None:
        samples = (*samples, types.DemandSample(at=now, demand=demand_now))
    samples = forecast.window(samples, now=now, seconds=spec.forecast.window_seconds)
    fc = _forecast(spec, cluster=cluster, samples=samples, times=times, now=now,
                   demand_now=demand_now)

    # 3. The raw recommendation: the largest opinion (demand signals, the forecast and the
    #    latency guard); with none, hold the current count.
    candidates = [(o.replicas, o.reason.name, o.demand) for o in opinions
                  if o.replicas is not None and o.demand is not None]
    if fc is not None and spec.forecast.enabled and fc.replicas_at_ready > 0:
        candidates.append((fc.replicas_at_ready, "forecast", fc.demand_at_ready))
    winner: str | None
    if candidates:
        # On a tie the signal, not the forecast, is named: it is the plainer reason.
        raw, winner, raw_demand = max(candidates, key=lambda c: (c[0], c[1] != "forecast"))
        # The HPA's tolerance: a capacity measure within 10 % of the current count changes
        # nothing, so demand hovering at a boundary (5.9, 6.1, 5.8 replicas) does not
        # flap the count. The queue and latency guards are exempt: they act on pressure.
        tolerance = spec.behavior.tolerance
        if (winner in _CAPACITY and current > 0 and raw != current
                and abs(raw_demand / current - 1) <= tolerance):
            notes.append(f"{winner} at {raw_demand:.2f} replicas is within "
                         f"{tolerance:.0%} of {current}: no change")
            raw = max([current] + [r for r, name, _ in candidates if name not in _CAPACITY])
    else:
        raw, winner = current, None
        notes.append("no signal has an opinion: holding the current count")
    if stale and winner is None:
        notes.append("stale or missing: " + ", ".join(stale))
    # 4. Backlog: no node boots for a queue that the replicas on hand will drain first.
    clamps: list[types.Clamp] = []
    cap = _backlog_cap(spec, snapshot=snapshot, cluster=cluster, state=state,
                       node_ready_s=times.pod_start_s + times.node_boot_s)
    if cap is not None and raw > cap.replicas:
        clamps.append(types.Clamp("backlog", raw, cap.replicas, cap.detail))
        raw = cap.replicas
    if cap is not None and fc is not None and fc.replicas_at_node_ready > cap.replicas:
        # Node headroom follows the same rule: no node is prepared for the backlog either.
        fc = dataclasses.replace(fc, replicas_at_node_ready=cap.replicas)

    # 5. Stabilization (HPA semantics) and rate limits. A fresh state (first decision, or
    #    a restarted service) seeds the down window with the current count, as the HPA
    #    does, so a restart never scales down before a full window of evidence.
    if state.last_desired is None:
        state = dataclasses.replace(
            state, recommendations=(types.Recommendation(at=now, replicas=current),))
    desired = stabilize.stabilize(spec.behavior, current=current, recommendation=raw,
                                  history=state.recommendations, now=now)
    if desired != raw:
        window_name = "stabilization_down" if desired > raw else "stabilization_up"
        seconds = (spec.behavior.scale_down if desired > raw else spec.behavior.scale_up
                   ).stabilization_seconds
        clamps.append(types.Clamp(window_name, raw, desired,
                                  f"{seconds}s window keeps {desired}"))
    if desired != current:
        up = desired > current
        direction = spec.behavior.scale_up if up else spec.behavior.scale_down
        limit = stabilize.rate_limit(direction, up=up, current=current, events=state.events,
                                     now=now)
        if limit is not None and (desired > limit if up else desired < limit):
            clamps.append(types.Clamp("rate_limit_up" if up else "rate_limit_down", desired,
                                      limit, "behavior policies allow at most this change now"))
            desired = limit

    # 6. Safety: never down on stale or missing data. (Never below what is in flight holds
    #    already: the concurrency signal counts running requests, and the max over
    #    signals cannot fall below it.)
    if desired < current and stale:
        clamps.append(types.Clamp("hold_stale", desired, current,
                                  "stale or missing: " + ", ".join(stale)))
        desired = current

    # 7. Bounds: min and warm floor below, max and GPU budget above (the cap wins).
    desired = _bound(spec, cluster=cluster, desired=desired, now=now, clamps=clamps)

    decision = types.Decision(
        model=policy.key,
        at=now,
        current=current,
        desired=desired,
        recommendation=raw if candidates else None,
        winner=winner,
        signals=tuple(o.reason for o in opinions),
        clamps=tuple(clamps),
        forecast=fc,
        held=bool(stale),
        notes=tuple(notes),
    )
    new_state = _remember(spec, state=state, raw=raw, decision=decision, samples=samples)
    return decision, new_state


def _forecast(
    spec: model.ScalePolicySpec,
    *,
    cluster: types.ClusterState,
    samples: tuple[types.DemandSample, ...],
    times: forecast.StartTimes,
    now: float,
    demand_now: float | None,
) -> types.Forecast | None:
    """Demand at the time a replica started now would be ready.

    Time to ready = pod start (pull + load + readiness, learned when observed), plus a node
    boot when the replicas to add do not fit on free GPUs. Example: a 70B TP8 replica with
    no free node: 300 s boot + 120 s pull + 90 s load + 20 s readiness = 530 s; demand
    rising 0.01 replicas/s over a 300 s window is then planned 0.01 x min(530, 300) = 3
    replicas higher than now (never further ahead than the history seen).
    """
    if demand_now is None:
        return None
    to_add = max(1, recommend.ceil_replicas(demand_now) - cluster.ready - len(cluster.starting))
    needs_node = cluster.free_replica_slots is not None and cluster.free_replica_slots < to_add
    time_to_ready = times.pod_start_s + (times.node_boot_s if needs_node else 0.0)
    # A trend needs half a window of history: 60 s of a 120 s window.
    trend = forecast.fit_trend(samples, now=now, min_span_s=spec.forecast.window_seconds / 2)
    if trend is None or not spec.forecast.enabled:
        trend = forecast.Trend(level=demand_now, slope_per_s=0.0)
    node_boot = 0.0 if needs_node else times.node_boot_s
    at_ready = trend.at(time_to_ready)
    at_node_ready = trend.at(time_to_ready + node_boot)
    return types.Forecast(
        time_to_ready_s=time_to_ready,
        needs_node=needs_node,
        demand_now=trend.level,
        slope_per_s=trend.slope_per_s,
        demand_at_ready=at_ready,
        replicas_at_ready=recommend.ceil_replicas(at_ready),
        replicas_at_node_ready=recommend.ceil_replicas(at_node_ready),
    )


# Weight of a new observation in the learned load per request: about the last 10 s of
# one-second samples. Requests/s below MIN_RATE say too little about the load of one.
LOAD_WEIGHT = 0.1
MIN_RATE = 0.5
# The drain time is estimated from the load learned at low utilisation, which overstates
# what a saturated replica serves (long prompts and full KV caches); the estimate is
# multiplied by this before it is trusted to make a node boot unnecessary.
DRAIN_SAFETY = 2.0


def _learn_load_per_request(
    spec: model.ScalePolicySpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    state: types.EngineState,
    demand_now: float | None,
) -> types.EngineState:
    """Learn how many replicas one request per second needs, while that can be seen.

    Only when there is an arrival rate and the model is not saturated (at most one request
    waiting per ready replica): then demand is load, not backlog. Example: 5 req/s with
    demand 0.68 replicas -> 0.136 replicas per req/s, so a jump to 40 req/s needs 5.4.
    """
    rate = snapshot.arrival_rate
    waiting = snapshot.queue_depth
    if (demand_now is None or rate is None or rate.age_s > spec.stale_after_seconds
            or not rate.value >= MIN_RATE or cluster.ready == 0 or waiting is None
            or waiting.age_s > spec.stale_after_seconds):
        return state
    if recommend.saturated(spec, snapshot=snapshot, ready=cluster.ready):
        return state
    sample = demand_now / rate.value
    old = state.replicas_per_request_rate
    learned = sample if old is None else old + LOAD_WEIGHT * (sample - old)
    return dataclasses.replace(state, replicas_per_request_rate=learned)


@dataclass(frozen=True, slots=True)
class _Cap:
    replicas: int
    detail: str


def _backlog_cap(
    spec: model.ScalePolicySpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    state: types.EngineState,
    node_ready_s: float,
) -> _Cap | None:
    """Boot no node for a backlog that capacity already there (or starting) will drain first.

    A flash crowd builds a queue while new replicas start; the backlog signals (waiting,
    running + waiting, p95) keep rising because capacity has not arrived yet, not because
    load grew. Replicas beyond the free GPUs need a node boot and arrive minutes later,
    after the backlog is gone, then sit out the down window. So while there is a backlog
    (more waiting than ready replicas), the count may go past what exists or fits on free
    GPUs only as far as the arrival rate needs (requests/s x the learned load of one),
    unless the backlog would outlast a node boot at the spare capacity's drain rate.
    Example: 1 ready + 7 starting, no free GPU, 40 req/s x 0.127 = 5.1 replicas needed,
    3,000 waiting: spare (8 - 5.1) replicas drain 3,000 / (2.9 / 0.127) = 131 s < 330 s
    to boot a node, so capped at 8 rather than the 32 the backlog asks for. A step that
    the replicas on hand cannot carry (need >= ready + starting) is never held back.
    Without an arrival rate or a learned load, no cap.
    """
    rate = snapshot.arrival_rate
    waiting = snapshot.queue_depth
    per_rate = state.replicas_per_request_rate
    if (cluster.free_replica_slots is None or per_rate is None or per_rate <= 0
            or rate is None or rate.age_s > spec.stale_after_seconds
            or waiting is None
            or not recommend.saturated(spec, snapshot=snapshot, ready=cluster.ready)):
        return None
    need = rate.value * per_rate
    on_hand = cluster.ready + len(cluster.starting)
    spare_rate = (on_hand - need) / per_rate          # requests/s beyond the arrivals
    drain_s = DRAIN_SAFETY * waiting.value / spare_rate if spare_rate > 0 else math.inf
    if drain_s >= node_ready_s:
        return None
    fast = on_hand + cluster.free_replica_slots
    replicas = max(cluster.current, fast, recommend.ceil_replicas(need))
    return _Cap(replicas, f"{waiting.value:g} waiting drain in about {drain_s:.0f} s at "
                f"{rate.value:.3g} req/s, before a node could boot ({node_ready_s:.0f} s): "
                "no node for the backlog")


def _bound(
    spec: model.ScalePolicySpec,
    *,
    cluster: types.ClusterState,
    desired: int,
    now: float,
    clamps: list[types.Clamp],
) -> int:
    warm = spec.warm_floor.at(now)
    floor, floor_name = (warm, "warm_floor") if warm > spec.replicas.min else (
        spec.replicas.min, "min")
    if desired < floor:
        clamps.append(types.Clamp(floor_name, desired, floor, f"{floor_name} is {floor}"))
        desired = floor
    caps = [(spec.replicas.max, "max", f"replicas.max is {spec.replicas.max}")]
    per_replica = spec.resources.gpus_per_replica
    if spec.budget is not None:
        caps.append((spec.budget.max_gpus // per_replica, "budget",
                     f"budget of {spec.budget.max_gpus} GPUs"))
    if cluster.budget_gpus is not None:
        caps.append((cluster.budget_gpus // per_replica, "external_budget",
                     f"tenant or pool budget of {cluster.budget_gpus} GPUs"))
    for cap, name, detail in caps:
        if desired > cap:
            clamps.append(types.Clamp(name, desired, cap, detail))
            desired = cap
    return desired


def _remember(
    spec: model.ScalePolicySpec,
    *,
    state: types.EngineState,
    raw: int,
    decision: types.Decision,
    samples: tuple[types.DemandSample, ...],
) -> types.EngineState:
    """Keep only what the windows need: memory is bounded by time, not by call count."""
    now = decision.at
    behavior = spec.behavior
    keep_recs = max(behavior.scale_up.stabilization_seconds,
                    behavior.scale_down.stabilization_seconds)
    keep_events = max(
        [r.period_seconds for r in (*behavior.scale_up.policies, *behavior.scale_down.policies)]
        or [0]
    )
    recommendations = tuple(r for r in state.recommendations if r.at > now - keep_recs)
    recommendations = (*recommendations, types.Recommendation(at=now, replicas=raw))
    events = tuple(e for e in state.events if e.at > now - keep_events)
    if decision.desired != decision.current:
        events = (*events, types.ScaleEvent(at=now, delta=decision.desired - decision.current))
    return dataclasses.replace(
        state,
        recommendations=recommendations,
        events=events,
        demand=samples,
        last_desired=decision.desired,
    )
