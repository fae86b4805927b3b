"""Scale of one instance: one full evaluation cycle of 1,000 and 10,000 models, and memory.

Usage: .venv/bin/python bench/fleet_scale.py [--models 1000 10000] [--cycles 66]
                                               [--pools 10] [--tenants 20]
                                               [--budget-scope {all,pool}] [--shards 1]
                                               [--json OUT]

Per model count N, on one core (sched_setaffinity): N ScalePolicies spread over --pools
GpuPools (8 GPUs a node, one node reserved for training, sized to 80 % of the average
ask; model i on pool i % pools, of tenant i % tenants) and GpuBudgets with guarantees and
ceilings: with --budget-scope all (the default) one per tenant over every pool, with
pool one per (tenant, pool) that has models, on that pool (the same GPUs per tenant and
per pool in all); tiers online, batch and dev in turn; 1, 2 or 8 GPUs a replica. Every
model gets signals from two replicas each cycle (in flight, queue, tokens/s and a TTFT
histogram), parsed from DESIGN 4.2 JSON bodies and stored in the real signal store
(ingestion itself is timed by bench/signals_ingest.py, and not counted here). Then, per
cycle (the clock moves 5 s):

- engine: for every model, the store's snapshot, `decide` with its cap, its ask; then
  `arbitrate` over all of them: the CPU an instance spends per cycle on the decisions.
- arbitrate: `engine.fleet.arbitrate` alone, over the same asks.
- reactor: the service's Reactor (the real one, with the arbiter) evaluating every model
  once (`notify_all`, then `idle`) against an in-memory cluster at the ClusterReader /
  ReplicaActuator seam (tests/service/fakes.FakeCluster): tasks, semaphore, state,
  history and the arbitration included; API round trips are not (docs/scaling.md).
- scrape: after the last reactor cycle, one `/metrics` scrape of the service's state
  (the registry's `exposition`, as `http_api` answers it; `generate_latest` over the same
  registry beside it, the reference the body must equal): CPU seconds (the least of
  three), the state collector's walk, the longest step between two returns to the loop,
  the gzip /metrics sends (CPU, size), the body's size and series. Not in the cycle: it
  takes the same core once every scrape interval (15 s in the chart).

Times are CPU seconds of this process (`time.process_time`, so a busy shared machine
inflates them less than wall time; wall time of the reactor cycle is printed beside).
Two figures each: *filling*, the median of cycles 2 to 5 (the first is left out), while
the windows are still short; and *steady*, the median of the cycles after the longest
window has filled (the 300 s scale-down stabilization: from cycle 62 of 5 s on), which is
what a long-running instance pays (`decide` scans its windows whole). For the reactor
also the mean, the collector's share, evaluations per model and CPU per evaluation. With
--cycles below 62 only the filling figures are printed. The
collector runs as `scaler run` sets it (`runner.tune_collector`: start-up frozen, young
collections every 20,000 allocations).
Memory: tracemalloc's traced bytes after the cycles (policies, store, engine states,
service state and history, grants), per model, in a second run; and the process's peak RSS.

--shards S (above 1): the fleet is split as `scaler.policy.shards.split` splits it
(arbitration domains, the models linked by the pools they share and the budgets that
cover them, hashed to shards), and each shard is measured as above on its share alone (its
policies, pools and budgets; its own store, reactor and arbiter), one after the other in
this process, the same cycles each. Printed and recorded: the domains (how many, the
largest's models), per shard its models, pools and budgets and the figures above, and the
most over the shards of each cycle figure (`max_over_shards`): shards run in parallel on
their own pods, so the slowest is the fleet's cycle. A shard with nothing to evaluate or
arbitrate is not measured. With --budget-scope pool the domains are the pools. With all, a
tenant's budget links every pool its models are on: tenant t's are on the pools p with
p = t modulo gcd(pools, tenants), so there are gcd(pools, tenants) domains (10 with the
defaults, 20 with --pools 40); with pools and tenants coprime (--tenants 21) the fleet is
one domain: one shard gets every model and the others none, unless --max-domain-models
splits it by model, as `sharding.max_domain_models` does (the domain's shard then
arbitrates every model's ask, handed to it in-process each cycle, and evaluates none of
them; the others evaluate the models).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import exposition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaler.core import vocabulary  # noqa: E402
from scaler.engine import decide as engine_decide  # noqa: E402
from scaler.engine import fleet as engine_fleet  # noqa: E402
from scaler.engine import types  # noqa: E402
from scaler.policy import fleet as policy_fleet  # noqa: E402
from scaler.policy import model  # noqa: E402
from scaler.policy import shards as policy_shards  # noqa: E402
from scaler.service import arbiter as fleet_arbiter  # noqa: E402
from scaler.service import exposition as text_exposition  # noqa: E402
from scaler.service import http_api, observability, runner  # noqa: E402
from scaler.service import reactor as service_reactor  # noqa: E402
from scaler.service import state as service_state  # noqa: E402
from scaler.signals import messages, store  # noqa: E402
from tests.service import fakes  # noqa: E402

NAMESPACE = "bench"
START = 1_796_018_400.0
CYCLE_S = 5.0
FILLING = slice(1, 5)  # cycles 2 to 5
GPUS_PER_REPLICA = (1, 2, 8)
LE = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
BUDGET_SCOPES = ("all", "pool")
# The cycle figures of a sharded run whose most over the shards is the fleet's.
SHARD_MAX = ("engine_cycle_cpu_s", "arbitrate_cpu_ms", "reactor_cycle_cpu_s",
             "reactor_cycle_wall_s", "reactor_cycle_cpu_mean_s")


def policy(index: int, *, pools: int, tenants: int) -> model.ScalePolicy:
    tier = tuple(vocabulary.Tier)[index % 3]
    gpus = GPUS_PER_REPLICA[index // 3 % len(GPUS_PER_REPLICA)]
    return model.ScalePolicy.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": f"model-{index}", "namespace": NAMESPACE,
                     "labels": {"tenant": f"tenant-{index % tenants}"}},
        "spec": {
            "target": {"name": f"model-{index}"}, "tier": tier,
            "replicas": {"min": 1, "max": 16},
            "signals": {"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 4},
                        "tokensPerSecond": {"capacityPerReplica": 2400},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}},
            "resources": {"gpusPerReplica": gpus},
            "nodePool": {"name": f"pool-{index % pools}", "gpusPerNode": 8,
                         "actuator": "none"},
        },
    })


def fleet_of(*, models: int, pools: int, tenants: int,
             budget_scope: str = "all") -> policy_fleet.Fleet:
    """Pools that hold about 80 % of what the models ask on average, and one budget per
    tenant over every pool: a third of its share guaranteed, 1.5 times it the ceiling.
    With budget_scope "pool", one budget per (tenant, pool) that has models instead, on
    that pool, its share the pool's unreserved GPUs split evenly among the tenants on it:
    as model i is tenant i % tenants's on pool i % pools, each tenant's shares add up to
    its share over every pool (once there are lcm(pools, tenants) models).

    A model asks about 4 replicas (1 to 7 of concurrency) of 11/3 GPUs on average (1, 2
    or 8): about 14.7 GPUs; 1,000 models on 10 pools ask about 1,470 GPUs a pool.
    """
    asked = models * 4 * sum(GPUS_PER_REPLICA) / len(GPUS_PER_REPLICA)
    nodes = max(2, int(0.8 * asked / pools / 8) + 1)  # + 1 node for the reservation
    pool_docs = [policy_fleet.GpuPool.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool",
        "metadata": {"name": f"pool-{p}"},
        "spec": {"gpusPerNode": 8, "maxNodes": nodes,
                 "reservations": [{"name": "training", "gpus": 8}]}}) for p in range(pools)]
    if budget_scope == "all":
        share = (nodes - 1) * 8 * pools // tenants
        budgets = [budget(f"tenant-{t}", tenant=t, share=share) for t in range(tenants)]
    else:
        pairs = sorted({(i % tenants, i % pools) for i in range(models)})
        on_pool = Counter(p for _, p in pairs)
        budgets = [budget(f"tenant-{t}-pool-{p}", tenant=t, pool=f"pool-{p}",
                          share=(nodes - 1) * 8 // on_pool[p]) for t, p in pairs]
    return policy_fleet.Fleet(pools={p.name: p for p in pool_docs},
                              budgets={b.name: b for b in budgets})


def budget(name: str, *, tenant: int, share: int, pool: str | None = None
           ) -> policy_fleet.GpuBudget:
    """Tenant `tenant`'s budget (on `pool`, or every pool): a third of `share` guaranteed,
    1.5 times it the ceiling."""
    return policy_fleet.GpuBudget.model_validate({
        "apiVersion": "scaler.io/v1alpha1", "kind": "GpuBudget",
        "metadata": {"name": name},
        "spec": {"tenant": f"tenant-{tenant}", "pool": pool, "guaranteedGpus": share // 3,
                 "maxGpus": max(1, share * 3 // 2), "borrow": True}})


@dataclass(frozen=True)
class Workload:
    """What one run measures: the bench's policies and fleet, or one shard's share."""

    models: int
    pools: int
    tenants: int
    budget_scope: str = "all"
    share: policy_shards.Share | None = None

    def whole(self) -> tuple[list[model.ScalePolicy], policy_fleet.Fleet]:
        """Every policy and the fleet."""
        policies = [policy(i, pools=self.pools, tenants=self.tenants)
                    for i in range(self.models)]
        return policies, fleet_of(models=self.models, pools=self.pools, tenants=self.tenants,
                                  budget_scope=self.budget_scope)

    def build(self) -> Part:
        """What the instance evaluates: everything, or its share."""
        policies, fleet = self.whole()
        if self.share is None:
            return Part(policies, fleet)
        mine, arbitrated = of_share(policies, fleet, self.share)
        return Part(mine, arbitrated, remote=frozenset(self.share.remote),
                    foreign={p.key: p for p in policies if p.key in self.share.foreign})


@dataclass(frozen=True)
class Part:
    """One instance's policies and pools and budgets; with a split domain (--max-domain-
    models), its models another shard arbitrates (`remote`: held at what they have, as
    before a first grant) and the other shards' models it arbitrates (`foreign`: an ask
    of each arrives every cycle, as the relay hands them over)."""

    policies: list[model.ScalePolicy]
    fleet: policy_fleet.Fleet
    remote: frozenset[str] = frozenset()
    foreign: dict[str, model.ScalePolicy] = field(default_factory=dict)


def foreign_asks(arbiter: fleet_arbiter.Arbiter, foreign: dict[str, model.ScalePolicy], *,
                 now: float, cycle: int) -> list[model.ScalePolicy]:
    """An ask of every other shard's model arbitrated here, as `relay` takes them (1 to 4
    replicas, moving each cycle); the policies whose ask changed."""
    changed = []
    for key, each in foreign.items():
        index = int(each.metadata.name.removeprefix("model-"))
        wanted = 1 + (index + cycle) % 4
        if arbiter.put_foreign(fleet_arbiter.RemoteAsk(
                key=key, desired=wanted, current=1, replicas=wanted,
                forecast_replicas=wanted, excluded_gpus=0, at=now), now=now):
            changed.append(each)
    return changed


def of_share(policies: list[model.ScalePolicy], fleet: policy_fleet.Fleet,
             share: policy_shards.Share) -> tuple[list[model.ScalePolicy], policy_fleet.Fleet]:
    """The policies, pools and budgets a shard evaluates."""
    return ([p for p in policies if p.key in share.models],
            policy_fleet.Fleet(
                pools={n: p for n, p in fleet.pools.items() if n in share.pools},
                budgets={n: b for n, b in fleet.budgets.items() if n in share.budgets}))


def feed(signal_store: store.SignalStore, policies: list[model.ScalePolicy], *, now: float,
         cycle: int) -> None:
    """Two replicas' reports for every model, demand moving with the cycle."""
    for each in policies:
        index = int(each.metadata.name.removeprefix("model-"))
        in_flight = 5.0 + (index * 7 + cycle * 13) % 60  # 1 to 7 replicas of concurrency
        for replica in range(2):
            body = json.dumps({
                "v": 1, "model": f"model-{index}", "namespace": NAMESPACE,
                "source": f"model-{index}-{replica}", "ts": now - 0.5,
                "queue_depth": (index + cycle) % 5, "in_flight": in_flight,
                "tokens_per_second": 40.0 * in_flight,
                "latency": {"metric": "ttft", "histogram": {
                    "le": LE, "counts": [5, 20, 60, 90, 98, 100, 100]}}}).encode()
            parsed = messages.parse(body, now=now)
            assert not isinstance(parsed, messages.Drop), parsed
            signal_store.put(parsed)


