"""The decision: policy, signals, cluster state, engine state and time in; decision out.

Pure: no I/O, no clock, no asyncio. The same function runs in the service and the
simulator. The caller keeps the returned state once the decision is applied (or logged
in dry-run); if applying fails, it keeps the old state and decides again.

`decide` is a pipeline of named steps (`types.StepName`) over a resolved policy
(`spec.EngineSpec`); each step reads and extends one draft and records what it made of
the count, so a rule can be read, tested and changed alone.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from scaler.engine import forecast, recommend, spare, stabilize, types
from scaler.engine import spec as engine_spec
from scaler.policy import model

Rule = types.Rule
Kind = types.OpinionKind
ClampName = types.ClampName
# A recommendation's `load`, read in C over a window (60 entries at one decision per 5 s):
# no copy of the window when none has one.
_LOAD = operator.attrgetter("load")
_TOLERATED = operator.attrgetter("tolerated")


def decide(
    policy: model.ScalePolicy | engine_spec.EngineSpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    state: types.EngineState,
    now: float,
) -> tuple[types.Decision, types.EngineState]:
    """Decide the replicas for one model at `now` (epoch seconds)."""
    spec = policy if isinstance(policy, engine_spec.EngineSpec) else engine_spec.resolve(policy)
    draft = Draft(spec=spec, snapshot=snapshot, cluster=cluster, state=state, now=now,
                  backlog=state.backlog)
    for name, step in PIPELINE:
        detail = step(draft)
        draft.steps.append(types.Step(name, draft.desired, detail))
    decision = types.Decision(
        model=spec.key,
        at=now,
        current=cluster.current,
        desired=draft.count(),
        recommendation=draft.raw,
        winner=draft.winner,
        signals=tuple([o.reason for o in draft.opinions]),
        clamps=tuple(draft.clamps),
        forecast=draft.forecast,
        held=bool(draft.stale),
        notes=tuple(draft.notes),
        steps=tuple(draft.steps),
        cut_warning=spare.cut_warning(snapshot=draft.snapshot, cluster=cluster,
                                      desired=draft.count()),
    )
    return decision, _remember(draft, decision)


@dataclass
class Draft:
    """The decision as the steps build it (local to one `decide` call: pure overall)."""

    spec: engine_spec.EngineSpec
    snapshot: types.SignalSnapshot
    cluster: types.ClusterState
    state: types.EngineState
    now: float
    opinions: list[recommend.Opinion] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    clamps: list[types.Clamp] = field(default_factory=list)
    steps: list[types.Step] = field(default_factory=list)
    demand_now: float | None = None
    times: forecast.StartTimes | None = None
    samples: tuple[types.DemandSample, ...] = ()
    # The flow balance's window, stored with the other windows by `_remember`: one copy
    # of the 17-field EngineState a decision fewer (about a tenth of `decide`).
    backlog: tuple[types.BacklogSample, ...] = ()
    forecast: types.Forecast | None = None
    draining: bool = False
    cycle_hold_s: float | None = None  # the down window while a cycle's need is planned
    cycle_keep: int | None = None  # ... and the count no release goes below meanwhile
    backlogged: bool = False  # overloaded or draining: backlog readings are not load
    held_to_load: bool = False  # some backlog reading read more than load + draining
    steady: bool = True  # unless the flow balance sees the system grow or shrink
    climbing: bool = False  # demand read more than the tolerance above a minute before
    raw: int | None = None
    load_raw: int | None = None  # the recommendation without the backlog's drain term
    tolerated: int | None = None  # one less than raw, when its tolerance keeps the reading
    winner: Rule | None = None
    desired: int | None = None

    def count(self) -> int:
        """The count so far: the current one until a recommendation exists."""
        return self.cluster.current if self.desired is None else self.desired

    def clamp(self, name: ClampName, after: int, detail: str) -> None:
        self.clamps.append(types.Clamp(name, self.count(), after, detail))
        self.desired = after


# -- the steps ------------------------------------------------------------------------


def read_signals(draft: Draft) -> str:
    """Each configured signal's opinion (concurrency, queue, tokens/s, latency guard)."""
    draft.opinions = recommend.signal_opinions(draft.spec, snapshot=draft.snapshot,
                                               cluster=draft.cluster, now=draft.now)
    draft.stale = [o.rule for o in draft.opinions
                   if o.kind is not Kind.GUARD and not o.reason.fresh]
    fresh = sum(1 for o in draft.opinions if o.reason.fresh)
    return f"{fresh} of {len(draft.opinions)} signals fresh" + (
        f"; stale or missing: {', '.join(draft.stale)}" if draft.stale else "")


def estimate_load(draft: Draft) -> str:
    """Demand now, in fractional replicas: the max over the fresh capacity measures.

    Queue pressure is left out: a queue builds while capacity lags and drains once it
    arrives, so its swings are the scaler's own echo, not a change in load. It is the
    demand only when nothing else is set. Under overload the arrival rate joins, sized
    by the load of one request learned while the model was not overloaded, and the
    readings that count the backlog are held to load plus draining it (`size_for_load`).
    """
    draft.times, draft.state = forecast.learn_start_times(
        draft.spec, state=draft.state, observations=draft.cluster.observations)
    overloaded = recommend.overloaded(draft.spec, snapshot=draft.snapshot,
                                      ready=draft.cluster.ready)
    if overloaded:
        draft.state = dataclasses.replace(draft.state, overloaded_at=draft.now)
    usage = _cache_usage(draft.snapshot)
    memory_full = usage >= (KV_STILL_FULL if draft.state.saturated_since is not None
                            else KV_FULL)
    served = learn_served_share(draft, saturated=overloaded or memory_full)
    draft.draining = not overloaded and _draining(draft)
    flow = flow_balance(draft)
    backlogged = draft.backlogged = overloaded or draft.draining
    demand_now = _capacity_demand(draft.opinions)
    if not backlogged and draft.steady:
        draft.state = learn_load(draft.spec, snapshot=draft.snapshot, cluster=draft.cluster,
                                 state=draft.state, demand_now=demand_now)
    elif draft.state.replicas_per_request_rate is None:
        draft.state = seed_load(draft)
    per_rate = draft.state.replicas_per_request_rate
    arrival = recommend.arrival_rate(snapshot=draft.snapshot,
                                     replicas_per_request_rate=per_rate,
                                     backlogged=backlogged)
    detail = "draining a backlog" if draft.draining and not overloaded else ""
    if arrival is not None and arrival.demand is not None and per_rate is not None:
        draft.opinions.append(arrival)
        detail = "; ".join(p for p in (
            detail, size_for_load(draft, load=arrival.demand, per_rate=per_rate)) if p)
        # The load, not the backlog, is what the look-ahead extrapolates: the drain term
        # shrinks as the queue goes, so its growth while replicas start is no trend.
        demand_now = max([arrival.demand] + [
            o.demand for o in draft.opinions if o.kind is Kind.CAPACITY
            and o.rule not in BACKLOG_READINGS and o.demand is not None])
    draft.demand_now = demand_now
    if demand_now is None:
        return "no demand signal"
    return "; ".join(part for part in (f"demand {demand_now:.2f} replicas", flow, served,
                                       detail) if part)


# Overloaded this long with the same ready replicas before what they serve is their
# capacity: the tokens/s rates (a Prometheus rate() over 30 s to 1 m, a replica's own
# window) must cover the saturated time, not the minute before it.
SATURATION_SETTLE_S = 30.0
# A KV cache this full admits no more requests: the replicas are saturated by memory,
# with or without a queue beyond the overload bound (vLLM keeps a few blocks free as a
# watermark, so a full cache reads 0.95-0.99).
KV_FULL = 0.95
# Once saturated, the replicas stay so while the caches' mean is at least this: with
# requests waiting for room, a full cache's mean swings between 0.90 and 0.99 as answers
# end and waiting requests take their blocks. Read against KV_FULL alone, saturation
# flickered off every few seconds and never lasted SATURATION_SETTLE_S, so on half
# 6k-token prompts the served share was never learned (bimodal seed 1: 7 replicas at
# 0.93 to 0.98 with 1 to 16 waiting, from 171 to 264 s).
KV_STILL_FULL = 0.90


def _cache_usage(snapshot: types.SignalSnapshot) -> float:
    """The fresh mean KV-cache usage, or 0 when there is none (no cache read is full)."""
    usage = snapshot.kv_cache_usage
    return usage.value if usage is not None and usage.fresh else 0.0


# Weight of a new saturated sample in the served share (about the last 10 samples), and
# the share's bounds: a capacity model off by more than 2x is a wrong policy, not a mix.
SERVED_WEIGHT = 0.1
SERVED_BOUNDS = (0.5, 2.0)


