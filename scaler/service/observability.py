"""`/metrics`: the service state read at scrape time, by prometheus-client or written directly."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scaler.policy import loader
from scaler.service import exposition as text_exposition
from scaler.service import state as service_state

MODEL = ["namespace", "model"]
VARIANT = [*MODEL, "variant"]
"""A model with spec.variants has at most `model.MAX_VARIANTS` (4) of them, so the
per-variant families add at most 4 series per such model each."""
COST = ["namespace", "model", "tenant", "cost_center"]
VARIANT_COST = [*COST, "variant"]
CURRENCY = "in the policy's currency units (spec.cost.gpuHourly is the price of one GPU-hour)"
"""Cost metrics carry no currency in their names (`scaler_cost_total`, not `_dollars`): the
price is the policy's own, in whatever currency it was written in."""

CHUNK_MODELS = 25
"""Models written between two returns to the event loop (`render`): about 25 x 39
series at some 130 us a model (the bench, 1,000 models) is about 3 ms the loop waits,
and 400 returns at 10,000 models add under 10 ms to the scrape."""


class Family(Protocol):
    """A gauge or counter family being filled: prometheus-client's or the text writer's."""

    def add_metric(self, labels: Sequence[str], value: float) -> None: ...


class Families(Protocol):
    """Makes the families of one scrape; the order they are made in is the order written."""

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> Family: ...

    def counter(self, name: str, documentation: str, labels: Sequence[str]) -> Family: ...

    def histogram(self, name: str, documentation: str, *,
                  buckets: Sequence[tuple[str, float]], sum_value: float) -> None: ...


class StateCollector(Collector):
    """Every series is computed from `ServiceState` when Prometheus scrapes.

    Nothing is updated on the hot path: at 1,000 models evaluated on every sample,
    keeping prometheus-client children current would cost more than one scrape every
    15 s that walks the registry once. This collector is the reference rendering
    (`generate_latest` over it); `/metrics` is answered by `render`, which writes the
    same bytes from the same walk.
    """

    def __init__(self, state: service_state.ServiceState, *, clock: Callable[[], float]) -> None:
        self._state = state
        self._clock = clock

    def describe(self) -> list[Metric]:
        # Series depend on the policies loaded; nothing to check at registration.
        return []

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for _ in walk(self._state, families, now=self._clock()):
            pass
        yield from families.families