@dataclass
class Instance:
    """What one instance holds for the engine cycle: policies, signals, engine states,
    the arbiter, and each model's replicas (applied at once, as a patch would)."""

    policies: list[model.ScalePolicy]
    fleet: policy_fleet.Fleet
    signal_store: store.SignalStore = field(default_factory=store.SignalStore)
    arbiter: fleet_arbiter.Arbiter = field(default_factory=fleet_arbiter.Arbiter)
    states: dict[str, types.EngineState] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)

    foreign: dict[str, model.ScalePolicy] = field(default_factory=dict)

    @classmethod
    def build(cls, part: Part) -> Instance:
        instance = cls(policies=part.policies, fleet=part.fleet, foreign=part.foreign)
        instance.arbiter.set_fleet(instance.fleet, keys={p.key for p in instance.policies},
                                   remote=part.remote, foreign=part.foreign)
        instance.current = {p.key: 1 for p in instance.policies}
        # As `scaler run` does after start-up: what lives for the process leaves the
        # collector's sight (full collections over 10,000 policies cost more than a cycle),
        # and young collections run less often (runner.GC_YOUNG_THRESHOLD).
        gc.collect()
        runner.tune_collector()
        return instance

    def cycle(self, cycle: int) -> float:
        """New signals, then decide every model and arbitrate, as the reactor does but
        without its tasks: CPU seconds of the deciding and arbitrating."""
        now = START + cycle * CYCLE_S
        feed(self.signal_store, self.policies, now=now, cycle=cycle)
        gc.collect()
        started = time.process_time()
        for each in self.policies:
            key = each.key
            cluster = self.arbiter.capped(
                each, types.ClusterState(current=self.current[key], ready=self.current[key]),
                now=now)
            snapshot = self.signal_store.snapshot(
                key, now=now, stale_after_s=30.0, latency_metric=vocabulary.LatencyMetric.TTFT)
            decision, self.states[key] = engine_decide.decide(
                each, snapshot=snapshot, cluster=cluster,
                state=self.states.get(key, types.EngineState()), now=now)
            self.current[key] = decision.desired
            self.arbiter.record(each, decision, cluster, now=now)
        foreign_asks(self.arbiter, self.foreign, now=now, cycle=cycle)
        self.arbiter.arbitrate()
        return time.process_time() - started