def learn_served_share(draft: Draft, *, saturated: bool) -> str:
    """The tokens/s capacity model, checked against what saturated replicas serve.

    A queue beyond the overload bound, or a KV cache at KV_FULL (once saturated, down to
    KV_STILL_FULL), means every ready replica is busy (in compute or in memory), so the work
    they produce is their capacity on today's mix: 7 replicas of half 6k-token prompts
    filled 98 % of their caches with 31 waiting, under the queue's bound of 56, while
    serving 0.87 of the model. In capacity-model units (the tokens opinion x its utilisation
    target / ready replicas) that is 1 when the model is right. Measured: 5 replicas
    saturated on half 6k-token prompts served 0.875 of it (prefill interleaved with decode
    costs more than the two capacities add up to), so 7 replicas sized by the model ran out
    at 31 req/s; on chat-sized prompts 2 replicas served 1.10. The share rescales the tokens
    opinion (and the learned load of a request, which was sized by the model) from then on,
    in both directions, bounded by SERVED_BOUNDS.
    Only while the ready count is the one the overload began with, for SATURATION_SETTLE_S
    first: a backlog stays on the replicas that held it when new ones become ready, which
    then serve only new arrivals (a flash crowd's 8 ready replicas served 0.5 of the model
    while one old replica worked off 4,000 queued).
    """
    state, cluster, spec = draft.state, draft.cluster, draft.spec
    tokens = next((o for o in draft.opinions if o.rule is Rule.TOKENS_PER_SECOND), None)
    if tokens is None or spec.tokens is None:
        return ""
    work = tokens.demand
    if work is None:
        return ""
    if not saturated or cluster.ready == 0:
        if state.saturated_since is not None:
            draft.state = dataclasses.replace(state, saturated_since=None, saturated_ready=0)
    elif state.saturated_since is None:
        draft.state = dataclasses.replace(state, saturated_since=draft.now,
                                          saturated_ready=cluster.ready)
    elif state.saturated_ready != cluster.ready:
        if state.saturated_ready:
            draft.state = dataclasses.replace(state, saturated_ready=0)
    elif draft.now - state.saturated_since >= SATURATION_SETTLE_S:
        sample = work * spec.tokens.target_utilization / cluster.ready
        low, high = SERVED_BOUNDS
        old = state.served_share
        count = state.served_samples + 1
        learned = min(high, max(low, old + max(SERVED_WEIGHT, 1 / count) * (sample - old)))
        # The load of one request, as saturated replicas serve it: ready / completions,
        # in the same units as the tokens opinion (seed_load's ratio, rescaled): 5
        # replicas finishing 21.6 req/s at 0.8 utilisation are 0.29 replicas per req/s,
        # where the model had learned 0.22 at a lower load.
        per_rate = state.replicas_per_request_rate
        completed = draft.snapshot.completion_rate
        if completed is not None and completed.fresh and completed.value >= MIN_RATE:
            served = work / learned / completed.value
            per_rate = served if per_rate is None else (
                per_rate + max(SERVED_WEIGHT, 1 / count) * (served - per_rate))
        elif per_rate is not None:
            per_rate = per_rate * old / learned  # sized by the model: follows its share
        draft.state = dataclasses.replace(state, served_share=learned, served_samples=count,
                                          replicas_per_request_rate=per_rate)
    share = draft.state.served_share
    if abs(share - 1) < 0.005:
        return ""
    why = f"/ {share:.2f}: saturated replicas were seen to serve {share:.0%} of it"
    draft.opinions = [o.restated(work / share, why) if o is tokens else o
                      for o in draft.opinions]
    return f"tokens/s capacity model x {share:.2f}, as served when saturated"


def _draining(draft: Draft) -> bool:
    """Within one drain time of an overload: the backlog it built is still being served.

    Once capacity arrives the queue empties into the replicas' batches, so the requests
    running count the backlog, not the load, until it is worked off: a step to 43 req/s
    that queued 900 reads 920 running = 92 replicas at 10 per replica where the load
    needs 4.3. For one drain time (pod start + DRAIN_WINDOW_S, the time the backlog is
    sized to drain in) after the last overload, the count is sized as under overload: to
    the arrival rate plus draining. A load that falls without an overload before it is
    load, and the count follows what the signals read.
    """
    overloaded_at, times = draft.state.overloaded_at, draft.times
    return (overloaded_at is not None and times is not None
            and draft.now - overloaded_at <= times.pod_start_s + DRAIN_WINDOW_S)


# The backlog's growth is fitted over this many seconds: long enough to see a trend through
# the second-to-second swings of continuous batching, short enough to follow a step.
FLOW_WINDOW_S = 30.0
# The requests in the system changing by at most this share of the completions per second
# is a steady state, where the load of one request can be learned. Example: a square
# wave's load leaving: 200 in flight empty in 20 s while 10/s finish: -10/s, not steady;
# the learned load would otherwise sink towards 0 as the replicas run dry.
STEADY_SHARE = 0.2


def flow_balance(draft: Draft) -> str:
    """Where no source reports the arrival rate, estimate it from what replicas report.

    Flow balance: what arrives either finishes or stays, so arrivals = completions/s +
    the growth of the requests in the system (waiting + running) per second. Example:
    replicas finish 13 req/s while waiting + running grows from 200 to 1,100 in 30 s:
    13 + 30 = 43 req/s arrive. The estimate then feeds the same rules as a measured rate
    (the load of a request, sizing for load and the backlog cap).
    """
    snapshot, now = draft.snapshot, draft.now
    completed, waiting, running = (snapshot.completion_rate, snapshot.queue_depth,
                                   snapshot.in_flight)
    if (completed is None or not completed.fresh or waiting is None or not waiting.fresh
            or running is None or not running.fresh):
        draft.backlog = ()
        return ""
    history = tuple(b for b in draft.backlog if b.at > now - FLOW_WINDOW_S)
    history = (*history, types.BacklogSample(at=now, requests=waiting.value + running.value,
                                             completion_rate=completed.value))
    draft.backlog = history
    # Completions and growth over the same window: the growth fitted over 30 s lags a
    # change by about half of it, and today's completions beside it would count a drain
    # that has just begun as arrivals (63 finished/s + 28/s growth of the queue before).
    growth = forecast.slope([(b.at, b.requests) for b in history]) or 0.0
    finished = math.fsum(b.completion_rate / len(history) for b in history)  # no overflow
    # Steady: the requests in the system neither grow nor shrink by more than a fifth of
    # what finishes. Only then do the demand readings (which count what is in the
    # system) and the arrival rate describe the same requests.
    # And only once the window is half full: two samples a second apart fit no growth.
    covered = history[-1].at - history[0].at >= FLOW_WINDOW_S / 2
    draft.steady = covered and abs(growth) <= STEADY_SHARE * max(finished, MIN_RATE)
    if snapshot.arrival_rate is not None and snapshot.arrival_rate.fresh:
        return ""  # measured: nothing to estimate
    estimate = max(0.0, finished + growth)
    draft.snapshot = dataclasses.replace(snapshot, arrival_rate=types.SignalValue(
        value=estimate, age_s=max(completed.age_s, waiting.age_s, running.age_s), fresh=True))
    return (f"arrival rate by flow balance: {finished:.3g} finished/s "
            f"{growth:+.3g}/s backlog = {estimate:.3g} req/s")


def _capacity_demand(opinions: list[recommend.Opinion]) -> float | None:
    demand_opinions = [o for o in opinions if o.kind is not Kind.GUARD]
    capacity = [o for o in demand_opinions if o.kind is Kind.CAPACITY] or demand_opinions
    values = [o.demand for o in capacity if o.demand is not None]
    return max(values) if values else None


# The backlog is to be drained by the time replicas started now are ready plus one SLO
# window (60 s, the window p95 is judged over): sooner is impossible with new replicas,
# later keeps missing windows.
DRAIN_WINDOW_S = 60.0


BACKLOG_READINGS = frozenset({Rule.CONCURRENCY, Rule.QUEUE_DEPTH, Rule.P95_LATENCY,
                              Rule.TOKENS_PER_SECOND, Rule.KV_CACHE})
"""Opinions that read the backlog while a model is overloaded or draining: the requests
waiting and running, the latency guard (whose waits are the backlog's), tokens/s
(replicas working off a backlog produce at full speed: a step's drain read 9 replicas of
tokens where its load needed 6) and the KV cache (full on every replica that holds a
backlog: each new replica filled would read ready / target again)."""


def size_for_load(draft: Draft, *, load: float, per_rate: float) -> str:
    """Size for load, not backlog: the readings that count waiting requests (and the
    latency guard, which reads their waits) are held to the replicas the arrivals need
    plus those that drain the backlog in time: that is what restores the SLO.

    At a step one saturated replica's queue and running count grow with the backlog, not
    with the load: queue pressure asked for 24 replicas where 3 carried the new rate.
    Load = requests/s x replicas per request/s; draining Q waiting within T seconds takes
    Q x (replicas per request/s) / T more, T = pod start + DRAIN_WINDOW_S. Example: 44
    req/s x 0.1 = 4.4 replicas, 830 waiting, T = 105 + 60 s: 830 x 0.1 / 165 = 0.5 more:
    5 replicas, where the queue alone read 104.
    Where the queue lives decides what more replicas do (`_shared_drain`): requests
    waiting at a replica (vLLM's, pushed to it) stay there, and new replicas only take
    the new arrivals; a shared queue (a JetStream work queue) is drained by every replica.
    """
    waiting = draft.snapshot.queue_depth
    times = draft.times
    if waiting is None or not waiting.fresh or times is None:
        return ""
    drain_s = times.pod_start_s + DRAIN_WINDOW_S
    cap = load + waiting.value * per_rate / drain_s
    why = (f"held to load {load:.2f} + draining {waiting.value:g} waiting in "
           f"{drain_s:.0f} s = {cap:.2f} replicas")
    queued = draft.snapshot.shared_waiting
    shared = min(queued.value, waiting.value) if queued is not None and queued.fresh else 0.0
    if shared > 0:
        own = (waiting.value - shared) * per_rate / drain_s
        cap, why = _shared_drain(draft, cap=cap, load=load + own, shared=shared,
                                 per_rate=per_rate)
    capped = False
    for index, held in enumerate(draft.opinions):
        if (held.rule in BACKLOG_READINGS and held.demand is not None
                and held.demand > cap):
            draft.opinions[index] = held.restated(cap, why)
            capped = True
            # Held beyond the tolerance: not by the few percent the learned load of a
            # request is off (7.3 read where 6.8 is learned is no backlog).
            if held.demand > cap * (1 + draft.spec.tolerance):
                draft.held_to_load = True
    return why if capped else ""


