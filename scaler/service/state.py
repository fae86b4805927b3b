"""The service's in-memory registry of policies, latest decisions and snapshots, and counters.

The reactor writes here after every evaluation; the external metrics API, `/metrics`,
`/v1/models/...` and readiness read from here. One event loop owns it, so no locks.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from scaler.engine import cost as engine_cost
from scaler.engine import types
from scaler.engine import variants as engine_variants
from scaler.policy import loader, model
from scaler.service import history as decision_history

# Labels every model carries in the external metrics API and /metrics, beside its policy's
# metadata.labels (which cannot override these).
MODEL_LABEL = "model"
NAMESPACE_LABEL = "namespace"
TARGET_LABEL = "target"
TENANT_LABEL = model.TENANT_LABEL
COST_CENTER_LABEL = model.COST_CENTER_LABEL


@types.fast_init  # built every evaluation
@dataclass(frozen=True, slots=True)
class VariantObservation:
    """One variant of a model with spec.variants at an evaluation (`service.variants`):
    its count in the fleet's last mix (None before the first), its target's spec.replicas,
    ready and starting replicas as read, what one replica holds (GPUs) and one of its
    GPU-hours costs (its gpuHourly, else its GpuPool's, else spec.cost's), the HPA or
    ScaledObject that scales its target instead of the scaler (None: the scaler does),
    and the DCGM SM-active ratio of its ready pods' GPUs (None: no reading)."""

    name: str
    target: str
    pool: str
    desired: int | None
    current: int
    ready: int
    starting: int
    gpus_per_replica: int
    gpu_hourly: float
    owner: str | None = None
    gpu_sm_active: float | None = None


@types.fast_init  # built every evaluation
@dataclass(frozen=True, slots=True)
class Observation:
    """One evaluation: what was seen (snapshot, cluster) and decided, at wall time `at`;
    for a model with variants, each variant's (the cluster state is their
    capacity-equivalent sum)."""

    decision: types.Decision
    snapshot: types.SignalSnapshot
    cluster: types.ClusterState
    at: float
    variants: tuple[VariantObservation, ...] = ()
    # The engine state the model is decided from next (what it has learned is read from
    # it only when explained: `types.Learned.of`).
    engine: types.EngineState | None = None


BUSY_DCGM = "dcgm"  # DCGM SM-active ratio of the model's pods' GPUs: measured
BUSY_REPLICAS = "replicas"  # the replicas' own load over their capacity: estimated
BUSY_ASSUMED = "assumed"  # neither: counted fully busy
BUSY_SOURCES = (BUSY_DCGM, BUSY_REPLICAS, BUSY_ASSUMED)


def busy_reading(policy: model.ScalePolicy, obs: Observation) -> tuple[float, str]:
    """Fraction of the ready replicas' GPU time that is useful, 0..1, and its source.

    DCGM first: the SM-active ratio of the model's ready pods' GPUs (the cost formula's
    own measure, DESIGN 1). Without it, the policy's capacity unit: in-flight requests
    over `ready * targetPerReplica` (concurrency), else tokens/s over
    `ready * capacityPerReplica`. E.g. 30 in flight on 2 ready replicas with a target of
    48 each: 30 / 96 = 0.31. Unknown (no such signal) counts as 1: it is better to
    under-report idle cost than to invent it.
    """
    ready = obs.cluster.ready
    if ready <= 0:
        return 0.0, BUSY_ASSUMED
    if obs.cluster.gpu_sm_active is not None:
        return _unit(obs.cluster.gpu_sm_active), BUSY_DCGM
    return _estimated(policy, obs.snapshot, ready=ready)