def arbitrate_alone(instance: Instance) -> float:
    """CPU seconds of `arbitrate` over the asks the arbiter holds."""
    pools = [engine_fleet.fleet_pool(p) for p in instance.fleet.pools.values()]
    budgets = [engine_fleet.budget_rule(b) for b in instance.fleet.budgets.values()]
    asks = instance.arbiter.asks()
    started = time.process_time()
    engine_fleet.arbitrate(pools, budgets, asks)
    return time.process_time() - started


@dataclass
class ReactorRun:
    """Per reactor cycle: CPU and wall seconds, the collector's CPU seconds in it and the
    evaluations it made; and one `/metrics` scrape of the state after the last cycle."""

    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    collected: list[float] = field(default_factory=list)
    evaluations: list[int] = field(default_factory=list)
    scrape: dict[str, float] = field(default_factory=dict)


async def scrape(state: service_state.ServiceState, *, now: float) -> dict[str, float]:
    """One `/metrics` scrape of the state as the service answers it (`exposition` of the
    registry `scaler run` builds, without the process collector), beside prometheus-client's
    `generate_latest` over the same registry (the reference, what the service answered
    before; the bodies must be equal): CPU seconds of each, of the state walk alone, the
    longest the loop waits between two of the answer's steps, the gzip level /metrics
    uses and the body's size. The least of three, each after a full collection (the
    collector's share depends on what the cycles left)."""
    registry = observability.make_registry(state, clock=lambda: now, process=False)
    collect_s, reference_s, total_s, step_s, gzip_s = [], [], [], [], []
    for _ in range(3):
        gc.collect()
        started = time.process_time()
        families = list(registry.collect())
        collect_s.append(time.process_time() - started)
        gc.collect()
        started = time.process_time()
        reference = exposition.generate_latest(registry)
        reference_s.append(time.process_time() - started)
        gc.collect()
        started = time.process_time()
        parts = await registry.exposition()
        total_s.append(time.process_time() - started)
        body = b"".join(parts)
        gc.collect()
        written = text_exposition.TextFamilies()
        end = object()
        for steps in (observability.walk(state, written, now=now), written.parts()):
            while True:  # the steps `render` returns to the loop between
                started = time.process_time()
                if next(steps, end) is end:
                    break
                step_s.append(time.process_time() - started)
        started = time.process_time()
        compressor = http_api.gzip_compressor()  # what /metrics sends for gzip
        compressed = b"".join([*(compressor.compress(part) for part in parts),
                               compressor.flush()])
        gzip_s.append(time.process_time() - started)
    assert body == reference, "/metrics differs from prometheus-client's generate_latest"
    return {"scrape_cpu_s": round(min(total_s), 3),
            "scrape_reference_cpu_s": round(min(reference_s), 3),
            "scrape_collect_cpu_s": round(min(collect_s), 3),
            "scrape_longest_step_ms": round(max(step_s) * 1000, 1),
            "scrape_gzip_cpu_s": round(min(gzip_s), 3),
            "scrape_mib": round(len(body) / 2**20, 1),
            "scrape_gzip_mib": round(len(compressed) / 2**20, 2),
            "scrape_series": sum(len(f.samples) for f in families)}