def walk(state: service_state.ServiceState, g: Families, *, now: float) -> Iterator[None]:
    """Add every series of `state` at wall time `now` to the families `g` makes, yielding
    after every `CHUNK_MODELS` models (an asynchronous caller lets the loop run there).

    Each model is read from one view (`ServiceState.status`, copied at once, immutable),
    so its series agree with each other; the views of a scrape are taken chunk by chunk,
    so models read after an evaluation that ran between two chunks show it (counters
    stay monotonic; the per-tenant ratios sum views up to one scrape's duration apart).
    The small non-model parts are read before the first yield.
    """
    signal_value = g.gauge("scaler_signal_value", "Latest combined value of a signal.",
                           [*MODEL, "signal"])
    signal_age = g.gauge("scaler_signal_age_seconds",
                         "Age of the newest sample of a signal, now.", [*MODEL, "signal"])
    signal_rec = g.gauge("scaler_signal_recommendation_replicas",
                         "Replicas each signal recommended in the last decision.",
                         [*MODEL, "signal"])
    signal_fresh = g.gauge("scaler_signal_fresh",
                           "1 when the signal was fresh in the last decision.",
                           [*MODEL, "signal"])
    desired = g.gauge("scaler_desired_replicas", "Replicas the last decision asked for.",
                      MODEL)
    current = g.gauge("scaler_current_replicas", "The target's spec.replicas.", MODEL)
    ready = g.gauge("scaler_ready_replicas", "Replicas passing readiness.", MODEL)
    starting = g.gauge("scaler_starting_replicas", "Replicas existing but not ready.",
                       MODEL)
    # A model with variants: the model-level replicas above are in replicas of the
    # policy's yardstick (their capacity-equivalent sum); these are each variant's own.
    variant_desired = g.gauge("scaler_variant_desired_replicas",
                              "A variant's count in the fleet's last mix.", VARIANT)
    variant_current = g.gauge("scaler_variant_current_replicas",
                              "A variant's target's spec.replicas.", VARIANT)
    variant_ready = g.gauge("scaler_variant_ready_replicas",
                            "A variant's replicas passing readiness.", VARIANT)
    variant_starting = g.gauge("scaler_variant_starting_replicas",
                               "A variant's replicas existing but not ready.", VARIANT)
    variant_owned = g.gauge(
        "scaler_variant_hpa_owned", "1 when an HPA or KEDA ScaledObject scales the "
        "variant's target: the scaler does not patch it and counts what it holds.",
        VARIANT)
    recommendation = g.gauge("scaler_recommendation_replicas",
                             "Recommendation before stabilization and limits.", MODEL)
    held = g.gauge("scaler_decision_held",
                   "1 when the last decision held replicas for lack of fresh data.", MODEL)
    decided_at = g.gauge("scaler_last_decision_timestamp_seconds",
                         "Wall-clock time of the last decision.", MODEL)
    time_to_ready = g.gauge("scaler_time_to_ready_seconds",
                            "Predicted seconds until a new replica is ready.", MODEL)
    useful_ratio = g.gauge(
        "scaler_useful_ratio", "Useful share of the ready replicas' GPU time in the last "
        "observation, by source: dcgm (SM-active, measured), replicas (their load over "
        "capacity, estimated) or assumed (1).", [*MODEL, "source"])
    excluded_gpus = g.gauge(
        "scaler_pool_excluded_gpus", "GPUs of the model's pool on healthy nodes not "
        "counted as capacity (DCGM XID or double-bit ECC errors).", MODEL)
    forecast = g.gauge("scaler_forecast_demand_replicas",
                       "Demand in replicas, now and at the time a new replica is ready.",
                       [*MODEL, "horizon"])
    clamps = g.counter("scaler_clamps", "Decisions in which a limit changed the replicas.",
                       [*MODEL, "clamp"])
    decisions = g.counter("scaler_decisions", "Decisions by outcome (up, down, hold, held).",
                          [*MODEL, "outcome"])
    patches = g.counter("scaler_patches", "Scale patches by outcome.", [*MODEL, "outcome"])
    evaluation_errors = g.counter(
        "scaler_evaluation_errors", "Evaluations that failed (the model kept its replicas; "
        "the next evaluation runs as usual).", MODEL)
    gpu_hours = g.counter("scaler_gpu_hours", "Allocated GPU-hours, cold starts included.",
                          COST)
    useful_hours = g.counter(
        "scaler_useful_gpu_hours", "Busy share of allocated GPU-hours: DCGM SM-active "
        "where read, else estimated (scaler_useful_ratio names the source).", COST)
    cost = g.counter("scaler_cost", f"GPU cost (allocated GPU-hours x gpuHourly), {CURRENCY}.",
                     COST)
    idle_cost = g.counter("scaler_idle_cost",
                          f"Cost of the idle share of GPU-hours, {CURRENCY}.", COST)
    requests = g.counter("scaler_requests", "Requests counted for cost per 1k requests.",
                         COST)
    variant_gpu_hours = g.counter(
        "scaler_variant_gpu_hours", "A model with variants: each variant's allocated "
        "GPU-hours (its own GPUs per replica); they sum to scaler_gpu_hours.", VARIANT_COST)
    variant_cost = g.counter(
        "scaler_variant_cost", "A model with variants: each variant's GPU cost at its own "
        f"GPU-hour price; they sum to scaler_cost, {CURRENCY}.", VARIANT_COST)
    variant_idle_cost = g.counter(
        "scaler_variant_idle_cost", "A model with variants: the cost of each variant's "
        f"idle GPU-hours; they sum to scaler_idle_cost, {CURRENCY}.", VARIANT_COST)
    per_1k = g.gauge("scaler_cost_per_1k_requests",
                     f"cost / requests * 1000, {CURRENCY}.", COST)
    tenant_per_1k = g.gauge("scaler_tenant_cost_per_1k_requests",
                            f"cost / requests * 1000 over a tenant's models, {CURRENCY}.",
                            ["tenant"])
    center_per_1k = g.gauge("scaler_cost_center_cost_per_1k_requests",
                            f"cost / requests * 1000 over a cost centre's models, {CURRENCY}.",
                            ["cost_center"])

    _service(state, g)
    silent = _health(state, g)

    by_tenant: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    by_center: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    keys = state.keys()
    for first in range(0, len(keys), CHUNK_MODELS):
        for status in (state.status(key) for key in keys[first:first + CHUNK_MODELS]):
            if status is None:  # removed by a policy reload since the scrape began
                continue
            key = [status.policy.metadata.namespace, status.policy.metadata.name]
            quiet = service_state.silence(status.policy, status.last, since=status.since,
                                          now=now)
            silent.add_metric(key, 0.0 if quiet is None else 1.0)
            labels = status.policy.metadata.labels
            cost_key = [*key, labels.get(service_state.TENANT_LABEL, ""),
                        labels.get(service_state.COST_CENTER_LABEL, "")]
            for outcome, count in sorted(status.decisions.items()):
                decisions.add_metric([*key, outcome], count)
            for outcome, count in sorted(status.patches.items()):
                patches.add_metric([*key, outcome], count)
            for name, count in sorted(status.clamps.items()):
                clamps.add_metric([*key, name], count)
            evaluation_errors.add_metric(key, status.evaluation_errors)
            totals = status.cost
            by_variant = status.variant_costs
            last = status.last
            if last is not None:
                # GPUs held since the last evaluation count too: a scrape between two
                # evaluations still sees the counters move.
                totals = service_state.accrue(totals, policy=status.policy, since=last,
                                              until=now)
                by_variant = service_state.accrue_variants(by_variant, policy=status.policy,
                                                           since=last, until=now)
            for name, share in sorted(by_variant.items()):
                variant_gpu_hours.add_metric([*cost_key, name], share.allocated_gpu_hours)
                variant_cost.add_metric([*cost_key, name], share.cost)
                variant_idle_cost.add_metric([*cost_key, name], share.idle_cost)
            gpu_hours.add_metric(cost_key, totals.allocated_gpu_hours)
            useful_hours.add_metric(cost_key, totals.useful_gpu_hours)
            cost.add_metric(cost_key, totals.cost)
            idle_cost.add_metric(cost_key, totals.idle_cost)
            requests.add_metric(cost_key, totals.requests)
            if totals.cost_per_1k_requests is not None:
                per_1k.add_metric(cost_key, totals.cost_per_1k_requests)
            for group, name in ((by_tenant, cost_key[2]), (by_center, cost_key[3])):
                if name:
                    group[name][0] += totals.cost
                    group[name][1] += totals.requests
            if last is None:
                continue
            decision = last.decision
            for signal, value in last.snapshot.items():
                if value is not None:
                    signal_value.add_metric([*key, signal], value.value)
                    signal_age.add_metric([*key, signal], value.age_s + max(0.0, now - last.at))
            for reason in decision.signals:
                signal_fresh.add_metric([*key, reason.name], 1.0 if reason.fresh else 0.0)
                if reason.recommendation is not None:
                    signal_rec.add_metric([*key, reason.name], reason.recommendation)
            desired.add_metric(key, decision.desired)
            current.add_metric(key, last.cluster.current)
            ready.add_metric(key, last.cluster.ready)
            starting.add_metric(key, len(last.cluster.starting))
            for row in last.variants:
                series = [*key, row.name]
                if row.desired is not None:
                    variant_desired.add_metric(series, row.desired)
                variant_current.add_metric(series, row.current)
                variant_ready.add_metric(series, row.ready)
                variant_starting.add_metric(series, row.starting)
                variant_owned.add_metric(series, 1.0 if row.owner is not None else 0.0)
            busy, busy_source = service_state.busy_reading(status.policy, last)
            useful_ratio.add_metric([*key, busy_source], busy)
            if status.policy.spec.node_pool is not None:
                excluded_gpus.add_metric(key, last.cluster.excluded_gpus)
            if decision.recommendation is not None:
                recommendation.add_metric(key, decision.recommendation)
            held.add_metric(key, 1.0 if decision.held else 0.0)
            decided_at.add_metric(key, decision.at)
            if decision.forecast is not None:
                time_to_ready.add_metric(key, decision.forecast.time_to_ready_s)
                forecast.add_metric([*key, "now"], decision.forecast.demand_now)
                forecast.add_metric([*key, "ready"], decision.forecast.demand_at_ready)
        yield
    for group, family in ((by_tenant, tenant_per_1k), (by_center, center_per_1k)):
        for name, (spent, served) in sorted(group.items()):
            if served > 0:
                family.add_metric([name], spent / served * 1000.0)