def _shared_drain(draft: Draft, *, cap: float, load: float, shared: float,
                  per_rate: float) -> tuple[float, str]:
    """The replicas that drain a shared queue in time: (the count, why), never below
    `cap` (the whole queue drained over a pod start + DRAIN_WINDOW_S); `load` is the
    arrivals' replicas and the drain of the replicas' own queues.

    A replica started now is ready in a pod start and finds the queue as it will be then:
    the requests waiting now, plus arrivals less completions per second until then, less
    what the replicas already starting take once they are ready (at full speed: a
    replica with a queue before it runs flat out). It must be drained within
    DRAIN_WINDOW_S of that, or new arrivals, which wait behind it, miss their SLO window
    after window. The drain term is that backlog x (replicas per request/s) /
    DRAIN_WINDOW_S, bought only as far as replicas are there or fit on free GPUs: a
    replica that needs a node boot arrives after a backlog it was bought for
    (`limit_backlog` decides nodes).
    Example: 60 req/s x 0.088 = 5.3 replicas of load; 2 ready replicas finish 28 req/s
    with 219 waiting, none starting, 6 GPUs free: in the 105 s a pod takes the queue
    grows 32/s to 219 + 32 x 105 = 3,579, and draining that in 60 s takes 3,579 x 0.088
    / 60 = 5.2 more: 10.5, bought as far as the 8 that fit (the drain of 219 spread over
    165 s read 5.4).
    """
    snapshot, cluster, times = draft.snapshot, draft.cluster, draft.times
    assert times is not None
    rate, completed = snapshot.arrival_rate, snapshot.completion_rate
    growth = (rate.value - completed.value if rate is not None and rate.fresh
              and completed is not None and completed.fresh else 0.0)
    horizon = times.pod_start_s
    full_rate = 1.0 / (per_rate * _target(draft.spec))
    relief = full_rate * math.fsum(
        max(0.0, horizon - max(0.0, created + times.pod_start_s - draft.now))
        for created in cluster.starting)
    at_ready = max(0.0, shared + growth * horizon - relief)
    no_node = _without_a_node(cluster)
    wanted = load + at_ready * per_rate / DRAIN_WINDOW_S
    shared_cap = max(cap, min(wanted, no_node))
    return shared_cap, (
        f"held to load {load:.2f} + draining the shared queue: {shared:g} waiting "
        f"{growth:+.3g}/s are {at_ready:.0f} when a pod started now is ready in "
        f"{horizon:.0f} s; draining them in {DRAIN_WINDOW_S:.0f} s asks {wanted:.2f}, "
        f"{no_node} without a node = {shared_cap:.2f} replicas")


def _target(spec: engine_spec.EngineSpec) -> float:
    """The share of full speed the load is sized at (tokens/s `targetUtilization`, else
    1): replicas working off a backlog run flat out, 1 / target times that."""
    return spec.tokens.target_utilization if spec.tokens else 1.0


def _without_a_node(cluster: types.ClusterState) -> int:
    """The replicas there are without a node boot: ready, starting, and those fitting on
    free GPUs (none where that is unknown)."""
    return cluster.ready + len(cluster.starting) + (cluster.free_replica_slots or 0)


def look_ahead(draft: Draft) -> str:
    """Cold-start look-ahead: learned start times, the demand trend, demand when ready."""
    spec = draft.spec
    samples = draft.state.demand
    if draft.demand_now is not None:
        samples = (*samples, types.DemandSample(at=draft.now, demand=draft.demand_now))
    draft.samples = forecast.window(samples, now=draft.now, seconds=spec.forecast_window_s)
    draft.climbing = _climbing(draft)
    draft.state = forecast.check_forecast(draft.state, now=draft.now,
                                          demand_now=draft.demand_now)
    draft.forecast = _forecast(draft)
    returning = "; ".join(p for p in (expect_return(draft), cycle_ahead(draft)) if p)
    fc = draft.forecast
    if fc is None:
        return returning or "no demand to forecast"
    if spec.forecast_enabled:
        draft.state = forecast.register_forecast(draft.state, fc, now=draft.now)
    trust = "" if fc.horizon_scale >= 0.999 else f", {fc.horizon_scale:.0%} of the trend " \
        "trusted after past overshoots"
    kind = "; a step, not a ramp" if fc.step else ""
    if fc.recent:
        kind += f"; the trend held to its last {FLOW_WINDOW_S:.0f} s, which rose less"
    if fc.drop_in_s is not None:
        kind += (f"; the load falls away in {fc.drop_in_s:.0f} s, as it has every "
                 f"{draft.state.drop_cycle_s or 0:.0f} s: the trend ends there")
    return (f"ready in {fc.time_to_ready_s:.0f} s: demand {fc.demand_now:.2f} -> "
            f"{fc.demand_at_ready:.2f} replicas{trust}{kind}"
            + (f"; {returning}" if returning else ""))


def recommend_replicas(draft: Draft) -> str:
    """The largest opinion (signals, forecast, latency guard); none: hold the current count.

    The HPA's tolerance: a capacity measure within 10 % of the current count changes
    nothing, so demand hovering at a boundary (5.9, 6.1, 5.8 replicas) does not flap the
    count. The queue and latency guards are exempt: they act on pressure.
    A rise of more than one replica buys the smallest count whose tolerance holds the
    reading: 9.5 replicas of demand on 8 buys 9, which then holds it (within 10 %), where
    rounding up bought a tenth replica that the down window held for 300 s (on a steep
    ramp, 14 % of the run's GPU-hours). Not while a backlog is served (its sizing is its
    own), and not when the KV cache or a queue or latency guard asks for the larger count.
    """
    current, spec = draft.cluster.current, draft.spec
    demands: list[tuple[Rule, float]] = [
        (o.rule, o.demand) for o in draft.opinions if o.demand is not None]
    fc = draft.forecast
    if fc is not None and spec.forecast_enabled and fc.replicas_at_ready > 0:
        demands.append((Rule.FORECAST, fc.demand_at_ready))
    if spec.headroom_replicas or spec.headroom_fraction:
        # Spare capacity rides on the capacity measures (and their forecast), never on
        # the queue and latency guards, which already measure a shortfall.
        demands = [(rule, spec.with_headroom(demand) if rule.kind is Kind.CAPACITY
                    else demand) for rule, demand in demands]
        draft.notes.append(f"headroom: capacity demand x {1 + spec.headroom_fraction:g} "
                           f"+ {spec.headroom_replicas} replicas")
    candidates = [(recommend.ceil_replicas(demand), rule, demand) for rule, demand in demands]
    if not candidates:
        draft.raw, draft.winner, draft.desired = None, None, current
        draft.notes.append("no signal has an opinion: holding the current count")
        if draft.stale:
            draft.notes.append("stale or missing: " + ", ".join(draft.stale))
        return "no opinion: hold"
    # On a tie the signal, not the forecast, is named: it is the plainer reason; among
    # signals, the one reading the most.
    raw, winner, raw_demand = max(candidates,
                                  key=lambda c: (c[0], c[1] is not Rule.FORECAST, c[2]))
    # The tolerance is judged on the largest capacity reading of that count, whichever is
    # named: tokens/s at 2.02 is within 10 % of 2 replicas, a KV cache at 2.25 is not, and
    # neither is a look-ahead to 9.95 beside a signal at 9.5 on 9.
    judged = winner
    if winner.kind is Kind.CAPACITY:
        _, judged, raw_demand = max([c for c in candidates
                                     if c[0] == raw and c[1].kind is Kind.CAPACITY],
                                    key=lambda c: c[2])
    tolerance = draft.spec.tolerance
    within_tolerance = unconfirmed = False
    if winner.kind is Kind.CAPACITY and current > 0 and raw != current:
        within_tolerance = abs(raw_demand / current - 1) <= tolerance
        unconfirmed = (not within_tolerance and raw > current
                       and not _rise_confirmed(draft, current=current, demand=raw_demand))
    if within_tolerance:
        draft.notes.append(f"{judged} at {raw_demand:.2f} replicas is within "
                           f"{tolerance:.0%} of {current}: no change")
    elif unconfirmed:
        draft.notes.append(f"{judged} at {raw_demand:.2f} replicas is a rise the "
                           f"utilisation margin absorbs, not yet read for "
                           f"{_confirm_s(spec):.0f} s with the replicas unstrained: no change")
    if within_tolerance or unconfirmed:
        # The capacity measure changes nothing; the queue and latency guards still may.
        raw = max([current] + [r for r, rule, _ in candidates
                               if rule.kind is not Kind.CAPACITY])
    elif (raw > current + 1 and winner.kind is Kind.CAPACITY and not draft.backlogged
          and raw_demand <= (raw - 1) * (1 + tolerance)
          and not _strain_asks(candidates, raw)):
        # A rise buys the count the tolerance would then hold, not one more.
        draft.notes.append(f"{judged} at {raw_demand:.2f} replicas is within "
                           f"{tolerance:.0%} of {raw - 1}: {raw - 1} bought, not {raw}")
        raw -= 1
    draft.raw, draft.winner, draft.desired = raw, winner, raw
    draft.tolerated = tolerated_count(draft, candidates=candidates, judged=judged,
                                      demand=raw_demand)
    if draft.tolerated is not None:
        draft.notes.append(f"{judged} at {raw_demand:.2f} replicas would not raise "
                           f"{draft.tolerated}: the down window holds {draft.tolerated}")
    if draft.backlogged:
        # Only where the load is known: the arrival rate sized by the learned load. What
        # the window keeps of it is the count its tolerance would hold, as a rise buys:
        # a reading of 4.3 replicas is 4 (within 10 %), not 5.
        load = [demand for _, rule, demand in candidates
                if rule.kind is Kind.CAPACITY and rule not in BACKLOG_READINGS]
        if any(rule is Rule.ARRIVAL_RATE for _, rule, _ in candidates):
            draft.load_raw = min(raw, recommend.ceil_replicas(max(load) / (1 + tolerance)))
    return f"{raw} replicas ({winner}" + ("; a rise within the margin, not yet confirmed)"
                                         if unconfirmed else ")")