async def reactor_cycles(part: Part, *, cycles: int) -> ReactorRun:
    """The reactor evaluating every model once a cycle, `cycles` times, then one scrape;
    the other shards' asks (`Part.foreign`) taken in the cycle."""
    policies = part.policies
    clock = {"now": START}
    signal_store = store.SignalStore()
    state = service_state.ServiceState()
    state.set_policies(policies, status=service_state.PolicyLoadStatus(
        at=START, policies=len(policies)))
    cluster = fakes.FakeCluster(current=1)
    reactor = service_reactor.Reactor(
        state=state, store=signal_store, reader=cluster, actuator=cluster,
        wall_clock=lambda: clock["now"], backstop_s=3600.0, coalesce_s=0.0)
    reactor.set_policies({p.key: p for p in policies}, fleet=part.fleet, remote=part.remote,
                         foreign=part.foreign)
    gc.collect()
    runner.tune_collector()
    run = ReactorRun()
    collector = CollectorTime()
    gc.callbacks.append(collector.callback)
    try:
        for cycle in range(cycles):
            clock["now"] = START + cycle * CYCLE_S
            feed(signal_store, policies, now=clock["now"], cycle=cycle)
            await reactor.idle()
            cluster.applied.clear()
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            collector.total_s, done = 0.0, reactor.evaluations
            for each in foreign_asks(reactor.arbiter, part.foreign, now=clock["now"],
                                     cycle=cycle):
                reactor.foreign_asked(each)
            reactor.notify_all()
            await reactor.idle()
            run.cpu.append(time.process_time() - started_cpu)
            run.wall.append(time.perf_counter() - started_wall)
            run.collected.append(collector.total_s)
            run.evaluations.append(reactor.evaluations - done)
    finally:
        gc.callbacks.remove(collector.callback)
    run.scrape = await scrape(state, now=clock["now"] + CYCLE_S / 2)
    return run