def _estimated(policy: model.ScalePolicy, snapshot: types.SignalSnapshot, *, ready: float
               ) -> tuple[float, str]:
    """`busy_reading` from the policy's capacity unit, for `ready` (> 0) replicas of its
    own per-replica capacity."""
    signals = policy.spec.signals
    if signals.concurrency is not None and snapshot.in_flight is not None:
        capacity = ready * signals.concurrency.target_per_replica
        return _unit(snapshot.in_flight.value / capacity), BUSY_REPLICAS
    if signals.tokens_per_second is not None and snapshot.tokens_per_second is not None:
        capacity = ready * signals.tokens_per_second.capacity_per_replica
        return _unit(snapshot.tokens_per_second.value / capacity), BUSY_REPLICAS
    return 1.0, BUSY_ASSUMED


def busy_ratio(policy: model.ScalePolicy, obs: Observation) -> float:
    """The useful fraction of `busy_reading`, without its source."""
    return busy_reading(policy, obs)[0]


def _unit(ratio: float) -> float:
    if math.isnan(ratio):
        return 0.0
    return min(1.0, max(0.0, ratio))


def accrue(
    totals: engine_cost.Cost, *, policy: model.ScalePolicy, since: Observation, until: float
) -> engine_cost.Cost:
    """Add the GPU time from `since.at` to `until` at the allocation `since` observed.

    Allocated pods are the ready plus the starting ones: a cold start holds its GPUs.
    Worked example (DESIGN 1): 4 one-GPU replicas for 24 h at 2.50 per GPU-hour is 96
    GPU-hours costing 240; at 35 % busy, 0.65 * 240 = 156 of it is idle cost.
    """
    seconds = max(0.0, until - since.at)
    if seconds == 0.0:
        return totals
    arrivals = since.snapshot.arrival_rate
    requests = arrivals.value * seconds if arrivals is not None and arrivals.value > 0 else 0.0
    if since.variants:  # each variant's GPUs at its own price; the requests are the model's
        spent = variant_costs(policy=policy, since=since, seconds=seconds)
        return sum(spent.values(), totals + engine_cost.Cost(requests=requests))
    gpus_per_replica = policy.spec.resources.gpus_per_replica
    allocated = (since.cluster.ready + len(since.cluster.starting)) * gpus_per_replica
    useful = since.cluster.ready * gpus_per_replica * busy_ratio(policy, since)
    return totals + engine_cost.of_gpu_time(
        allocated_gpu_seconds=allocated * seconds, useful_gpu_seconds=useful * seconds,
        gpu_hourly=policy.spec.cost.gpu_hourly, requests=requests)


def variant_costs(*, policy: model.ScalePolicy, since: Observation, seconds: float
                  ) -> dict[str, engine_cost.Cost]:
    """The GPU time of `seconds` at the allocation `since` observed, per variant: its
    ready and starting replicas x its own GPUs per replica, at its own GPU-hour price.

    Useful time: the variant's DCGM SM-active ratio where read, else the model's load
    over what all variants' ready replicas serve (the policy's capacity unit). Example:
    2 H100 replicas of 2 GPUs at 2.0 and 4 L40S of 1 GPU at 1.0 for one hour are 4 + 4
    GPU-hours costing 8.0 + 4.0 = 12.0 (the model's 10 yardstick replicas of 1 GPU at
    spec.cost's 2.5 would have read 10 GPU-hours and 25.0). With 50 in flight on 2 x 30
    + 4 x 10 = 100 served, each variant is half busy: idle 4.0 + 2.0.
    """
    weight = dict(zip((v.name for v in policy.spec.variants),
                      engine_variants.weights_of(policy), strict=True))
    # The ready replicas in yardstick replicas, unrounded: 2 H100 of 30 + 4 L40S of 10 at
    # targetPerReplica 10 are 2 x 3 + 4 x 1 = 10.
    ready = sum(row.ready * weight.get(row.name, 0.0) for row in since.variants)
    shared = _estimated(policy, since.snapshot, ready=ready)[0] if ready > 0 else 0.0
    out = {}
    for row in since.variants:
        busy = shared if row.gpu_sm_active is None else _unit(row.gpu_sm_active)
        out[row.name] = engine_cost.of_gpu_time(
            allocated_gpu_seconds=(row.ready + row.starting) * row.gpus_per_replica * seconds,
            useful_gpu_seconds=row.ready * row.gpus_per_replica * busy * seconds,
            gpu_hourly=row.gpu_hourly)
    return out