def _strain_asks(candidates: list[tuple[int, Rule, float]], count: int) -> bool:
    """Whether the KV cache, or a queue or latency guard, asks for `count` replicas or
    more: what they read is pressure (or memory's margin, which is not compute's), so
    the tolerance of a capacity reading never takes a replica they ask for."""
    return any(asked >= count for asked, rule, _ in candidates
               if rule.kind is not Kind.CAPACITY or rule is Rule.KV_CACHE)


def tolerated_count(draft: Draft, *, candidates: list[tuple[int, Rule, float]],
                    judged: Rule, demand: float) -> int | None:
    """The count one below the recommendation when that count would hold this reading: its
    tolerance (10 %) keeps it, or the reading is a rise within its utilisation margin not
    yet confirmed (`_rise_confirmed`). The down window then holds that count, not the
    recommendation (None: the recommendation itself).

    The tolerance both ways. A reading of 2.05 replicas at 2 changes nothing, yet rounded
    up to 3 it held the third replica the whole down window once there: a 1,500-token
    answer load reading 1.9 to 2.4 replicas on 3 held all 3 for eight minutes, where 2
    carry it (KPA-style scaling ran 2 and met every window). Not for:
    - a rise (the recommendation above the count): what is bought is what is held;
    - a backlog being served, whose readings are not the load;
    - the KV cache, or a queue or latency guard, asking for the count (memory's margin is
      not compute's, and pressure is a shortfall already);
    - a load climbing (`_climbing`): the count it reads now may be short a minute on;
    - no down window, or one shorter than a pod start: a count bought would go at once,
      or before it is ready (with a 0 s window, 10 bought for 9.5 replicas and 9 kept the
      next second).
    """
    spec, raw, times = draft.spec, draft.raw, draft.times
    window = spec.behavior.scale_down.stabilization_seconds
    if (raw is None or raw < 2 or raw > draft.cluster.current or draft.backlogged
            or draft.climbing or judged.kind is not Kind.CAPACITY
            or judged is Rule.KV_CACHE or times is None
            or window <= 0 or window < times.pod_start_s):
        return None
    if _strain_asks(candidates, raw):
        return None
    lower = raw - 1
    if (demand <= lower * (1 + spec.tolerance)
            or not _rise_confirmed(draft, current=lower, demand=demand)):
        return lower
    return None


# Demand is climbing while it reads more than the tolerance above its reading this long ago
# (one of the yardstick's SLO windows; at most the forecast window the samples span).
CLIMB_S = 60.0


def _climbing(draft: Draft) -> bool:
    """Whether capacity demand reads more than `behavior.tolerance` above its reading
    CLIMB_S ago: load arriving, whose next minute may need what is held. False without a
    demand reading or a sample that old."""
    demand = draft.demand_now
    since = draft.now - min(CLIMB_S, draft.spec.forecast_window_s)
    before = None
    for sample in draft.samples:  # in time order
        if sample.at > since:
            break
        before = sample.demand
    return demand is not None and before is not None and demand > before * (
        1 + draft.spec.tolerance)


# A rise within the utilisation margin must be read this long before it buys a replica:
# two of a replica's 10 s rate windows, so that one window's swing is not enough.
RISE_CONFIRM_S = 20.0
# Strain that confirms a rise at once: more than this many requests waiting per ready
# replica, or a p95 above this share of the SLO.
STRAIN_WAITING_PER_REPLICA = 0.5
STRAIN_SLO_SHARE = 0.5


def _confirm_s(spec: engine_spec.EngineSpec) -> float:
    """How long a rise within the margin must be read: RISE_CONFIRM_S, or half the
    forecast window when that is shorter (the demand samples reach back one window, and
    `forecast.windowSeconds` may be 10 s)."""
    return min(RISE_CONFIRM_S, spec.forecast_window_s / 2)


def _rise_confirmed(draft: Draft, *, current: int, demand: float) -> bool:
    """Whether a capacity reading above the count (beyond the tolerance) is a rise to act
    on now, or a swing that the policy's utilisation margin absorbs.

    Replicas sized at `targetUtilization` 0.8 carry 1 / 0.8 = 1.25x their count at full
    speed, so a reading up to that is served while it lasts. Such a reading buys a
    replica only once every demand sample of the last RISE_CONFIRM_S was above the
    tolerance too, or at once when the replicas show strain (requests waiting, a p95
    towards the SLO, a KV cache beyond its target) or strain is unknown (no fresh queue
    or latency reading). A larger rise acts at once. Why: a 10 s tokens/s rate of a
    steady 40 req/s chat load swings by +-6 %, and the down window keeps the highest
    count of its 300 s, so one swing to 4.7 replicas where 3.9 are needed held a fifth
    replica for five minutes (square wave -14 % GPU-hours, Azure conv -9 %, no window
    lost at the suite's seeds: docs/benchmarks.md).
    Why a cache past its target is strain: memory's margin is not compute's. Replicas at
    0.8 of their tokens/s run slower as the load grows, but a cache past its target is
    close to full, and a full one admits no request (2 replicas of half 6k-token prompts
    at 92 % of their caches read 2 x 0.92 / 0.8 = 2.3 replicas of memory, within the
    tokens/s margin of 2.5: held for a confirmation, the third was bought half a minute
    later, with the caches full).
    Only with a tokens/s rule, whose target gives the margin. `demand` carries the
    policy's headroom, and so do the samples it is confirmed by.
    """
    spec, snapshot = draft.spec, draft.snapshot
    if spec.tokens is None or demand > current / spec.tokens.target_utilization:
        return True
    waiting, p95 = snapshot.queue_depth, snapshot.p95_latency
    if (waiting is None or not waiting.fresh
            or waiting.value > STRAIN_WAITING_PER_REPLICA * max(draft.cluster.ready, 1)):
        return True
    if spec.latency is not None and (p95 is None or not p95.fresh
                                     or p95.value > STRAIN_SLO_SHARE * spec.latency.slo_s):
        return True
    if spec.kv_cache is not None and _cache_usage(snapshot) > spec.kv_cache.target_utilization:
        return True
    since = draft.now - _confirm_s(spec)
    samples = draft.samples
    if not samples or samples[0].at > since:
        return False
    # The samples are the load; the reading compared with the count carries the headroom.
    bar = current * (1 + spec.tolerance)
    return all(spec.with_headroom(sample.demand) > bar for sample in samples
               if sample.at >= since)


# Weight of a new observation in the learned load per request: about the last 10 s of
# one-second samples. Requests/s below MIN_RATE say too little about the load of one.
LOAD_WEIGHT = 0.1
MIN_RATE = 0.5
# The drain time is estimated from the load learned at low utilisation, which overstates
# what a saturated replica serves (long prompts and full KV caches); the estimate is
# multiplied by this before it is trusted to make a node boot unnecessary.
DRAIN_SAFETY = 2.0


def limit_backlog(draft: Draft) -> str:
    """Boot no node for a backlog that capacity already there (or starting) will drain first.

    A flash crowd builds a queue while new replicas start; the backlog signals (waiting,
    running + waiting, p95) keep rising because capacity has not arrived yet, not because
    load grew. Replicas beyond the free GPUs need a node boot and arrive minutes later,
    after the backlog is gone, then sit out the down window. So while the model is
    overloaded, the count may go past what exists or fits on free GPUs only as far as the
    arrival rate needs (requests/s x the learned load of one), unless the backlog would
    outlast a node boot at the spare capacity's drain rate.
    The spare capacity is at full speed: the load is sized at the tokens/s target
    (`targetUtilization`, 0.8), but replicas working off a backlog run flat out (their
    tokens/s reads the same: a backlog reading, BACKLOG_READINGS), so 8 replicas carry
    8 / 0.8 = 10 replicas of load while they drain. Counted at the target, the spare
    left out that quarter: at a 5x flash crowd's peak (8.5 replicas of load on 9 to 10)
    it read 418 and 362 s of draining for 1,045 and 2,719 waiting, past a node boot (345
    s), and 3 replicas waited for a node until the crowd had gone (0.29 of the run's 2.56
    GPU-h); the 8 on the free GPUs drained it within a minute of being ready. Replicas
    that fit on free GPUs count too: the cap lets the count fill them, and they are
    ready a pod start from now, long before a node.
    Example: 1 ready + 7 starting, no free GPU, 40 req/s x 0.127 = 5.1 replicas needed,
    3,000 waiting: spare (8 / 0.8 - 5.1) replicas drain 3,000 / (4.9 / 0.127) = 78 s
    (156 s with DRAIN_SAFETY) < 330 s to boot a node, so capped at 8 rather than the 32
    the backlog asks for. A step that the replicas on hand and those fitting on free GPUs
    cannot carry even at full speed (need >= (ready + starting + free) / target) is never
    held back.
    Without an arrival rate or a learned load, no cap.
    """
    spec, snapshot, cluster, state = draft.spec, draft.snapshot, draft.cluster, draft.state
    assert draft.times is not None
    node_ready_s = draft.times.pod_start_s + draft.times.node_boot_s
    rate = snapshot.arrival_rate
    waiting = snapshot.queue_depth
    per_rate = state.replicas_per_request_rate
    if (draft.raw is None or cluster.free_replica_slots is None or per_rate is None
            or per_rate <= 0 or rate is None or not rate.fresh or waiting is None
            or not recommend.overloaded(spec, snapshot=snapshot, ready=cluster.ready)):
        return "no backlog cap"
    need = rate.value * per_rate
    no_node = _without_a_node(cluster)
    full_speed = no_node / _target(spec)
    spare_rate = (full_speed - need) / per_rate          # requests/s beyond the arrivals
    drain_s = DRAIN_SAFETY * waiting.value / spare_rate if spare_rate > 0 else math.inf
    spare = (f"{no_node} replicas (ready, starting, on free GPUs) carry {full_speed:.3g} "
             f"flat out; {rate.value:.3g} req/s need {need:.3g}")
    if drain_s >= node_ready_s:
        return (f"{spare}: {waiting.value:g} waiting would outlast a node boot "
                f"({node_ready_s:.0f} s): no cap")
    cap = max(cluster.current, no_node, recommend.ceil_replicas(need))
    detail = (f"{spare}, so {waiting.value:g} waiting drain in about {drain_s:.0f} s, "
              f"before a node could boot ({node_ready_s:.0f} s): no node for the backlog")
    if draft.count() > cap:
        draft.clamp(ClampName.BACKLOG, cap, detail)
    fc = draft.forecast
    if fc is not None and fc.replicas_at_node_ready > cap:
        # Node headroom follows the same rule: no node is prepared for the backlog either.
        draft.forecast = dataclasses.replace(fc, replicas_at_node_ready=cap)
    return f"capped at {cap}"