@dataclass
class CollectorTime:
    """CPU seconds the cyclic garbage collector ran (a `gc.callbacks` entry)."""

    total_s: float = 0.0
    started: float = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.process_time()
        else:
            self.total_s += time.process_time() - self.started


def steady_from(policies: list[model.ScalePolicy]) -> int:
    """The first cycle (0-based) whose windows are full: one past the longest scale-down
    stabilization window (300 s by default: 60 cycles of 5 s, so cycle index 61)."""
    longest = max((p.spec.behavior.scale_down.stabilization_seconds for p in policies),
                  default=300.0)  # an arbiter with no model of its own: the default window
    return int(longest / CYCLE_S) + 1


def phases(cycles: int, steady: int) -> dict[str, slice]:
    """The cycles each figure is the median of: filling always, steady once reached."""
    chosen = {"": FILLING}
    if cycles > steady:
        chosen["steady_"] = slice(steady, cycles)
    return chosen


def measure(workload: Workload, *, cycles: int) -> dict[str, Any]:
    part = workload.build()
    instance = Instance.build(part)
    models = len(instance.policies)
    engine_s, arbitrate_s, capped_by_cycle = [], [], []
    for cycle in range(cycles):
        engine_s.append(instance.cycle(cycle))
        arbitrate_s.append(arbitrate_alone(instance))
        grants = [instance.arbiter.grant(p.key) for p in instance.policies]
        capped_by_cycle.append(
            sum(1 for g in grants if g is not None and g.reason.startswith("capped")))
    run = asyncio.run(reactor_cycles(part, cycles=cycles))
    reactor_cpu, reactor_wall, collected, evaluations = (run.cpu, run.wall, run.collected,
                                                         run.evaluations)
    gc.unfreeze()
    steady = steady_from(instance.policies)
    result: dict[str, Any] = {"models": models, "pools": len(instance.fleet.pools),
                              "budgets": len(instance.fleet.budgets), "cycles": cycles,
                              "steady_from_cycle": steady + 1}
    if part.foreign:  # granted here for other shards' models (`relay` sends them back)
        result["foreign_granted"] = len(instance.arbiter.foreign_grants())
    for prefix, part in phases(cycles, steady).items():
        engine, reactor = engine_s[part], reactor_cpu[part]
        result.update({
            f"{prefix}capped_models": capped_by_cycle[part][-1],
            f"{prefix}engine_cycle_cpu_s": round(statistics.median(engine), 3),
            f"{prefix}engine_per_model_us": per(statistics.median(engine) * 1e6, models),
            f"{prefix}arbitrate_cpu_ms": round(statistics.median(arbitrate_s[part]) * 1000, 2),
            f"{prefix}reactor_cycle_cpu_s": round(statistics.median(reactor), 3),
            f"{prefix}reactor_cycle_wall_s": round(statistics.median(reactor_wall[part]), 3),
            # The mean too: a full collection lands in one cycle of several.
            f"{prefix}reactor_cycle_cpu_mean_s": round(statistics.mean(reactor), 3),
            f"{prefix}reactor_gc_cpu_mean_s": round(statistics.mean(collected[part]), 3),
            f"{prefix}reactor_evaluations_per_model": per(
                statistics.mean(evaluations[part]), models, digits=2),
            f"{prefix}reactor_per_evaluation_us": per(
                sum(reactor) * 1e6, sum(evaluations[part])),
        })
    result.update(run.scrape)
    result["scrape_per_model_us"] = per(run.scrape["scrape_cpu_s"] * 1e6, models)
    return result