def _service(state: service_state.ServiceState, g: Families) -> None:
    """The service's own families: policy loads, leadership, pools, sources' drops."""
    models = g.gauge("scaler_policies_loaded", "Valid policies in force.", [])
    models.add_metric([], len(state.keys()))
    load = state.policy_load
    # The label is the problem's kind, never its message: messages are free text (a
    # misspelt field name is in them) and each distinct one would be a new series.
    # Which field and why: the log, the PolicyInvalid Event and `scaler validate`.
    invalid = g.gauge("scaler_policy_invalid",
                      "Problems in the latest policy load, by file and reason ("
                      + ", ".join(loader.REASONS) + ").", ["path", "reason"])
    kept = g.gauge("scaler_policy_kept_last_good",
                   "1 per model whose new policy is invalid: the last good one runs.",
                   MODEL)
    loaded_at = g.gauge("scaler_policy_last_load_timestamp_seconds",
                        "Wall-clock time of the latest policy load.", [])
    if load is not None:
        loaded_at.add_metric([], load.at)
        problems = collections.Counter((error.path, error.reason) for error in load.errors)
        for (path, kind), count in sorted(problems.items()):
            invalid.add_metric([path, kind], count)
        for key in load.kept:
            namespace, _, name = key.partition("/")
            kept.add_metric([namespace, name], 1.0)
    reloads = g.counter("scaler_policy_loads", "Policy loads by result (ok, invalid).",
                        ["result"])
    for result, count in sorted(state.reloads.items()):
        reloads.add_metric([result], count)
    leader = g.gauge("scaler_leader",
                     "1 when this replica holds its shard's Lease, 0 when not (absent: "
                     "unknown); shard: sharding.shard (0 with one shard).", ["shard"])
    if state.leader is not None:
        leader.add_metric([str(state.shard)], 1.0 if state.leader else 0.0)
    ready = g.gauge("scaler_ready", "1 when policies are loaded and leadership known.", [])
    ready.add_metric([], 1.0 if state.ready else 0.0)
    nodes_wanted = g.gauge("scaler_pool_nodes_wanted",
                           "Nodes a pool needs: replicas plus warm headroom.", ["pool"])
    nodes_for_replicas = g.gauge("scaler_pool_nodes_for_replicas",
                                 "Nodes the bin-packing of decided replicas needs.", ["pool"])
    headroom = g.gauge("scaler_pool_headroom_nodes",
                       "Spare nodes kept booted for the forecast and the warm floor.",
                       ["pool"])
    pool_applies = g.counter("scaler_pool_applies", "Node plan applies by outcome.",
                             ["pool", "outcome"])
    for pool in state.pools():
        plan = pool.plan
        nodes_wanted.add_metric([plan.pool], plan.nodes_wanted)
        nodes_for_replicas.add_metric([plan.pool], plan.nodes_for_replicas)
        headroom.add_metric([plan.pool], plan.headroom_nodes)
        for outcome, count in sorted(pool.applies.items()):
            pool_applies.add_metric([plan.pool, outcome], count)
    deletion_costs = g.counter(
        "scaler_pod_annotations", "controller.kubernetes.io/pod-deletion-cost writes "
        "before scale-downs, by outcome (patched, failed, list_failed: the pods could not "
        "be listed).", ["outcome"])
    for outcome, count in sorted(state.deletion_costs().items()):
        deletion_costs.add_metric([outcome], count)
    records = g.counter(
        "scaler_learned_state_records", "Records of the engine's learned state kept across "
        "restarts, by outcome: resumed at start; not resumed as stale, policy_changed, "
        "malformed or implausible; omitted from a write (over the ConfigMap's size).",
        ["outcome"])
    for outcome, count in sorted(state.learned_records.items()):
        records.add_metric([outcome], count)
    writes = g.counter("scaler_learned_state_writes",
                       "Writes of the learned state's ConfigMap by the leader, by outcome "
                       "(written, failed).", ["outcome"])
    for outcome, count in sorted(state.learned_writes.items()):
        writes.add_metric([outcome], count)
    dropped = g.counter("scaler_dropped_messages",
                        "Signal messages dropped, by source and reason.", ["source", "reason"])
    for (source, reason), count in sorted(state.dropped().items()):
        dropped.add_metric([source, reason], count)
    api_requests = g.counter("scaler_metrics_api_requests",
                             "External metrics API answers by HTTP status (401 "
                             "unauthenticated, 403 unauthorised).", ["code"])
    for code, count in sorted(state.metrics_api_requests.items()):
        api_requests.add_metric([str(code)], count)
    durations = state.evaluation_seconds
    g.histogram(
        "scaler_evaluation_duration_seconds",
        "Time an evaluation takes, over all models: cluster read, decision and patch.",
        buckets=[*((str(bound), count) for bound, count in zip(durations.bounds,
                                                            durations.counts, strict=True)),
                 ("+Inf", durations.count)], sum_value=durations.total_s)