def stabilize_count(draft: Draft) -> str:
    """HPA stabilization windows. A fresh state (first decision, or a restarted service)
    seeds the down window with the current count, as the HPA does, so a restart never
    scales down before a full window of evidence."""
    if draft.raw is None:
        return "nothing to stabilize"
    current = draft.cluster.current
    behavior = draft.spec.behavior
    if draft.state.last_desired is None:
        draft.state = dataclasses.replace(draft.state, recommendations=(
            types.Recommendation(at=draft.now, replicas=current),))
    hold = ""
    down_window = behavior.scale_down.stabilization_seconds
    if draft.spec.restart_aware:
        down_window, hold = restart_hold(draft)
    history = draft.state.recommendations
    if list(map(_TOLERATED, history)).count(None) < len(history):  # one has a tolerated
        history = tuple(r if r.tolerated is None else
                        dataclasses.replace(r, replicas=r.tolerated) for r in history)
    if ((not draft.backlogged or (draft.draining and not draft.held_to_load))
            and list(map(_LOAD, history)).count(None) < len(history)):  # one has a load
        # A backlog is a one-off need: once it is worked off (no reading above load +
        # draining), the window remembers the load of its time, so replicas bought to
        # drain it go now, not a window later.
        # Example: a step to 60 req/s queued 3,300; 9 replicas drained it where the load
        # needs 6; the 9 were held 300 s after the drain, 1.3 GPU-h of a 2.9 GPU-h run.
        history = tuple(r if r.load is None else dataclasses.replace(r, replicas=r.load)
                        for r in history)
    held = draft.raw if draft.tolerated is None else draft.tolerated
    desired = stabilize.stabilize(behavior, current=current, recommendation=held,
                                  history=history, now=draft.now,
                                  down_window_s=down_window)
    keep = draft.cycle_keep
    if keep is not None and desired < current and desired < keep:
        desired = min(current, keep)
        hold = f"{hold}; the last cycle needed {desired} again within a restart and its slack"
    if desired < current and draft.climbing:
        # No release while the load climbs: a square wave's off phase ended as its 300 s
        # window did, and the second replica went the second the load came back.
        if draft.count() != current:
            draft.clamp(ClampName.STABILIZATION_DOWN, current,
                        f"demand climbs: no release below {current}")
        draft.desired = current
        return "demand climbs: no release" + (f"; {hold}" if hold else "")
    if desired == held:
        kept = ""
        if held != draft.raw:
            draft.desired, kept = held, f", {held} as the tolerance holds"
        return f"within the windows{kept}" + (f"; {hold}" if hold else "")
    down = desired > held
    seconds = down_window if down else behavior.scale_up.stabilization_seconds
    window = "down" if down else "up"
    draft.clamp(ClampName.STABILIZATION_DOWN if down else ClampName.STABILIZATION_UP, desired,
                f"{seconds}s window keeps {desired}")
    return f"the {window} window keeps {desired}" + (f"; {hold}" if down and hold else "")


# The load is away while demand is under this share of its peak before it left (the
# peak over the forecast window): noise of +-30 % is no absence, and a level misread
# high (a queue before the load of a request was known) is not waited for forever.
AWAY_SHARE = 0.5
# Weight of a new return gap in the smoothed one (about the last three returns matter).
RETURN_WEIGHT = 0.5
# Returns whose gaps differ by at most this share of the learned gap make a pattern; the
# expected return is waited for until gap x (1 + RETURN_TOLERANCE).
RETURN_TOLERANCE = 0.25
# Returns in a row after about the same gap before the engine plans on the next one.
RETURN_PATTERN = 2
# The slack of a planned return, at most: replicas are started this much before the time
# to ready ahead of an expected return (returns come a little early, and one SLO window,
# 60 s, is what the yardstick judges), and once a return is planned, replicas the load no
# longer needs are held this long before the rate-limited release (long enough to ride
# through a dip). A return as regular as its jitter shows needs less: `_return_slack_s`.
RETURN_EARLY_S = 60.0
# The slack covers this many times the returns' jitter (their mean absolute deviation
# from the learned gap; for normal deviations 0.8 standard deviations, so 3 of them are
# 2.4: about one return in 120 earlier than the slack) ...
JITTER_SPREAD = 3.0
# ... and never less than a rise's confirmation (RISE_CONFIRM_S: two of a replica's 10 s
# rate windows), the time a reading needs to say the load left or came back at all.


def _return_slack_s(state: types.EngineState) -> float:
    """How early a planned return's replicas start, and how long they are held after the
    drop: JITTER_SPREAD x the returns' jitter, between RISE_CONFIRM_S and RETURN_EARLY_S;
    RETURN_EARLY_S until a return was measured against the learned gap. Example: a square
    wave whose returns came 3 s from the learned gap holds 20 s and starts 20 s early, not
    60 and 60 (off 225 s, pod start 105 s: away 80 s a cycle, not none); returns read
    from long prompts' swinging readings, 40 s from the gap, keep the 60 s."""
    return _slack_s(state.return_jitter_s)


def _slack_s(jitter: float | None) -> float:
    """JITTER_SPREAD x `jitter`, between RISE_CONFIRM_S and RETURN_EARLY_S; RETURN_EARLY_S
    while the jitter is unknown."""
    if jitter is None:
        return RETURN_EARLY_S
    return min(RETURN_EARLY_S, max(RISE_CONFIRM_S, JITTER_SPREAD * jitter))


def _return_lead_s(draft: Draft, *, slack: float | None = None) -> float:
    """Seconds before an expected return to start its replicas: time to ready (plus a node
    boot when they would not fit on the free GPUs) and the return's slack (by default
    `_return_slack_s`)."""
    assert draft.times is not None
    cluster, level = draft.cluster, draft.state.drop_level
    free = cluster.free_replica_slots
    needs_node = free is not None and free < level - cluster.current
    return (draft.times.pod_start_s + (draft.times.node_boot_s if needs_node else 0.0)
            + (_return_slack_s(draft.state) if slack is None else slack))


def _held_demand(draft: Draft) -> float:
    """The highest demand the samples read throughout a rise's confirmation span
    (RISE_CONFIRM_S): the level the load held, not a swing's peak (0 while the samples
    span less)."""
    span, samples = _confirm_s(draft.spec), draft.samples
    held = 0.0
    for i, sample in enumerate(samples):
        # The lowest reading of the span that ends here: the level held through it.
        start = sample.at - span
        if samples[0].at > start:
            continue
        low, j = sample.demand, i - 1
        while j >= 0 and samples[j].at >= start:
            low = min(low, samples[j].demand)
            j -= 1
        held = max(held, low)
    return held


def _held_level(draft: Draft, *, peak: float, held: float) -> int:
    """The count to start again for a load that left: the smallest count the engine's own
    rules kept for the load it read before it left. Not the count, which may still hold a
    backlog's or a window's replicas, and not the ceiling of the peak reading.

    A reading within the tolerance of the count changes nothing, so the peak needs only
    `peak / 1.1`. With a tokens/s rule, a rise within its utilisation margin buys a
    replica only once read for RISE_CONFIRM_S, so the count needs only the highest level
    held that long (within the tolerance) and `peak x targetUtilization` (the margin).
    Example: a square wave at 40 req/s reads 3.9 to 4.4 replicas of demand and is served
    by 4 (4.4 is within 10 % of 4); the ceiling of its 4.4 peak, 5, started a fifth
    replica ahead of every return, which the down window then held through the load.
    `held` is that level (`_held_demand`), which the drop was found with.
    """
    spec = draft.spec
    within = 1 + spec.tolerance
    if spec.tokens is None:
        return recommend.ceil_replicas(spec.with_headroom(peak) / within)
    return max(recommend.ceil_replicas(spec.with_headroom(held) / within),
               recommend.ceil_replicas(spec.with_headroom(peak)
                                       * spec.tokens.target_utilization))


def _pattern(state: types.EngineState) -> float | None:
    """The learned return gap once it has held RETURN_PATTERN times in a row."""
    return state.return_gap_s if state.returns >= RETURN_PATTERN else None