def per(total: float, count: int, *, digits: int = 1) -> float | None:
    """`total / count` rounded; None for no count (a split domain's arbiter evaluates no
    model of it, and may have none of its own)."""
    return round(total / count, digits) if count else None


def memory(workload: Workload, *, cycles: int) -> dict[str, Any]:
    """Traced bytes held after `cycles` engine cycles, per model (a separate run:
    tracemalloc slows everything down several times)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    instance = Instance.build(workload.build())
    models = len(instance.policies)
    for cycle in range(cycles):
        instance.cycle(cycle)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"models": models, "traced_mib": round(held / 2**20, 1),
            "traced_kib_per_model": per(held / 1024, models)}


def sharded(workload: Workload, *, shards: int, cycles: int,
            max_domain_models: int | None = None) -> dict[str, Any]:
    """`shards.split` of the workload, then each shard's share measured on its own (a fresh
    instance each, one after the other): per shard its figures, and the most over the
    shards of each cycle figure, the fleet's cycle when the shards run in parallel. With
    `max_domain_models`, larger domains are split by model (`Part`)."""
    policies, fleet = workload.whole()
    shares = policy_shards.split(policies, fleet, shards=shards,
                                 max_domain_models=max_domain_models)
    domain_of = shares[0].domain_of  # every member's domain, the same in every share
    models_in = Counter(domain_of[policy_shards.member(policy_shards.MODEL, p.key)]
                        for p in policies)
    result: dict[str, Any] = {
        "models": workload.models, "pools": len(fleet.pools), "budgets": len(fleet.budgets),
        "budget_scope": workload.budget_scope, "cycles": cycles, "shards": shards,
        "domains": len(set(domain_of.values())),
        "largest_domain_models": max(models_in.values()),
        "max_domain_models": max_domain_models,
        "shard_models": [len(s.models) for s in shares],
        "shard_remote": [len(s.remote) for s in shares],
        "shard_foreign": [len(s.foreign) for s in shares],
        "shard_pools": [len(s.pools) for s in shares],
        "shard_budgets": [len(s.budgets) for s in shares]}
    print(json.dumps(result), flush=True)
    del policies, fleet, models_in  # a shard's instance holds its share alone
    per_shard = []
    for index, share in enumerate(shares):
        figures: dict[str, Any] = {"shard": index, "models": len(share.models),
                                   "pools": len(share.pools), "budgets": len(share.budgets),
                                   "remote": len(share.remote),
                                   "foreign": len(share.foreign)}
        if share.models or share.foreign:  # else nothing to do: not measured
            part = Workload(workload.models, workload.pools, workload.tenants,
                            workload.budget_scope, share=share)
            started = time.perf_counter()
            figures.update(measure(part, cycles=cycles))
            figures.update(memory(part, cycles=3))
            figures["run_wall_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(figures), flush=True)
        per_shard.append(figures)
    measured = [f for f in per_shard if "reactor_cycle_cpu_s" in f]
    result["per_shard"] = per_shard
    result["max_over_shards"] = {
        key: max(f[key] for f in measured)
        for key in (*(prefix + name for prefix in ("", "steady_") for name in SHARD_MAX),
                    "scrape_cpu_s", "traced_mib")
        if key in measured[0]}
    return result


def calibration() -> float:
    """CPU seconds of 10^7 iterations of a plain Python loop: how fast this core ran
    during the run (a busy shared machine runs it slower), to compare runs by."""
    started = time.process_time()
    total = 0
    for step in range(10_000_000):
        total += step
    return round(time.process_time() - started, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--cycles", type=int, default=66,
                        help="cycles of 5 s; from 62 on the windows are full (default 66)")
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--budget-scope", choices=BUDGET_SCOPES, default="all",
                        help="budgets over every pool (all, the default: a tenant's budget "
                        "links its pools into one arbitration domain) or one per tenant and "
                        "pool, on that pool (pool: the domains are the pools)")
    parser.add_argument("--max-domain-models", type=int, default=None,
                        help="with --shards: split domains of more models by model, the "
                        "domain's shard arbitrating for all (sharding.max_domain_models; "
                        "default: never split)")
    parser.add_argument("--shards", type=int, default=1,
                        help="split the fleet as scaler.policy.shards does and measure each "
                        "shard alone (default 1: the whole fleet)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    print(json.dumps({"load_average": round(os.getloadavg()[0], 1), "cores": os.cpu_count(),
                      "calibration_loop_cpu_s": calibration()}), flush=True)
    results = []
    for models in args.models:
        workload = Workload(models, args.pools, args.tenants, args.budget_scope)
        if args.shards > 1:
            result = sharded(workload, shards=args.shards, cycles=args.cycles,
                             max_domain_models=args.max_domain_models)
        else:
            result = measure(workload, cycles=args.cycles)
            result.update(memory(workload, cycles=3))
        result["peak_rss_mib"] = round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        result["calibration_loop_cpu_s"] = calibration()
        # Each shard's figures are printed as it ends: here the rest.
        print(json.dumps({k: v for k, v in result.items() if k != "per_shard"}), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