def _health(state: service_state.ServiceState, g: Families) -> Family:
    """Whether the signals can be trusted: sources up, their errors; the family of silent
    models, which `walk` fills model by model."""
    up = g.gauge("scaler_source_up", "1 when the signal source is connected (NATS) and "
                 "its latest poll of every target succeeded (JetStream, Prometheus).",
                 ["source"])
    connected = g.gauge("scaler_source_connected",
                        "1 while the source's NATS connection is up (NATS sources only).",
                        ["source"])
    errors = g.counter("scaler_source_errors", "Failed polls and connection errors of a "
                       "signal source, by kind (the exception's name).",
                       ["source", "reason"])
    for source, health in sorted(state.source_health().items()):
        up.add_metric([source], 1.0 if health.up else 0.0)
        if health.connected is not None:
            connected.add_metric([source], 1.0 if health.connected else 0.0)
        for reason, count in sorted(health.errors.items()):
            errors.add_metric([source, reason], count)
    refused = g.counter("scaler_signals_refused",
                        "Signal messages and samples refused, by reason, over all sources "
                        "(sum by reason of scaler_dropped_messages_total).", ["reason"])
    by_reason: collections.Counter[str] = collections.Counter()
    for (_, reason), count in state.dropped().items():
        by_reason[reason] += count
    for reason, count in sorted(by_reason.items()):
        refused.add_metric([reason], count)
    silent = g.gauge("scaler_signals_silent", "1 when every source of the model has been "
                     "silent past its staleAfterSeconds (replicas are held).", MODEL)
    return silent


