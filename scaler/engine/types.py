"""Typed, frozen inputs and outputs of the decision engine.

Times are epoch seconds (floats) from an injected clock: the service passes the wall
clock, the simulator its virtual clock. Durations are seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from scaler.core import histogram as histograms
from scaler.core import vocabulary

_Class = TypeVar("_Class", bound=type)


def fast_init(cls: _Class) -> _Class:
    """A frozen slots dataclass, built at about half the cost: its `__init__` replaced by
    one that sets each slot through the slot's own descriptor.

    The frozen `__init__` dataclasses generates sets a field through
    `object.__setattr__(self, name, value)`: a global, a method lookup and the field
    found by name in the class, per field (a 6-field object builds in 1.2 us, a plain
    dataclass's in 0.3, CPython 3.11). The engine builds about 40 of them a decision, so
    this `__init__` calls each field's slot setter directly: about 0.6 to 0.8 of the
    time (EngineState's 21 fields 3.9 -> 2.3 us). The same parameters, defaults and order;
    equality, hashing, repr, `fields`, `replace` and the frozen guard are the dataclass's
    own (tests/engine/test_fast_init.py holds them equal). Only plain defaults: no
    default_factory, no __post_init__, no init=False fields.
    """
    fields = dataclasses.fields(cls)
    env: dict[str, object] = {}
    params, body = [], []
    for each in fields:
        if (not each.init or each.kw_only or each.default_factory is not dataclasses.MISSING
                or hasattr(cls, "__post_init__")):
            raise TypeError(f"fast_init: {cls.__name__}.{each.name} is not a plain field")
        env[f"_set_{each.name}"] = cls.__dict__[each.name].__set__
        if each.default is dataclasses.MISSING:
            params.append(each.name)
        else:
            env[f"_default_{each.name}"] = each.default
            params.append(f"{each.name}=_default_{each.name}")
        body.append(f"        _set_{each.name}(self, {each.name})")
    source = "\n".join([f"def make({', '.join(env)}):",
                         f"    def __init__(self, {', '.join(params)}):",
                         *(body or ["        pass"]),
                         "    return __init__"])
    namespace: dict[str, Callable[..., Callable[..., None]]] = {}
    exec(source, namespace)  # as dataclasses builds its own __init__
    init = namespace["make"](**env)
    original = cls.__dict__["__init__"]
    init.__qualname__ = original.__qualname__
    init.__annotations__ = original.__annotations__
    init.__doc__ = original.__doc__
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)  # noqa: B010 (mypy forbids assigning __init__)
    return cls


@fast_init
@dataclass(frozen=True, slots=True)
class SignalValue:
    """One signal's current value for a model, as the signal store combined it.

    `age_s` is the age of the newest sample that contributed (0 = just now);
    `sources` counts the sources summed (queue, in-flight, tokens/s) or merged (latency
    histograms). `fresh` is decided once, when the value is built against the policy's
    stale limit (`assess`): finite, not negative, and no older than staleAfterSeconds.
    Nothing downstream checks again. Latency values carry the merged `histogram` they
    were read from (None when sources sent only a p95), so the guard can ask the buckets
    directly what share is within the SLO.
    """

    value: float
    age_s: float
    fresh: bool
    sources: int = 1
    histogram: histograms.Histogram | None = None

    @classmethod
    def assess(
        cls, value: float, *, age_s: float, stale_after_s: float, sources: int = 1,
        histogram: histograms.Histogram | None = None,
    ) -> SignalValue:
        """A value with its freshness decided. Example: 12 waiting, 40 s old, with a 30 s
        limit -> fresh False (the engine holds rather than scale down on it)."""
        fresh = math.isfinite(value) and value >= 0 and 0 <= age_s <= stale_after_s
        return cls(value=value, age_s=age_s, fresh=fresh, sources=sources,
                   histogram=histogram)


@fast_init
@dataclass(frozen=True, slots=True)
class SignalSnapshot:
    """What is known about a model's demand at `now`. `None` means missing.

    One field per `vocabulary.DEMAND_SIGNALS` member, named by its value (a test holds
    them equal); the docs of each are on the enum. `p95_latency` is the p95 of the
    policy's latency metric, in seconds.
    """

    queue_depth: SignalValue | None = None
    in_flight: SignalValue | None = None
    tokens_per_second: SignalValue | None = None
    prompt_tokens_per_second: SignalValue | None = None
    p95_latency: SignalValue | None = None
    arrival_rate: SignalValue | None = None
    completion_rate: SignalValue | None = None
    kv_cache_usage: SignalValue | None = None
    # Of `queue_depth`, the requests waiting in a queue every replica takes from (fresh
    # sources under `vocabulary.SHARED_QUEUE_SOURCE_PREFIX`: a JetStream consumer's lag);
    # the rest waits at the replicas that hold it. Not a signal of its own: None when no
    # fresh source of that kind reports.
    shared_waiting: SignalValue | None = None

    def get(self, signal: vocabulary.Signal) -> SignalValue | None:
        """The value of a demand signal (None for missing, and for non-demand signals)."""
        value: SignalValue | None = getattr(self, signal.value, None)
        return value

    def items(self) -> tuple[tuple[vocabulary.Signal, SignalValue | None], ...]:
        """(signal, value) for every demand signal, in vocabulary order."""
        return tuple((signal, self.get(signal)) for signal in vocabulary.DEMAND_SIGNALS)

    @classmethod
    def of(cls, values: Mapping[vocabulary.Signal, SignalValue | None]) -> SignalSnapshot:
        """A snapshot from a mapping of demand signals (others are ignored)."""
        return cls(**{name: values.get(signal) for signal, name in _DEMAND_FIELDS})


_DEMAND_FIELDS = tuple((signal, signal.value) for signal in vocabulary.DEMAND_SIGNALS)
"""(signal, its SignalSnapshot field): an enum member's `.value` is a descriptor call, seven
a snapshot."""


@dataclass(frozen=True, slots=True)
class ColdStartObservation:
    """A pod's observed start: created at `created_at`, ready at `ready_at`.

    `node_boot_s` is the part spent waiting for a node (0 when it landed on a free GPU).
    """

    created_at: float
    ready_at: float
    node_boot_s: float = 0.0

    @property
    def pod_start_s(self) -> float:
        return max(0.0, self.ready_at - self.created_at - self.node_boot_s)


@fast_init
@dataclass(frozen=True, slots=True)
class ClusterState:
    """The target's replicas as the cluster reports them.

    current: the scale subresource's spec.replicas (what was last asked for).
    ready: replicas passing readiness.
    starting: creation times of replicas that exist but are not ready yet.
    free_replica_slots: how many more replicas fit on GPUs already free in the pool
      (None = unknown: assume a node must boot).
    observations: recent pod start timelines, for learning time to ready.
    budget_gpus: an external cap on the GPUs this model may hold in all (from a tenant or
      pool budget), on top of the policy's own `budget`; None = no external cap.
    budget_reason: why that cap is what it is (the fleet arbitration's `Grant.reason`,
      e.g. "capped by tenant search: 16 of 16 GPUs; batch model ns/x gave 2"), shown in
      the EXTERNAL_BUDGET clamp; None = no reason given.
    busy_replicas: replicas reporting unfinished work (fresh in_flight or queue_depth > 0
      from their own `source`), which a scale-down keeps (`spare.busy_floor`); set for
      batch-tier policies only; None = no such guard.
    excluded_gpus: GPUs of the pool's healthy nodes not counted as capacity (DCGM health
      errors), and `capacity_notes` why, one line per node ("node gpu-3: 2 of 8 GPUs
      excluded: XID 79 on GPU 5, 6"); for the explanation and /metrics, never decided on.
    gpu_sm_active: mean DCGM SM-active ratio (0..1) of the model's ready pods' GPUs, the
      useful share of their GPU time; None = no DCGM reading (the replicas' busy ratio
      stands in).
    grace_period_s: the shortest terminationGracePeriodSeconds of the target's live pods:
      how long a removed replica may finish what it runs before it is killed (None =
      unknown). Only for the explanation of a scale-down (`spare.cut_warning`).
    """

    current: int
    ready: int
    starting: tuple[float, ...] = ()
    free_replica_slots: int | None = None
    observations: tuple[ColdStartObservation, ...] = ()
    budget_gpus: int | None = None
    budget_reason: str | None = None
    busy_replicas: int | None = None
    excluded_gpus: int = 0
    capacity_notes: tuple[str, ...] = ()
    gpu_sm_active: float | None = None
    grace_period_s: float | None = None

    def with_budget(self, budget_gpus: int, reason: str) -> ClusterState:
        """This state under an external cap of `budget_gpus` GPUs, said why (the fleet's
        grant, once an evaluation): `dataclasses.replace` at half its cost."""
        state = _copied(self, _CLUSTER_STATE_FIELDS)
        _set_slot(state, "budget_gpus", budget_gpus)
        _set_slot(state, "budget_reason", reason)
        return state


@fast_init
@dataclass(frozen=True, slots=True)
class Recommendation:
    """A time-stamped recommendation kept for stabilization windows.

    `load`: when it was made while a backlog was being served (overloaded or draining),
    the replicas the load alone needed then (None otherwise): once the backlog is gone the
    down window holds that, not what draining it took.
    `tolerated`: one less than `replicas` when that count's tolerance (or its utilisation
    margin) would have kept it for the same reading (None otherwise): what the down window
    holds, so a reading at 2.05 replicas, rounded up to 3, holds 2 and not 3.
    """

    at: float
    replicas: int
    load: int | None = None
    tolerated: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """A change the engine decided, kept for rate-limit periods."""

    at: float
    delta: int


@fast_init
@dataclass(frozen=True, slots=True)
class DemandSample:
    """Demand, in the capacity unit of concurrency (requests), at a time."""

    at: float
    demand: float


@fast_init
@dataclass(frozen=True, slots=True)
class BacklogSample:
    """Requests in the system (waiting + running) and finishing per second at a time, for
    the flow balance."""

    at: float
    requests: float
    completion_rate: float = 0.0


@fast_init
@dataclass(frozen=True, slots=True)
class LevelReturn:
    """A level of demand back `after_s` seconds after it was last recommended (the count
    it needs reached again within the down window): how long holding would have paid."""

    at: float
    after_s: float


@fast_init
@dataclass(frozen=True, slots=True)
class ForecastCheck:
    """A forecast to check against what happened: at `due_at`, demand was predicted to
    be `predicted` (from `base` when it was made)."""

    due_at: float
    base: float
    predicted: float


@fast_init
@dataclass(frozen=True, slots=True)
class EngineState:
    """Everything the engine remembers between decisions. Immutable; `decide` returns a new one.

    recommendations: raw recommendations within the longest stabilization window.
    events: scale changes within the longest rate-limit period.
    demand: demand samples within the forecast window (for the trend).
    learned_pod_start_s / learned_node_boot_s: smoothed observed start times (None until
      observed); last_observation_at: the newest observation already learned from.
    replicas_per_request_rate: smoothed load of one request per second, in replicas,
      learned from the arrival rate while the model is not saturated (None until seen);
      load_samples: how many samples it was learned from (the first few are averaged).
    last_desired: the last decided replicas (None before the first decision).
    forecast_check / horizon_scale: the look-ahead checking itself: the outstanding
      forecast to compare with what happened, and the share of the trend still trusted
      (1 = all; halved towards what came true each time a forecast overshot).
    backlog: requests in the system over the last FLOW_WINDOW_S, whose growth plus the
      completion rate is the arrival rate where no source reports one (flow balance).
    overloaded_at: when the model was last overloaded (None before): a backlog built then
      drains for a while after, and while it drains it is not load.
    drop_at / drop_level / return_gap_s / returns: restart-aware holding: when demand
      last fell away (and the count the load held then: `decide._held_level`), how long
      load took to come back after earlier drops (smoothed; None until seen), and how
      many returns in a row came after about that gap (a pattern once there are two).
    return_jitter_s: how far those returns came from the learned gap (smoothed mean
      absolute deviation; None until a return was measured against one): a regular
      return is planned with less slack (`decide._return_slack_s`).
    last_drop_at / drop_cycle_s / drop_cycles: when demand last fell away, the time from
      one drop to the next (smoothed; None until seen) and how many came after about
      that time in a row (a cycle once there are two): a rise is not extrapolated past
      the next drop (`decide._until_drop`); drop_jitter_s: how far those drops came from
      the cycle (smoothed mean absolute deviation, as return_jitter_s).
    cycle_demand / last_cycle_demand: the highest demand read in each CYCLE_BIN_S of the
      time since the last drop, for this cycle and for the one before it (`decide.UNREAD`
      where nothing was read): what a cycle needs when (`decide.cycle_ahead`).
    served_share / served_samples: the share of the tokens/s capacity model that replicas
      were seen to serve while saturated (1 until seen), and how many samples it holds.
    saturated_since / saturated_ready: when the current overload began and the ready
      replicas then (0 once that count changed: the backlog sits on the replicas that were
      ready when it formed, and new ones serve only new arrivals).
    level_returns / level_leaves: restart-aware holding without a pattern: the returns
      of a level of demand within the down window (LevelReturn) that may still be the
      longest of the last HOLD_MEMORY_S (from the longest down: a newer return as long
      replaces an older one), and when levels were seen to leave for good (not
      recommended again within the window); the hold is learned from them
      (`decide.learned_hold`).
    """

    recommendations: tuple[Recommendation, ...] = ()
    events: tuple[ScaleEvent, ...] = ()
    demand: tuple[DemandSample, ...] = ()
    learned_pod_start_s: float | None = None
    learned_node_boot_s: float | None = None
    last_observation_at: float = float("-inf")
    replicas_per_request_rate: float | None = None
    load_samples: int = 0
    last_desired: int | None = None
    forecast_check: ForecastCheck | None = None
    horizon_scale: float = 1.0
    backlog: tuple[BacklogSample, ...] = ()
    overloaded_at: float | None = None
    drop_at: float | None = None
    drop_level: int = 0
    return_gap_s: float | None = None
    returns: int = 0
    return_jitter_s: float | None = None
    last_drop_at: float | None = None
    drop_cycle_s: float | None = None
    drop_cycles: int = 0
    drop_jitter_s: float | None = None
    cycle_demand: tuple[float, ...] = ()
    last_cycle_demand: tuple[float, ...] = ()
    served_share: float = 1.0
    served_samples: int = 0
    saturated_since: float | None = None
    saturated_ready: int = 0
    level_returns: tuple[LevelReturn, ...] = ()
    level_leaves: tuple[float, ...] = ()

    def remembering(
        self, *, recommendations: tuple[Recommendation, ...], events: tuple[ScaleEvent, ...],
        demand: tuple[DemandSample, ...], backlog: tuple[BacklogSample, ...],
        last_desired: int,
    ) -> EngineState:
        """This state with a decision's windows and count (what `decide` keeps of each).

        `dataclasses.replace` at half its cost, once a decision: it looks every field up
        by name and checks it, then the frozen `__init__` sets each through
        `object.__setattr__`; this copies the slots and sets the five.
        """
        state = _copied(self, _ENGINE_STATE_FIELDS)
        _set_slot(state, "recommendations", recommendations)
        _set_slot(state, "events", events)
        _set_slot(state, "demand", demand)
        _set_slot(state, "backlog", backlog)
        _set_slot(state, "last_desired", last_desired)
        return state


@dataclass(frozen=True, slots=True)
class Learned:
    """What the engine learned of a model that outlives its windows, carried across a
    restart or a failover (`scaler.service.learned` keeps it in a ConfigMap).

    The windows (recommendations, events, demand, backlog) are minutes of evidence a new
    instance gathers again, and a restart seeds the down window with the current count;
    these take saturation, returns of load or slow pod starts to learn, and without them a
    restarted instance sizes a memory-bound mix by a capacity model it had found wrong.
    The last hour's level returns and leaves (`level_returns`, `level_leaves`: epoch
    times) are kept too: without them a restarted instance holds every fall the whole
    down window until it has seen levels leave twice again. So is a load's cycle (the
    last drop's epoch time, the cycle, its drops and jitter, and the demand profiles of
    this cycle and the last): without it a restarted instance holds the down window and
    extrapolates each climb past its drop until it has seen three drops again.
    Fields as in EngineState: pod_start_s / node_boot_s are `learned_pod_start_s` /
    `learned_node_boot_s`, observed_until is `last_observation_at`.
    """

    pod_start_s: float | None = None
    node_boot_s: float | None = None
    observed_until: float = float("-inf")
    replicas_per_request_rate: float | None = None
    load_samples: int = 0
    served_share: float = 1.0
    served_samples: int = 0
    return_gap_s: float | None = None
    returns: int = 0
    return_jitter_s: float | None = None
    horizon_scale: float = 1.0
    level_returns: tuple[LevelReturn, ...] = ()
    level_leaves: tuple[float, ...] = ()
    last_drop_at: float | None = None
    drop_cycle_s: float | None = None
    drop_cycles: int = 0
    drop_jitter_s: float | None = None
    cycle_demand: tuple[float, ...] = ()
    last_cycle_demand: tuple[float, ...] = ()

    @classmethod
    def of(cls, state: EngineState) -> Learned:
        return cls(**{mine: getattr(state, theirs) for mine, theirs in _LEARNED_IN_STATE})

    def state(self) -> EngineState:
        """A first engine state that starts from what was learned (empty windows)."""
        return EngineState(**{theirs: getattr(self, mine) for mine, theirs in _LEARNED_IN_STATE})

    def onto(self, state: EngineState) -> EngineState:
        """`state` with what was learned replaced by this, its windows kept."""
        return dataclasses.replace(
            state, **{theirs: getattr(self, mine) for mine, theirs in _LEARNED_IN_STATE})


# Each Learned field and the EngineState field it is (the same name but for three).
_LEARNED_IN_STATE = tuple(
    (f.name, {"pod_start_s": "learned_pod_start_s", "node_boot_s": "learned_node_boot_s",
              "observed_until": "last_observation_at"}.get(f.name, f.name))
    for f in dataclasses.fields(Learned))


_Frozen = TypeVar("_Frozen", ClusterState, EngineState)
_set_slot = object.__setattr__  # how a frozen dataclass sets its own fields


def _copied(source: _Frozen, fields: tuple[str, ...]) -> _Frozen:
    """A copy of a frozen slots dataclass made slot by slot, without `__init__` (these
    classes have no `__post_init__`), for the caller to set the fields it changes."""
    copy: _Frozen = object.__new__(type(source))
    for name in fields:
        _set_slot(copy, name, getattr(source, name))
    return copy


_ENGINE_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineState))
_CLUSTER_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(ClusterState))


class OpinionKind(enum.Enum):
    """What an opinion measures, which decides how it is combined.

    CAPACITY: replicas the load needs (concurrency, tokens/s, arrival rate, the forecast);
      it sets demand, the trend, and gets the tolerance band.
    PRESSURE: a queue beyond its target; pushes up in proportion, never down, and is left
      out of the trend (a queue that builds while capacity lags is the scaler's own echo).
    GUARD: the latency guard; pushes up toward the SLO, never down.
    """

    CAPACITY = "capacity"
    PRESSURE = "pressure"
    GUARD = "guard"


class Rule(enum.StrEnum):
    """What can hold an opinion in a decision: a signal's rule, or the look-ahead."""

    CONCURRENCY = "concurrency"
    QUEUE_DEPTH = "queue_depth"
    TOKENS_PER_SECOND = "tokens_per_second"
    P95_LATENCY = "p95_latency"
    ARRIVAL_RATE = "arrival_rate"
    KV_CACHE = "kv_cache"
    FORECAST = "forecast"
    RETURN = "return"
    CYCLE = "cycle"

    @property
    def kind(self) -> OpinionKind:
        # A table, not `self is Rule.X` tests: reading a member through its class takes
        # about 0.1 us (ten times a global), and the kind is asked 14 times a decision.
        return _RULE_KINDS[self]


_RULE_KINDS: dict[Rule, OpinionKind] = {rule: OpinionKind.CAPACITY for rule in Rule} | {
    Rule.QUEUE_DEPTH: OpinionKind.PRESSURE, Rule.P95_LATENCY: OpinionKind.GUARD}


class ClampName(enum.StrEnum):
    """A bound or rule that can change the recommendation on its way to the decision."""

    BACKLOG = "backlog"
    STABILIZATION_UP = "stabilization_up"
    STABILIZATION_DOWN = "stabilization_down"
    RATE_LIMIT_UP = "rate_limit_up"
    RATE_LIMIT_DOWN = "rate_limit_down"
    HOLD_STALE = "hold_stale"
    MIN = "min"
    WARM_FLOOR = "warm_floor"
    MAX = "max"
    BUDGET = "budget"
    EXTERNAL_BUDGET = "external_budget"
    UNFINISHED_WORK = "unfinished_work"


class StepName(enum.StrEnum):
    """The decision pipeline's steps, in order (each can be read and changed alone)."""

    SIGNALS = "signals"
    LOAD = "load"
    LOOK_AHEAD = "look_ahead"
    RECOMMEND = "recommend"
    BACKLOG = "backlog"
    STABILIZE = "stabilize"
    RATE_LIMIT = "rate_limit"
    SAFETY = "safety"
    BOUNDS = "bounds"


@fast_init
@dataclass(frozen=True, slots=True)
class Step:
    """What one pipeline step made of the count: `replicas` after it (None before the
    recommendation exists), and in a few words why."""

    name: StepName
    replicas: int | None
    detail: str


@fast_init
@dataclass(frozen=True, slots=True)
class SignalReason:
    """One rule's part in a decision."""

    name: Rule
    value: float | None
    age_s: float | None
    fresh: bool
    recommendation: int | None
    detail: str


@fast_init
@dataclass(frozen=True, slots=True)
class Clamp:
    """A bound or rule that changed the replica count from `before` to `after`."""

    name: ClampName
    before: int
    after: int
    detail: str


@fast_init
@dataclass(frozen=True, slots=True)
class Forecast:
    """The cold-start look-ahead used by a decision. Demand is in replicas (fractional).

    demand_now: the fitted demand now; slope_per_s: its trend (never negative: the
    look-ahead only adds); demand_at_ready: demand_now + slope x horizon_scale x
    time_to_ready_s; replicas_at_node_ready: the forecast one node boot further, for node
    headroom. horizon_scale: the share of the trend trusted after checking past forecasts;
    step: the window read as a step (no trend extrapolated through it); recent: the slope
    held to what the demand's last 30 s allow (a rise that has stopped is no trend);
    drop_in_s: the load falls away this soon, as it has every cycle, before a replica
    started now is ready: the trend is extrapolated up to then only (None otherwise).
    """

    time_to_ready_s: float
    needs_node: bool
    demand_now: float
    slope_per_s: float
    demand_at_ready: float
    replicas_at_ready: int
    replicas_at_node_ready: int
    horizon_scale: float = 1.0
    step: bool = False
    recent: bool = False
    drop_in_s: float | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer for one model at one time, with every reason."""

    model: str
    at: float
    current: int
    desired: int
    recommendation: int | None
    winner: Rule | None
    signals: tuple[SignalReason, ...]
    clamps: tuple[Clamp, ...] = ()
    forecast: Forecast | None = None
    held: bool = False
    notes: tuple[str, ...] = field(default=())
    steps: tuple[Step, ...] = field(default=())
    cut_warning: str | None = None  # a scale-down that kills answers in flight: why

    @property
    def changed(self) -> bool:
        return self.desired != self.current

    @property
    def summary(self) -> str:
        """One line, for Kubernetes Events and logs."""
        verb = "hold" if not self.changed else ("scale up" if self.desired > self.current else
                                                 "scale down")
        why = self.winner or "no fresh signal"
        parts = [f"{verb} {self.current}->{self.desired} ({why})"]
        parts.extend(f"{c.name}: {c.before}->{c.after}" for c in self.clamps)
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class PoolDemand:
    """One model's GPU demand on a node pool, for node planning."""

    model: str
    gpus_per_replica: int
    replicas: int
    forecast_replicas: int


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What a node pool needs: nodes for the decided replicas plus warm headroom.

    nodes_for_replicas: nodes the bin-packing of desired replicas needs.
    headroom_nodes: spare nodes to keep booted (forecast within one node boot + static floor).
    nodes_wanted: nodes_for_replicas + headroom_nodes, capped by the pool's max.
    placeholder_pods / placeholder_gpus: the placeholder actuator's Deployment size: one pod
      per headroom node, each requesting a whole node's GPUs, so real replicas preempt them.
    """

    pool: str
    resource_name: str
    gpus_per_node: int
    nodes_for_replicas: int
    headroom_nodes: int
    nodes_wanted: int
    placeholder_pods: int
    placeholder_gpus: int
    reasons: tuple[str, ...] = ()