def expect_return(draft: Draft) -> str:
    """Restart-aware only: learn when load comes back after a drop, and plan for it.

    Releasing a replica the load no longer needs saves its idle time; starting one again
    when load returns costs its pod start in GPU time, and the SLO in every window of
    that start. When load has come back twice in a row after about the same gap (within
    25 %) and that gap is longer than starting the replicas again (plus twice the
    return's slack, `_return_slack_s`), holding them idle through it costs more than a
    restart: the engine releases them and starts the count held at the drop again one
    time-to-ready (+ the slack) before the expected return. How far each return came
    from the learned gap is learned with it (the jitter the slack is sized by). If the
    load does not come back by gap x 1.25, the pattern is forgotten. Example: a square
    wave off for 600 s, 8B at a 105 s pod start, a 300 s down window, returns 30 s from
    the gap (60 s of slack): the HPA holds the replicas idle 300 s, then the next burst
    starts cold; here they go at drop + 60 s and are back at drop + 600 - 165 = 435 s,
    ready 60 s before the load: 240 s less idle time per replica and no cold start in
    the SLO (returns 3 s from the gap: drop + 20 s and drop + 475 s, 280 s less).
    """
    spec, now = draft.spec, draft.now
    if not spec.restart_aware:
        return ""
    state, demand, current = draft.state, draft.demand_now, draft.cluster.current
    note = ""
    if demand is not None and current > 0:
        # A drop is the load leaving (AWAY_SHARE) its peak, and the level it held (a
        # swing shorter than RISE_CONFIRM_S is no level to come back to: on a warm start
        # of the hold-out's spikes, the first readings' swing read as a drop 10 s in, and
        # the resumed pattern released the replicas 100 s before the first spike).
        peak = max((d.demand for d in draft.samples), default=demand)
        if state.drop_at is None and demand < AWAY_SHARE * peak:
            # (The peak first: it is cheap, and the held level is never above it.)
            held = _held_demand(draft)
            if demand < AWAY_SHARE * held:
                state = _learn_cycle(dataclasses.replace(state, drop_at=now, drop_level=max(
                    1, min(current, _held_level(draft, peak=peak, held=held)))), now=now,
                    shortest=_return_lead_s(draft, slack=RETURN_EARLY_S))
        elif state.drop_at is not None and demand >= AWAY_SHARE * state.drop_level:
            seen = now - state.drop_at
            gap, jitter = state.return_gap_s, state.return_jitter_s
            if seen <= _return_lead_s(draft, slack=RETURN_EARLY_S):
                # A dip: shorter than a restart, it is held through whatever was learned
                # and says nothing about the pattern of longer absences.
                state = dataclasses.replace(state, drop_at=None)
            elif gap is not None and abs(seen - gap) <= RETURN_TOLERANCE * gap:
                off = abs(seen - gap)
                state = dataclasses.replace(
                    state, drop_at=None, returns=state.returns + 1,
                    return_gap_s=gap + RETURN_WEIGHT * (seen - gap),
                    return_jitter_s=off if jitter is None else jitter + RETURN_WEIGHT * (
                        off - jitter))
            else:
                state = dataclasses.replace(state, drop_at=None, returns=1, return_gap_s=seen,
                                            return_jitter_s=None)
            note = f"load came back after {seen:.0f} s"
    cycle = state.drop_cycle_s
    if (state.drop_cycles and cycle is not None and state.last_drop_at is not None
            and now > state.last_drop_at + (1 + CYCLE_TOLERANCE) * cycle):
        state = dataclasses.replace(state, drop_cycles=0, drop_cycle_s=None,
                                    drop_jitter_s=None, cycle_demand=(),
                                    last_cycle_demand=())
        note = "; ".join(p for p in (note, f"no drop came {cycle:.0f} s after the last: "
                                     "the cycle forgotten") if p)
    gap = _pattern(state)
    draft.state = state
    if gap is None or state.drop_at is None:
        return note
    lead = _return_lead_s(draft)
    if gap <= lead:
        return note or f"load comes back after {gap:.0f} s, sooner than a restart: hold"
    due = state.drop_at + gap
    if now > due + RETURN_TOLERANCE * gap:
        draft.state = dataclasses.replace(state, returns=0, return_gap_s=None,
                                          return_jitter_s=None)
        return f"the load expected back {now - due:.0f} s ago did not come: pattern forgotten"
    if now < due - lead:
        jitter = state.return_jitter_s
        return f"load expected back in {due - now:.0f} s: {state.drop_level} replicas " \
               f"start {lead:.0f} s before" + (
                   "" if jitter is None else
                   f" (returns came within {jitter:.0f} s of the gap: "
                   f"{_return_slack_s(state):.0f} s of slack)")
    draft.opinions.append(recommend.opinion(
        Rule.RETURN, value=types.SignalValue(value=gap, age_s=0.0, fresh=True), fresh=True,
        demand=float(state.drop_level),
        detail=f"load came back after {gap:.0f} s {state.returns} times in a row: "
        f"{state.drop_level} replicas started {lead:.0f} s ahead of its return"))
    return f"load expected back in {max(0.0, due - now):.0f} s: {state.drop_level} replicas"


# Drops whose times apart differ by at most this share of the learned cycle make one; a
# drop later than that forgets it. Tighter than a return's: a cycle plans each level
# from one past cycle. A periodic load's drops are read within seconds of each other
# (the hold-out's sawtooth: 300 s apart, +-2 s). Bursts at chance intervals still pass
# now and then (Azure's code trace: gaps of 376 and 394 s), and the cycle then lasts
# until a drop misses it.
CYCLE_TOLERANCE = 0.05


def _learn_cycle(state: types.EngineState, *, now: float, shortest: float
                 ) -> types.EngineState:
    """A drop at `now`: learn the time from drop to drop (a sawtooth's period, a square
    wave's). Two in a row within CYCLE_TOLERANCE of each other make a cycle. A drop
    within `shortest` of the last (a dip's time: a restart and its slack) is that drop
    read again after a dip, not a cycle: a load falling through swings re-read its drop
    every decision, and its 10 s "cycle" released a step's replicas 50 s after it fell."""
    last, cycle = state.last_drop_at, state.drop_cycle_s
    if last is None:
        return dataclasses.replace(state, last_drop_at=now)
    seen = now - last
    if seen <= shortest:
        return state
    # The demand read since the last drop is now the last cycle's.
    state = dataclasses.replace(state, last_drop_at=now, cycle_demand=(),
                                last_cycle_demand=state.cycle_demand)
    if cycle is not None and abs(seen - cycle) <= CYCLE_TOLERANCE * cycle:
        off, jitter = abs(seen - cycle), state.drop_jitter_s
        return dataclasses.replace(
            state, drop_cycles=state.drop_cycles + 1,
            drop_cycle_s=cycle + RETURN_WEIGHT * (seen - cycle),
            drop_jitter_s=off if jitter is None else jitter + RETURN_WEIGHT * (off - jitter))
    return dataclasses.replace(state, drop_cycles=1, drop_cycle_s=seen, drop_jitter_s=None)


# The resolution of a cycle's demand profile, and its longest span: longer cycles are
# left to the down window and the return plan (a square wave's hour is not held in bins).
CYCLE_BIN_S = 10.0
CYCLE_MAX_BINS = 90


# A bin of a cycle's profile with no reading (signals missing or stale then): no plan may
# rest on it.
UNREAD = -1.0