def accrue_variants(totals: Mapping[str, engine_cost.Cost], *, policy: model.ScalePolicy,
                    since: Observation, until: float) -> dict[str, engine_cost.Cost]:
    """`totals` by variant name plus each variant's GPU time from `since.at` to `until`
    (`variant_costs`); they sum to what `accrue` adds to the model, less its requests."""
    out = dict(totals)
    seconds = max(0.0, until - since.at)
    if seconds > 0.0 and since.variants:
        for name, spent in variant_costs(policy=policy, since=since, seconds=seconds).items():
            out[name] = out.get(name, engine_cost.Cost()) + spent
    return out


def decision_outcome(decision: types.Decision) -> str:
    """'up', 'down', 'hold', or 'held' (kept because signals were stale or missing)."""
    if decision.held and not decision.changed:
        return "held"
    if decision.desired > decision.current:
        return "up"
    if decision.desired < decision.current:
        return "down"
    return "hold"


def model_labels(policy: model.ScalePolicy) -> dict[str, str]:
    """The label set a model is selected by (external metrics API labelSelector)."""
    labels = dict(policy.metadata.labels)
    labels[MODEL_LABEL] = policy.metadata.name
    labels[NAMESPACE_LABEL] = policy.metadata.namespace
    labels[TARGET_LABEL] = policy.spec.target.name
    return labels


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """A read-only view of one model for the APIs; counters are totals since start."""

    policy: model.ScalePolicy
    last: Observation | None
    decisions: Mapping[str, int]
    patches: Mapping[str, int]
    clamps: Mapping[str, int]
    cost: engine_cost.Cost
    evaluation_errors: int = 0
    last_scale_at: float | None = None  # the newest decision that asked for another count
    resumed_at: float | None = None  # when the learned state this instance resumed was written
    # a model with variants: each variant's share of `cost` (requests are the model's)
    variant_costs: Mapping[str, engine_cost.Cost] = field(default_factory=dict)
    since: float = 0.0  # wall time the policy came into force (`silence` judges from it)

    @property
    def key(self) -> str:
        return self.policy.key

    @property
    def labels(self) -> dict[str, str]:
        return model_labels(self.policy)


@dataclass(frozen=True, slots=True)
class PolicyLoadStatus:
    """The outcome of the latest policy (re)load.

    errors: every problem found, naming file, document and field.
    kept: keys of policies whose new version was invalid, so the last good one stays.
    """

    at: float
    policies: int
    errors: tuple[loader.PolicyError, ...] = ()
    kept: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(slots=True)
class _Entry:
    """Mutable per-model record; only ServiceState touches it."""

    policy: model.ScalePolicy
    since: float = 0.0  # wall time the policy came into force (its first load)
    last: Observation | None = None
    decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    patches: collections.Counter[str] = field(default_factory=collections.Counter)
    clamps: collections.Counter[str] = field(default_factory=collections.Counter)
    cost: engine_cost.Cost = field(default_factory=engine_cost.Cost)
    variant_costs: dict[str, engine_cost.Cost] = field(default_factory=dict)
    evaluation_errors: int = 0
    last_scale_at: float | None = None
    resumed_at: float | None = None
    history: decision_history.History = field(default_factory=decision_history.History)