class _Families:
    """Collects metric families in creation order, so /metrics reads in a stable order."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def gauge(self, name: str, documentation: str,
              labels: Sequence[str]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=labels)
        self.families.append(family)
        return family

    def counter(self, name: str, documentation: str,
                labels: Sequence[str]) -> CounterMetricFamily:
        # prometheus-client appends `_total` to counter samples.
        family = CounterMetricFamily(name, documentation, labels=labels)
        self.families.append(family)
        return family

    def histogram(self, name: str, documentation: str, *,
                  buckets: Sequence[tuple[str, float]], sum_value: float) -> None:
        family = HistogramMetricFamily(name, documentation, labels=[])
        family.add_metric([], buckets, sum_value=sum_value)
        self.families.append(family)


async def render(state: service_state.ServiceState, *, now: float) -> list[bytes]:
    """The state's part of `/metrics` at wall time `now`, in parts to be sent one after
    the other (`text_exposition.PART_LINES` lines at most): together the bytes
    `generate_latest` writes over `StateCollector`, without prometheus-client's
    families, returning to the event loop every `CHUNK_MODELS` models and every part.

    Why on the loop in steps rather than in a worker thread or from a cache: at 10,000
    models a scrape is still about a second of CPU; a thread would hold the GIL against
    the loop (which then waits up to the 5 ms switch interval at every step, and still
    needs a copy of the state that the loop cannot change under it), and a cached body
    is as costly to make and stale by its age. Here the loop waits at most one step
    (`CHUNK_MODELS`, a few ms) between its own: evaluations, NATS ingestion and the
    health probes run through the scrape, which takes longer in wall time (about a
    second at 10,000 models on an idle loop, within Prometheus' default 10 s timeout).
    """
    families = text_exposition.TextFamilies()
    for _ in walk(state, families, now=now):
        await asyncio.sleep(0)
    parts = []
    for part in families.parts():
        parts.append(part)
        await asyncio.sleep(0)
    return parts


class ServiceRegistry(CollectorRegistry):
    """The service's registry: `generate_latest` over it is the reference rendering,
    `exposition` writes the same bytes (`render`, then the other collectors as
    prometheus-client writes them)."""

    def __init__(self, state: service_state.ServiceState, *, clock: Callable[[], float],
                 process: bool) -> None:
        super().__init__()
        self._state = state
        self._clock = clock
        self.register(StateCollector(state, clock=clock))
        self._others = CollectorRegistry()
        if process:
            collector = ProcessCollector(registry=None)
            self.register(collector)
            self._others.register(collector)

    async def exposition(self) -> list[bytes]:
        """The body in parts: the state's (`render`), then the other collectors'."""
        return [*await render(self._state, now=self._clock()),
                exposition.generate_latest(self._others)]


def make_registry(
    state: service_state.ServiceState, *, clock: Callable[[], float], process: bool = True
) -> ServiceRegistry:
    """A registry of the service's own (not the global default registry, so several
    services in one process, as in tests, never collide)."""
    return ServiceRegistry(state, clock=clock, process=process)