def _record_cycle(state: types.EngineState, *, demand: float | None, now: float
                  ) -> types.EngineState:
    """The highest demand of this CYCLE_BIN_S since the last drop, into `cycle_demand`
    (bins without a reading are UNREAD)."""
    last = state.last_drop_at
    if last is None or demand is None or now < last:
        return state
    index = int((now - last) // CYCLE_BIN_S)
    profile = state.cycle_demand
    if index >= CYCLE_MAX_BINS or (index < len(profile) and profile[index] >= demand):
        return state
    grown = profile + (UNREAD,) * (index + 1 - len(profile))
    return dataclasses.replace(state, cycle_demand=(*grown[:index], demand, *grown[index + 1:]))


def cycle_ahead(draft: Draft) -> str:
    """Restart-aware only: a load whose drops come a cycle apart, and which does not come
    back as a planned return (a sawtooth's climb, read back well within a restart),
    needs next what its last cycle needed at the same time after its drop.

    The `cycle` opinion is the highest demand the last cycle read from this time after
    its drop to one lead later (time to ready + the slack, `_return_lead_s`; wrapping into
    the next cycle; the slack sized by how far drops came from the cycle, as a return's is
    by its returns' jitter), and the down window is the slack (at most the policy's): a
    replica goes once the last cycle needed it no more within a lead and a slack (a
    release bought back within the slack saves nothing), and is started again a lead
    before its level comes back.
    No plan where the last cycle has a time without a reading. Example (the hold-out's
    sawtooth, seed 11): climbs of 5 -> 50 req/s over 240 s every 300 s, 105 s pod start,
    drops within a few seconds of the cycle (20 s of slack): the top's 5 replicas are
    held about 20 s after the drop, then 3; 4 are started again 100 s after the drop and
    5 at 155 s, where the 300 s window held the top's count through every cycle (2.86 ->
    2.43 GPU-hours, every window as before).
    """
    spec, state, now = draft.spec, draft.state, draft.now
    if not spec.restart_aware:
        return ""
    draft.state = state = _record_cycle(state, demand=draft.demand_now, now=now)
    cycle, profile = learned_cycle(state), state.last_cycle_demand
    if (cycle is None or state.last_drop_at is None or not profile
            or _pattern(state) is not None or draft.times is None):
        return ""
    slack = _slack_s(state.drop_jitter_s)
    lead = _return_lead_s(draft, slack=slack)
    since = now - state.last_drop_at
    # No release of a level the last cycle needed again within a lead and a slack: it
    # would be started again within the slack (as a return a release would not save is
    # held); on a climb, each step's release would be bought back the step after.
    need = _cycle_need(profile, cycle=cycle, since=since, seconds=lead)
    later = _cycle_need(profile, cycle=cycle, since=since + lead, seconds=slack)
    if need is None or later is None or need <= 0:
        return ""  # a time the last cycle has no reading of: the window holds
    keep = max(need, later)
    draft.cycle_hold_s = slack
    draft.cycle_keep = recommend.ceil_replicas(spec.with_headroom(keep) / (1 + spec.tolerance))
    draft.opinions.append(recommend.opinion(
        Rule.CYCLE, value=types.SignalValue(value=cycle, age_s=0.0, fresh=True), fresh=True,
        demand=need,
        detail=f"the load drops every {cycle:.0f} s; its last cycle read {need:.2f} replicas "
        f"of demand within {lead:.0f} s of this point"))
    return (f"the last cycle needed {need:.2f} replicas within {lead:.0f} s of this point, "
            f"{keep:.2f} within {lead + slack:.0f} s")


def _cycle_need(profile: tuple[float, ...], *, cycle: float, since: float, seconds: float
                ) -> float | None:
    """The highest demand of `profile` (per CYCLE_BIN_S since a drop) from `since` to
    `since + seconds`, wrapping into the next cycle after `cycle` seconds; None where a
    bin of that span was not read (UNREAD, or past the profile's end: a cycle longer
    than CYCLE_MAX_BINS, or a time its cycle did not last)."""
    need = 0.0
    for step in range(int(seconds // CYCLE_BIN_S) + 2):
        at = min(since + step * CYCLE_BIN_S, since + seconds)
        phase = at - cycle if at >= cycle else at
        index = int(max(0.0, phase) // CYCLE_BIN_S)
        if index >= len(profile) or profile[index] == UNREAD:
            return None
        need = max(need, profile[index])
    return need


def learned_cycle(state: types.EngineState) -> float | None:
    """The learned cycle once drops came about that far apart RETURN_PATTERN times in a
    row (restart-aware only: drops are learned there), as `_pattern` is for returns."""
    return state.drop_cycle_s if state.drop_cycles >= RETURN_PATTERN else None


def _until_drop(state: types.EngineState, *, now: float) -> float | None:
    """Seconds until the load is expected to fall away again (`learned_cycle`); None without a
    cycle or once the drop is due."""
    cycle, last = learned_cycle(state), state.last_drop_at
    if cycle is None or last is None:
        return None
    due = last + cycle
    return due - now if due > now else None


def _worth_releasing(gap: float, lead: float, hold: float) -> bool:
    """Whether releasing replicas through an absence of `gap` seconds saves GPU time:
    they are held `hold` s after the drop and started `lead` s before the return, so they
    are away only for gap - hold - lead."""
    return gap > lead + hold


# Restart-aware holding without a pattern: a level of demand is held as long as levels
# were seen to come back, times this (returns are not all alike) ...
HOLD_MARGIN = 1.5
# ... once levels were seen to leave for good this many times (until then, the window):
# a model that has only ever seen load stay or come back holds as the policy says.
HOLD_EVIDENCE = 2
# Returns and leaves older than this are forgotten (the load's habits change over a day).
HOLD_MEMORY_S = 3600.0
# At most this many returns and leaves are kept, the newest (returns only while no newer
# one was as long, and only those that could lengthen the hold past its floor).
HOLD_SAMPLES = 32


def _level(past: types.Recommendation) -> int:
    """What a recommendation needed for the load (without a backlog's drain)."""
    return past.replicas if past.load is None else past.load


def learned_hold(draft: Draft, window: int) -> tuple[int, str]:
    """The down window learned from this model's load, at most the policy's `window`.

    Holding a replica the load left costs its idle time; releasing it costs a restart
    (its pod start in GPU time, and the SLO while it starts) if the load comes back.
    The engine watches every level of demand it recommended: *back* when the count it
    needs is recommended again within the window (after how long; not while a backlog is
    served, whose swings are its own), *gone* when it is not (seen as it leaves the
    window). Once levels were seen gone HOLD_EVIDENCE times in the last hour, replicas
    are held 1.5x the longest return seen, at least one pod start (a shorter hold saves
    less than the restart costs) and at most the window; until then, the window; and the
    window while the KV cache is the winning reading.
    Example (pod start 60 s, a 300 s window): levels 8 and 6 were never needed again, and
    blips to 5 came back within 40 s (1.5 x 40 <= 60): after a fall to 2, each level goes
    60 s after it was last recommended. Blips every 200 s (back after 195 s): held
    min(300, 1.5 x 195) = 293 s, about the window.
    """
    state, now = draft.state, draft.now
    if draft.raw is None or draft.times is None:
        return window, ""
    floor = min(window, math.ceil(draft.times.pod_start_s))
    history = state.recommendations
    level_now = draft.raw if draft.load_raw is None else draft.load_raw
    forget = now - HOLD_MEMORY_S
    returns, leaves = state.level_returns, state.level_leaves
    if returns and returns[0].at <= forget:
        returns = tuple([r for r in returns if r.at > forget])
    if leaves and leaves[0] <= forget:
        leaves = tuple([t for t in leaves if t > forget])
    if history and level_now > _level(history[-1]) and not draft.backlogged:
        # Back: the level now (or the highest of the window, if lower) was recommended
        # before, within the window, and not since: the newest such recommendation, found
        # walking back (levels inline: this runs at every rise). Not while a backlog is
        # served: the readings then count it (or are held to an estimate of the load), so
        # their swings are its echo, not load that came back. On square-slow two such
        # returns in the first drain held every later fall 292 s, where the levels of the
        # load itself, which left for good, held them a pod start (9 % fewer GPU-hours
        # without them, the same windows; docs/benchmarks.md).
        start, back, since = now - window, _level(history[-1]), None
        for r in reversed(history):
            if r.at <= start:
                break
            level = r.replicas if r.load is None else r.load
            if level >= level_now:
                back, since = level_now, r.at
                break
            if level > back:
                back, since = level, r.at
        if since is not None:
            after = now - since
            if HOLD_MARGIN * after > floor:
                # Only the longest return of the hour matters: an older one no longer than
                # this is forgotten now (it would be before this one), so the kept ones run
                # from the longest down, and a burst of short returns never pushes the
                # longest out of the HOLD_SAMPLES kept.
                kept = [r for r in returns if r.after_s > after]
                returns = (*kept, types.LevelReturn(at=now, after_s=after))[-HOLD_SAMPLES:]
    # Gone: a recommendation leaving the window (`_remember` drops it) above every one
    # after it. The history is in time order: what leaves is at its start.
    cutoff = now - draft.spec.keep_recommendations_s
    if history and history[0].at <= cutoff:
        gone = 1
        while gone < len(history) and history[gone].at <= cutoff:
            gone += 1
        leaving = max([_level(r) for r in history[:gone]])
        if leaving > level_now and leaving > max(
                [r.replicas if r.load is None else r.load for r in history[gone:]],
                default=0):
            leaves = (*leaves, now)[-HOLD_SAMPLES:]
    if returns is not state.level_returns or leaves is not state.level_leaves:
        draft.state = dataclasses.replace(state, level_returns=returns, level_leaves=leaves)
    if len(leaves) < HOLD_EVIDENCE:
        return window, ""
    if draft.winner is Rule.KV_CACHE:
        # Memory binds: the cache's reading dips as long answers end together and climbs
        # back as new ones grow, so its dips are turnover, not load that left (5,000-token
        # answers missed 5 more windows of 90 held this way; docs/benchmarks.md).
        return window, "the KV cache binds: its dips are turnover, the window holds"
    longest = returns[0].after_s if returns else 0.0  # they run from the longest down
    hold = max(floor, min(window, math.ceil(HOLD_MARGIN * longest)))
    if hold >= window:
        return window, f"levels came back after up to {longest:.0f} s: the window holds"
    if not returns:
        return hold, f"levels left {len(leaves)} times and none came back later than " \
                     f"{floor / HOLD_MARGIN:.0f} s: held {hold} s"
    return hold, f"levels left {len(leaves)} times and came back within {longest:.0f} s: " \
                 f"held {hold} s"


def restart_hold(draft: Draft) -> tuple[int, str]:
    """How long to hold replicas the load no longer needs, weighing a restart.

    The policy's down window, unless a return is planned (`expect_return`) and the load
    is away now: then the return's slack (20 to 60 s, `_return_slack_s`), because the
    replicas are started again ahead of the load. A dip, a return sooner than a release
    and a restart take, and the load while it is here keep the whole window: holding is
    the cheaper choice, noise never turns into restarts, and a load climbing back (its
    first readings still low) is never read as one that left. Example: a square wave
    180 s off, pod start 105 s, returns 30 s from the gap (60 s of slack): released at
    drop + 60 s and started again at return - 165 s, the replicas would be away for no
    time at all, so they are held; and at the return that taught the pattern, a 60 s
    window reaching back into the off phase had released one of 3 replicas while the
    load climbed back, and the window of that minute missed its SLO.
    """
    if draft.cycle_hold_s is not None:
        # The cycle's opinion holds what the next restart's time needs; the policy's
        # window stays the longest hold.
        seconds = min(draft.spec.behavior.scale_down.stabilization_seconds,
                      math.ceil(draft.cycle_hold_s))
        return seconds, f"the last cycle's need held ahead: released after {seconds} s"
    window, learned = learned_hold(draft, draft.spec.behavior.scale_down.stabilization_seconds)
    gap = _pattern(draft.state)
    if gap is None or draft.state.drop_at is None:
        return window, learned
    window = draft.spec.behavior.scale_down.stabilization_seconds
    lead, slack = _return_lead_s(draft), _return_slack_s(draft.state)
    if gap <= lead:
        return window, ""  # sooner than a restart: expect_return says so
    if not _worth_releasing(gap, lead, slack):
        # The return is still planned (a window shorter than the gap would not hold).
        return window, f"load returns about every {gap:.0f} s: a release and a restart " \
                       "would save nothing, held"
    # The slack releases what the load held before the drop; after that the window grows
    # with the time away, back to RETURN_EARLY_S, so the count through the absence holds
    # its own readings' swings as before (a 20 s window followed half 6k-token prompts'
    # swings down to 1 replica where 2 were needed, and missed a window).
    away = draft.now - draft.state.drop_at
    seconds = min(window, math.ceil(min(RETURN_EARLY_S, max(slack, away))))
    return seconds, f"load returns about every {gap:.0f} s: released after " \
                    f"{min(window, math.ceil(slack))} s, started again ahead of the return"


def rate_limit(draft: Draft) -> str:
    """The behavior's rate-limit policies (HPA semantics), from each period's start."""
    current, desired = draft.cluster.current, draft.count()
    if desired == current:
        return "no change to limit"
    up = desired > current
    behavior = draft.spec.behavior
    limit = stabilize.rate_limit(behavior.scale_up if up else behavior.scale_down, up=up,
                                 current=current, events=draft.state.events, now=draft.now)
    if limit is not None:
        # As the HPA: a limit never turns the direction round. A down limit counted from a
        # period that began higher (a fall of 3 within it) would otherwise lift the count.
        limit = max(limit, current) if up else min(limit, current)
    if limit is not None and (desired > limit if up else desired < limit):
        draft.clamp(ClampName.RATE_LIMIT_UP if up else ClampName.RATE_LIMIT_DOWN, limit,
                    "behavior policies allow at most this change now")
        return f"at most {limit} now"
    return "within the rate limits"


def hold_on_stale(draft: Draft) -> str:
    """Never down on stale or missing data. (Never below what is in flight holds already:
    the concurrency signal counts running requests, and the max cannot fall below it.)"""
    current = draft.cluster.current
    if draft.count() < current and draft.stale:
        draft.clamp(ClampName.HOLD_STALE, current, "stale or missing: " + ", ".join(draft.stale))
        return f"held at {current}: a signal is stale"
    return "no scale-down on stale data"


def bound(draft: Draft) -> str:
    """min and warm floor below, max and GPU budgets above (the cap wins)."""
    spec = draft.spec
    floor, warm = spec.floor_at(draft.now)
    name = ClampName.WARM_FLOOR if warm else ClampName.MIN
    if draft.count() < floor:
        draft.clamp(name, floor, f"{name} is {floor}")
    busy = spare.busy_floor(draft.cluster)  # batch tiers: the caps below still win
    if draft.count() < busy:
        draft.clamp(ClampName.UNFINISHED_WORK, busy, f"{busy} replicas report unfinished work")
    per_replica = spec.gpus_per_replica
    caps = [(spec.max_replicas, ClampName.MAX, f"replicas.max is {spec.max_replicas}")]
    if spec.budget_gpus is not None:
        caps.append((spec.budget_gpus // per_replica, ClampName.BUDGET,
                     f"budget of {spec.budget_gpus} GPUs"))
    if draft.cluster.budget_gpus is not None:
        caps.append((draft.cluster.budget_gpus // per_replica, ClampName.EXTERNAL_BUDGET,
                     f"tenant or pool budget of {draft.cluster.budget_gpus} GPUs"
                     + (f": {draft.cluster.budget_reason}" if draft.cluster.budget_reason
                        else "")))
    for cap, cap_name, detail in caps:
        if draft.count() > cap:
            draft.clamp(cap_name, cap, detail)
    return f"between {floor} and {min(cap for cap, _, _ in caps)}"


PIPELINE: tuple[tuple[types.StepName, Callable[[Draft], str]], ...] = (
    (types.StepName.SIGNALS, read_signals),
    (types.StepName.LOAD, estimate_load),
    (types.StepName.LOOK_AHEAD, look_ahead),
    (types.StepName.RECOMMEND, recommend_replicas),
    (types.StepName.BACKLOG, limit_backlog),
    (types.StepName.STABILIZE, stabilize_count),
    (types.StepName.RATE_LIMIT, rate_limit),
    (types.StepName.SAFETY, hold_on_stale),
    (types.StepName.BOUNDS, bound),
)
"""The steps in order; `decide` runs them and records each in `Decision.steps`."""


# -- helpers of the steps ---------------------------------------------------------------


def _forecast(draft: Draft) -> types.Forecast | None:
    """Demand at the time a replica started now would be ready.

    Time to ready = pod start (pull + load + readiness, learned when observed), plus a node
    boot when the replicas to add do not fit on free GPUs. Example: a 70B TP8 replica with
    no free node: 300 s boot + 120 s pull + 90 s load + 20 s readiness = 530 s; demand
    rising 0.01 replicas/s over a 300 s window is then planned 0.01 x min(530, 300) = 3
    replicas higher than now (never further ahead than the history seen).
    """
    demand_now, cluster, times, spec = draft.demand_now, draft.cluster, draft.times, draft.spec
    if demand_now is None or times is None:
        return None
    to_add = max(1, recommend.ceil_replicas(demand_now) - cluster.ready - len(cluster.starting))
    needs_node = cluster.free_replica_slots is not None and cluster.free_replica_slots < to_add
    time_to_ready = times.pod_start_s + (times.node_boot_s if needs_node else 0.0)
    # A trend needs half a window of history: 60 s of a 120 s window.
    # The trend must still be going on in the last flow window: a step's demand estimated
    # over that window ramps for as long, then holds (`forecast._recent_bound`).
    trend = forecast.fit_trend(draft.samples, now=draft.now,
                               min_span_s=spec.forecast_window_s / 2, recent_s=FLOW_WINDOW_S)
    if trend is None or not spec.forecast_enabled:
        trend = forecast.Trend(level=demand_now, slope_per_s=0.0)
    node_boot = 0.0 if needs_node else times.node_boot_s
    # The look-ahead checks itself: only the share of the trend that came true lately.
    scale = draft.state.horizon_scale
    trusted = trend if scale == 1.0 else dataclasses.replace(
        trend, slope_per_s=trend.slope_per_s * scale)
    # A load that falls away every cycle climbs no further than its next drop: replicas
    # bought for the trend beyond it would arrive after the need is gone.
    drop_in = _until_drop(draft.state, now=draft.now)
    limit = math.inf if drop_in is None else drop_in
    at_ready = recommend.bounded(trusted.at(min(time_to_ready, limit)))
    at_node_ready = recommend.bounded(trusted.at(min(time_to_ready + node_boot, limit)))
    return types.Forecast(
        time_to_ready_s=time_to_ready,
        needs_node=needs_node,
        demand_now=trend.level,
        slope_per_s=trend.slope_per_s,
        demand_at_ready=at_ready,
        replicas_at_ready=recommend.ceil_replicas(at_ready),
        replicas_at_node_ready=recommend.ceil_replicas(at_node_ready),
        horizon_scale=scale,
        step=trend.step,
        recent=trend.recent,
        drop_in_s=drop_in if drop_in is not None and drop_in < time_to_ready else None,
    )


def learn_load(
    spec: engine_spec.EngineSpec,
    *,
    snapshot: types.SignalSnapshot,
    cluster: types.ClusterState,
    state: types.EngineState,
    demand_now: float | None,
) -> types.EngineState:
    """Learn how many replicas one request per second needs, while that can be seen.

    Only when there is an arrival rate and the model is not overloaded (at most its
    overload bound waiting per ready replica): then demand is load, not backlog. Example:
    5 req/s with demand 0.68 replicas -> 0.136 replicas per req/s, so a jump to 40 req/s
    needs 5.4.
    """
    rate = snapshot.arrival_rate
    waiting = snapshot.queue_depth
    if (demand_now is None or not demand_now > 0 or rate is None or not rate.fresh
            or not rate.value >= MIN_RATE or cluster.ready == 0 or waiting is None
            or not waiting.fresh):
        return state
    if recommend.overloaded(spec, snapshot=snapshot, ready=cluster.ready):
        return state
    sample = demand_now / rate.value
    old = state.replicas_per_request_rate
    # The first samples are averaged (weight 1/n) before the smoothing takes over: one
    # spiky first second (5 prompts of 2k tokens at 0.7 req/s read 1.9 replicas per req/s
    # where 0.1 was true) must not set the load for the minutes the smoothing takes.
    count = state.load_samples + 1 if old is not None else 1
    learned = sample if old is None else old + max(LOAD_WEIGHT, 1 / count) * (sample - old)
    return dataclasses.replace(state, replicas_per_request_rate=learned, load_samples=count)


def seed_load(draft: Draft) -> types.EngineState:
    """Overloaded before anything was learned: the load of one request from the work of
    the requests finishing.

    Saturated replicas' tokens/s and completions/s both read capacity, but their ratio is
    the work of one request: tokens/s demand 3.2 replicas while 25 req/s finish is 0.128
    replicas per req/s. The first burst on a cold model is then sized as load plus drain
    like every later one, not as its queue (34 replicas asked where 5 carried it).
    """
    completed = draft.snapshot.completion_rate
    tokens = next((o for o in draft.opinions if o.rule is Rule.TOKENS_PER_SECOND
                   and o.demand is not None), None)
    if (tokens is None or tokens.demand is None or not tokens.demand > 0 or completed is None
            or not completed.fresh or not completed.value >= MIN_RATE):
        return draft.state
    return dataclasses.replace(draft.state,
                               replicas_per_request_rate=tokens.demand / completed.value)


def _remember(draft: Draft, decision: types.Decision) -> types.EngineState:
    """Keep only what the windows need: memory is bounded by time, not by call count."""
    now, state, spec = decision.at, draft.state, draft.spec
    keep_recs, keep_events = spec.keep_recommendations_s, spec.keep_events_s
    raw = decision.current if draft.raw is None else draft.raw
    # Lists, not generators, and each cutoff computed once: the windows are scanned in
    # full every decision (60 recommendations at one decision per 5 s).
    recs_after, events_after = now - keep_recs, now - keep_events
    recommendations = tuple([r for r in state.recommendations if r.at > recs_after])
    recommendations = (*recommendations, types.Recommendation(
        at=now, replicas=raw, load=draft.load_raw, tolerated=draft.tolerated))
    events = tuple([e for e in state.events if e.at > events_after])
    if decision.desired != decision.current:
        events = (*events, types.ScaleEvent(at=now, delta=decision.desired - decision.current))
    return state.remembering(
        recommendations=recommendations,
        events=events,
        demand=draft.samples,
        backlog=draft.backlog,
        last_desired=decision.desired,
    )