DropCounter = Callable[[], Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """A signal source's health, read at scrape time.

    up: connected (if it holds a connection) and no target's latest poll failed.
    connected: its NATS connection is up now; None for a source that holds none.
    errors: failed polls and connection errors since start, by kind.
    """

    up: bool
    connected: bool | None
    errors: Mapping[str, int]


HealthReader = Callable[[], SourceHealth]


@dataclass(frozen=True, slots=True)
class SilentModel:
    """A model none of whose sources has said anything fresh for longer than its
    staleAfterSeconds: its replicas are held, and nothing will scale it up.

    silent_s: seconds since the newest value (or, with no value at all, since its policy
    came into force); values_seen: whether any source's value was still retained.
    """

    key: str
    silent_s: float
    stale_after_s: float
    values_seen: bool

    def __str__(self) -> str:
        what = ("no fresh signal from any source" if self.values_seen
                else "no signal from any source")
        return (f"{self.key}: {what} for {self.silent_s:.0f} s (staleAfterSeconds "
                f"{self.stale_after_s:g}); replicas are held")


def silence(policy: model.ScalePolicy, last: Observation | None, *, since: float,
            now: float) -> SilentModel | None:
    """Whether every source of a model has been silent past its stale limit at `now`.

    From the last evaluation's snapshot, aged to `now`: e.g. a newest value 20 s old at an
    evaluation 15 s ago is 35 s old, past a 30 s limit. A model not evaluated yet is not
    judged (its evaluations may be failing for other reasons, counted elsewhere).
    """
    if last is None:
        return None
    limit = policy.spec.stale_after_seconds
    since_evaluation = max(0.0, now - last.at)
    ages = [value.age_s + since_evaluation for _, value in last.snapshot.items()
            if value is not None]
    silent_s = min(ages) if ages else max(0.0, now - since)
    if silent_s <= limit:
        return None
    return SilentModel(key=policy.key, silent_s=silent_s, stale_after_s=limit,
                       values_seen=bool(ages))


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """A node pool's latest plan, what the pool actuator did with it, and counts by outcome."""

    plan: types.NodePlan
    outcome: str
    reason: str
    at: float
    applies: Mapping[str, int]


EVALUATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the evaluation-time histogram, in seconds: a decision alone takes well
under 5 ms; a cluster read and a scale patch add one or two API round trips (10-100 ms);
seconds mean a slow API server or retries."""


@dataclass(slots=True)
class Durations:
    """A cumulative histogram of durations in seconds, as Prometheus keeps one: `counts[i]`
    is how many took at most `bounds[i]`."""

    bounds: tuple[float, ...] = EVALUATION_BUCKETS_S
    # How many fell in each bucket alone (above the previous bound, at most this one):
    # one count an observation, once an evaluation, summed into `counts` once a scrape.
    in_bucket: list[int] = field(default_factory=lambda: [0] * len(EVALUATION_BUCKETS_S))
    count: int = 0
    total_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        index = bisect.bisect_left(self.bounds, seconds)  # the first bound >= seconds
        if index < len(self.in_bucket):
            self.in_bucket[index] += 1

    @property
    def counts(self) -> list[int]:
        return list(itertools.accumulate(self.in_bucket))


class ServiceState:
    """Latest decisions and snapshots per model, plus service-wide status."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._load: PolicyLoadStatus | None = None
        self._reloads: collections.Counter[str] = collections.Counter()
        self._leader: bool | None = None
        self.shard = 0  # which shard this instance is (sharding.shard), a label of /metrics
        # With several shards: every model's shard, to say where a model asked of this one
        # is evaluated (`http_api`); empty with one shard.
        self.shard_of: Mapping[str, int] = {}
        self._drop_sources: dict[str, DropCounter] = {}
        self.deletion_costs: DropCounter = dict
        # The engine's learned state kept in a ConfigMap (scaler.service.learned): records
        # by outcome (resumed, stale, policy_changed, malformed, implausible, omitted) and
        # the leader's writes (written, failed).
        self.learned_records: collections.Counter[str] = collections.Counter()
        self.learned_writes: collections.Counter[str] = collections.Counter()
        """Pod deletion-cost patches by outcome (`patched`, `failed`, `list_failed`)."""
        self._health: dict[str, HealthReader] = {}
        self._draining = False
        self._pools: dict[str, PoolStatus] = {}
        self._metrics_api_requests: collections.Counter[int] = collections.Counter()
        self.evaluation_seconds = Durations()
        """How long evaluations take, cluster read to patch, over every model."""

    # -- policies -------------------------------------------------------------------------

    def set_policies(
        self, policies: Iterable[model.ScalePolicy], *, status: PolicyLoadStatus
    ) -> None:
        """Replace the policy set. Models that stay keep their history; removed ones go."""
        fresh: dict[str, _Entry] = {}
        for policy in policies:
            entry = self._entries.get(policy.key)
            if entry is None:
                entry = _Entry(policy=policy, since=status.at)
            else:
                entry.policy = policy
            fresh[policy.key] = entry
        self._entries = fresh
        pools = {e.policy.spec.node_pool.name for e in fresh.values() if e.policy.spec.node_pool}
        pools |= {v.node_pool for e in fresh.values() for v in e.policy.spec.variants}
        self._pools = {name: pool for name, pool in self._pools.items() if name in pools}
        self._load = status
        self._reloads["ok" if status.ok else "invalid"] += 1

    @property
    def policy_load(self) -> PolicyLoadStatus | None:
        return self._load

    @property
    def reloads(self) -> Mapping[str, int]:
        return dict(self._reloads)

    def policy(self, key: str) -> model.ScalePolicy | None:
        entry = self._entries.get(key)
        return entry.policy if entry else None

    def keys(self) -> list[str]:
        return list(self._entries)

    # -- leadership -----------------------------------------------------------------------

    @property
    def leader(self) -> bool | None:
        """True when this replica holds the Lease, False when another does, None unknown."""
        return self._leader

    def set_leader(self, leader: bool) -> None:
        self._leader = leader

    def set_draining(self) -> None:
        """Shutting down: readiness fails so traffic and probes move elsewhere."""
        self._draining = True

    @property
    def ready(self) -> bool:
        """Ready when policies were loaded once and the leader state is known."""
        return self._load is not None and self._leader is not None and not self._draining

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        if self._draining:
            reasons.append("shutting down")
        if self._load is None:
            reasons.append("policies not loaded yet")
        if self._leader is None:
            reasons.append("leader state unknown")
        return reasons

    # -- evaluations ----------------------------------------------------------------------

    def record(self, key: str, observation: Observation, *, outcome: str | None = None,
               apply_reason: str = "") -> None:
        """Store an evaluation, count it, add it to the history with what the actuator did
        (`outcome`, None when unknown), and accrue GPU time since the previous one."""
        entry = self._entries.get(key)
        if entry is None:
            return  # the policy was removed while it was being evaluated
        if entry.last is not None:
            entry.cost = accrue(entry.cost, policy=entry.policy, since=entry.last,
                                until=observation.at)
            if entry.last.variants:
                entry.variant_costs = accrue_variants(entry.variant_costs, policy=entry.policy,
                                                      since=entry.last, until=observation.at)
        entry.last = observation
        if observation.decision.changed:
            # Kept apart from `last`: a status written at the backstop tick's pace must
            # not miss a scale that a later unchanged decision has since replaced.
            entry.last_scale_at = observation.decision.at
        entry.history.add(decision_history.event_of(observation.decision, outcome=outcome,
                                                    apply_reason=apply_reason),
                          at=observation.at)
        entry.decisions[decision_outcome(observation.decision)] += 1
        for clamp in observation.decision.clamps:
            entry.clamps[clamp.name] += 1

    def record_patch(self, key: str, outcome: str) -> None:
        """Count a patch attempt: 'applied', 'conflict', 'failed', 'dry_run', ..."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.patches[outcome] += 1

    def record_evaluation_error(self, key: str) -> None:
        """Count an evaluation that failed (the model kept its replicas)."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.evaluation_errors += 1

    def record_resumed(self, key: str, written_at: float) -> None:
        """The model started from what an earlier instance learned, written at `written_at`."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.resumed_at = written_at

    def record_evaluation_seconds(self, seconds: float) -> None:
        """Time one evaluation (of any model) took, the cluster read and patch included."""
        self.evaluation_seconds.observe(seconds)

    def record_requests(self, key: str, count: float) -> None:
        """Add served requests counted elsewhere (e.g. HTTP push), for cost per 1k requests."""
        entry = self._entries.get(key)
        if entry is not None and count > 0:
            entry.cost = dataclasses.replace(entry.cost, requests=entry.cost.requests + count)

    def record_pool(self, plan: types.NodePlan, *, outcome: str, reason: str, at: float
                    ) -> None:
        """Store a node pool's plan and the outcome of applying it."""
        previous = self._pools.get(plan.pool)
        applies = collections.Counter(previous.applies if previous else {})
        applies[outcome] += 1
        self._pools[plan.pool] = PoolStatus(plan=plan, outcome=outcome, reason=reason, at=at,
                                            applies=dict(applies))

    def pools(self) -> list[PoolStatus]:
        return [self._pools[name] for name in sorted(self._pools)]

    # -- dropped messages -----------------------------------------------------------------

    def add_drop_counter(self, source: str, counter: DropCounter) -> None:
        """Register a signal source's dropped-message counts (reason -> count)."""
        self._drop_sources[source] = counter

    def dropped(self) -> dict[tuple[str, str], int]:
        """(source, reason) -> messages dropped since start."""
        out: dict[tuple[str, str], int] = {}
        for source, counter in self._drop_sources.items():
            for reason, count in counter().items():
                out[(source, reason)] = count
        return out

    # -- source health --------------------------------------------------------------------

    def add_source_health(self, source: str, reader: HealthReader) -> None:
        """Register a signal source's health (up, connected, errors by kind)."""
        self._health[source] = reader

    def source_health(self) -> dict[str, SourceHealth]:
        """source -> its health now."""
        return {source: reader() for source, reader in self._health.items()}

    def silent_models(self, now: float) -> list[SilentModel]:
        """Models whose every source has been silent past their staleAfterSeconds."""
        found = (silence(e.policy, e.last, since=e.since, now=now)
                 for e in self._entries.values())
        return [each for each in found if each is not None]

    # -- external metrics API -------------------------------------------------------------

    def record_metrics_api_request(self, code: int) -> None:
        """Count one answer of the external metrics API by HTTP status (401, 403, 200...)."""
        self._metrics_api_requests[code] += 1

    @property
    def metrics_api_requests(self) -> Mapping[int, int]:
        return dict(self._metrics_api_requests)

    # -- reads ----------------------------------------------------------------------------

    def status(self, key: str) -> ModelStatus | None:
        entry = self._entries.get(key)
        return None if entry is None else _view(entry)

    def statuses(self) -> list[ModelStatus]:
        return [_view(entry) for entry in self._entries.values()]

    def history(self, key: str, *, limit: int | None = None
                ) -> list[decision_history.Entry] | None:
        """The newest `limit` history entries of a model, oldest first; None if unknown."""
        entry = self._entries.get(key)
        return None if entry is None else entry.history.entries(limit)

    def find_by_name(self, name: str) -> list[ModelStatus]:
        """Models called `name` in any namespace (for /v1/models/{model}/decision)."""
        return [_view(e) for e in self._entries.values() if e.policy.metadata.name == name]


def _view(entry: _Entry) -> ModelStatus:
    return ModelStatus(
        policy=entry.policy,
        last=entry.last,
        decisions=dict(entry.decisions),
        patches=dict(entry.patches),
        clamps=dict(entry.clamps),
        cost=entry.cost,
        variant_costs=entry.variant_costs,  # replaced on each accrual, never changed
        evaluation_errors=entry.evaluation_errors,
        resumed_at=entry.resumed_at,
        last_scale_at=entry.last_scale_at,
        since=entry.since,
    )
