"""The reactor with the real signal store and engine; the cluster is a fake at its seam."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import pytest

from scaler.actuators import base as actuators
from scaler.core import vocabulary
from scaler.engine import types
from scaler.policy import model
from scaler.service import audit, reactor
from scaler.service import state as service_state
from scaler.signals import samples, store

from . import factories
from .conftest import FakeClock
from .fakes import FakeCluster

KEY = "inference/llama-70b"


def policy(name: str = "llama-70b") -> model.ScalePolicy:
    # Concurrency only, 10 requests per replica; no look-ahead slope to keep numbers plain.
    return factories.policy(name, spec={
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "replicas": {"min": 1, "max": 50},
        "behavior": {"scaleUp": {"stabilizationSeconds": 0,
                                 "policies": [{"type": "Pods", "value": 100,
                                               "periodSeconds": 15}]}},
    })


def sample(*, clock: FakeClock, source: str, in_flight: float, key: str = KEY,
           age_s: float = 0.0) -> samples.Sample:
    return samples.Sample(model=key, signal=vocabulary.Signal.IN_FLIGHT, source=source,
                          ts=clock.now - age_s,
                          value=in_flight)


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
async def wiring(
    clock: FakeClock, cluster: FakeCluster
) -> AsyncIterator[tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState]]:
    signals = store.SignalStore()
    registry = factories.loaded_state(policy())
    loop_reactor = reactor.Reactor(state=registry, store=signals, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0)
    remove = signals.add_listener(loop_reactor.notify)
    loop_reactor.set_policies({KEY: policy()})
    await loop_reactor.idle()  # the evaluation a new policy triggers
    yield loop_reactor, signals, registry
    remove()
    await loop_reactor.drain(timeout_s=5.0)


async def test_a_burst_gives_one_evaluation_and_the_right_patch(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, registry = wiring
    before = loop_reactor.evaluations
    # 50 replicas each report 4.2 requests in flight, one message each: 210 in flight,
    # 21 replicas' worth, which 20 hold within the 10 % tolerance (a rise buys that).
    for replica in range(50):
        signals.put([sample(clock=clock, source=f"pod-{replica}", in_flight=4.2)])
    await loop_reactor.idle()
    assert loop_reactor.evaluations == before + 1
    assert [d.desired for d in cluster.applied] == [20]
    assert cluster.current[KEY] == 20
    status = registry.status(KEY)
    assert status is not None and status.patches.get("applied") == 1


async def test_samples_during_an_evaluation_give_exactly_one_more(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, _ = wiring
    before = loop_reactor.evaluations
    cluster.gate = asyncio.Event()
    signals.put([sample(clock=clock, source="a", in_flight=40.0)])
    while not loop_reactor.busy or cluster.reads == 1:  # until the evaluation has read
        await asyncio.sleep(0)
    for index in range(10):
        signals.put([sample(clock=clock, source=f"b{index}", in_flight=10.5)])
    cluster.gate.set()
    await loop_reactor.idle()
    assert loop_reactor.evaluations == before + 2
    # 40, then 40 + 105 = 145: 14.5 replicas' worth, which 14 hold within the tolerance.
    assert [d.desired for d in cluster.applied] == [4, 14]


async def test_stale_signals_hold_the_replicas(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, registry = wiring
    cluster.current[KEY] = 8
    # Demand for 1 replica, but the sample is 60 s old (staleAfterSeconds 30).
    signals.put([sample(clock=clock, source="a", in_flight=5.0, age_s=60.0)])
    await loop_reactor.idle()
    status = registry.status(KEY)
    assert status is not None and status.last is not None
    assert status.last.decision.desired == 8
    assert status.last.decision.held
    assert cluster.applied == []


async def test_a_restart_does_not_scale_down(cluster: FakeCluster, clock: FakeClock) -> None:
    # The cluster runs 6 replicas; a fresh reactor (a restarted service) sees demand for 1.
    cluster.current[KEY] = 6
    signals = store.SignalStore()
    signals.put([sample(clock=clock, source="a", in_flight=5.0)])
    registry = factories.loaded_state(policy())
    fresh = reactor.Reactor(state=registry, store=signals, reader=cluster, actuator=cluster,
                            wall_clock=clock, backstop_s=5.0)
    fresh.set_policies({KEY: policy()})
    await fresh.idle()
    clock.now += 60.0  # within the 300 s down window
    signals.put([sample(clock=clock, source="a", in_flight=5.0)])
    await fresh.evaluate(KEY)
    status = registry.status(KEY)
    assert status is not None and status.last is not None
    assert status.last.decision.desired == 6
    assert cluster.applied == []
    clock.now += 300.0  # a full window of low demand later, it may go down
    signals.put([sample(clock=clock, source="a", in_flight=5.0)])
    await fresh.evaluate(KEY)
    assert [d.desired for d in cluster.applied] == [1]


async def test_conflict_is_redecided_from_a_fresh_read(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, registry = wiring
    cluster.outcomes = [actuators.Outcome.CONFLICT]
    reads = cluster.reads
    signals.put([sample(clock=clock, source="a", in_flight=30.0)])
    await loop_reactor.idle()
    assert [str(d.desired) for d in cluster.applied] == ["3", "3"]
    assert cluster.reads == reads + 2
    status = registry.status(KEY)
    assert status is not None and status.patches == {"unchanged": 1, "conflict": 1,
                                                     "applied": 1}


async def test_a_failing_read_is_counted_and_others_go_on(
    clock: FakeClock, cluster: FakeCluster
) -> None:
    signals = store.SignalStore()
    registry = factories.loaded_state(policy("a"), policy("b"))
    loop_reactor = reactor.Reactor(state=registry, store=signals, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0)
    cluster.fail_reads.add("inference/a")
    loop_reactor.set_policies({"inference/a": policy("a"), "inference/b": policy("b")})
    await loop_reactor.idle()
    status_a, status_b = registry.status("inference/a"), registry.status("inference/b")
    assert status_a is not None and status_a.patches == {"read_failed": 1}
    assert status_a.last is None
    assert status_b is not None and status_b.last is not None


@pytest.mark.looptime
async def test_backstop_tick_reevaluates_without_samples(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster,
) -> None:
    loop_reactor, _, _ = wiring
    before = loop_reactor.evaluations
    ticker = asyncio.create_task(loop_reactor.run(), name="backstop")
    try:
        await asyncio.sleep(12.5)  # virtual seconds: ticks at 5 and 10
        await loop_reactor.idle()
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert loop_reactor.evaluations == before + 2


async def test_drain_finishes_in_flight_patches_and_refuses_new_work(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, _ = wiring
    cluster.gate = asyncio.Event()
    signals.put([sample(clock=clock, source="a", in_flight=30.0)])
    while not loop_reactor.busy:
        await asyncio.sleep(0)
    drained = asyncio.create_task(loop_reactor.drain(timeout_s=5.0))
    await asyncio.sleep(0)
    assert not drained.done()
    cluster.gate.set()
    assert await drained
    assert [d.desired for d in cluster.applied] == [3]
    signals.put([sample(clock=clock, source="a", in_flight=90.0)])
    assert loop_reactor.busy == 0


async def test_policy_changes_trigger_evaluation_and_removal_forgets(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster,
) -> None:
    loop_reactor, _, _ = wiring
    before = loop_reactor.evaluations
    loop_reactor.set_policies({KEY: policy()})  # same policy: nothing to do
    await loop_reactor.idle()
    assert loop_reactor.evaluations == before
    edited = factories.policy("llama-70b", spec={
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "replicas": {"min": 4, "max": 50}})
    loop_reactor.set_policies({KEY: edited})
    await loop_reactor.idle()
    assert loop_reactor.evaluations == before + 1
    assert [d.desired for d in cluster.applied] == [4]  # the new min
    loop_reactor.set_policies({})
    loop_reactor.notify(KEY)
    assert loop_reactor.busy == 0


async def test_every_decision_is_audited(
    tmp_path: Path, clock: FakeClock, cluster: FakeCluster
) -> None:
    log = audit.AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1)
    signals = store.SignalStore()
    registry = factories.loaded_state(policy())
    loop_reactor = reactor.Reactor(state=registry, store=signals, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0,
                                   audit=log)
    try:
        signals.put([sample(clock=clock, source="a", in_flight=30.0)])
        loop_reactor.set_policies({KEY: policy()})
        await loop_reactor.idle()
    finally:
        log.close()
    [line] = (tmp_path / "audit.jsonl").read_text().splitlines()
    entry = json.loads(line)
    assert entry["model"] == KEY and entry["decision"]["desired"] == 3
    assert entry["apply"] == {"outcome": "applied", "reason": ""}
    assert entry["decision"]["signals"][0]["name"] == "concurrency"


class FakePool:
    """NodePoolActuator that records plans."""

    def __init__(self) -> None:
        self.plans: list[types.NodePlan] = []

    async def apply(self, pool: model.NodePool, plan: types.NodePlan) -> actuators.ApplyOutcome:
        self.plans.append(plan)
        return actuators.ApplyOutcome(actuators.Outcome.APPLIED, pool.name, None,
                                      plan.placeholder_pods)


def pooled(name: str) -> model.ScalePolicy:
    # TP8 replicas on 8-GPU nodes, one warm node; no forecast slope.
    return factories.policy(name, spec={
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "replicas": {"min": 1, "max": 50},
        "resources": {"gpusPerReplica": 8},
        "nodePool": {"name": "h100", "gpusPerNode": 8, "warmNodes": 1},
        "forecast": {"enabled": False},
        "behavior": {"scaleUp": {"stabilizationSeconds": 0,
                                 "policies": [{"type": "Pods", "value": 100,
                                               "periodSeconds": 15}]}},
    })


async def test_node_pool_is_planned_from_every_model_in_it(
    clock: FakeClock, cluster: FakeCluster
) -> None:
    signals = store.SignalStore()
    a, b = pooled("a"), pooled("b")
    registry = factories.loaded_state(a, b)
    pool = FakePool()
    loop_reactor = reactor.Reactor(state=registry, store=signals, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0,
                                   pool_actuators={"placeholder": pool})
    remove = signals.add_listener(loop_reactor.notify)
    try:
        # a: 30 in flight -> 3 replicas; b: 20 -> 2 replicas; 8 GPUs each on 8-GPU nodes.
        signals.put([sample(clock=clock, source="p", in_flight=30.0, key="inference/a"),
                     sample(clock=clock, source="p", in_flight=20.0, key="inference/b")])
        loop_reactor.set_policies({"inference/a": a, "inference/b": b})
        await loop_reactor.idle()
        last = pool.plans[-1]
        assert (last.nodes_for_replicas, last.headroom_nodes, last.nodes_wanted) == (5, 1, 6)
        applied = len(pool.plans)
        await loop_reactor.evaluate("inference/a")  # same plan within the backstop: no call
        await loop_reactor.idle()
        assert len(pool.plans) == applied
        [status] = registry.pools()
        assert status.plan.nodes_wanted == 6 and status.applies["applied"] == applied
    finally:
        remove()
        await loop_reactor.drain(timeout_s=5.0)


async def test_a_split_domain_pool_is_planned_by_its_arbiter_alone(
    clock: FakeClock, cluster: FakeCluster
) -> None:
    # Shard A evaluates a and arbitrates the pool's domain; shard B evaluates b, whose
    # asks reach A (`service.relay`). A plans the pool from both; B plans nothing.
    signals = store.SignalStore()
    a, b = pooled("a"), pooled("b")
    pools = {"A": FakePool(), "B": FakePool()}
    shards_ = {name: reactor.Reactor(
        state=factories.loaded_state(own), store=signals, reader=cluster, actuator=cluster,
        wall_clock=clock, backstop_s=5.0, pool_actuators={"placeholder": pools[name]})
        for name, own in (("A", a), ("B", b))}
    shards_["A"].planned_pools = frozenset({"h100"})
    shards_["B"].planned_pools = frozenset()
    shards_["A"].set_policies({a.key: a}, foreign={b.key: b})
    shards_["B"].set_policies({b.key: b}, remote={b.key})
    try:
        signals.put([sample(clock=clock, source="p", in_flight=30.0, key=a.key),
                     sample(clock=clock, source="p", in_flight=20.0, key=b.key)])
        shards_["A"].notify(a.key)
        shards_["B"].notify(b.key)
        for each in shards_.values():
            await each.idle()
        [asked] = shards_["B"].arbiter.outbox.values()  # what B's relay sends A
        assert (asked.key, asked.replicas) == (b.key, 2)
        assert shards_["A"].arbiter.put_foreign(asked, now=clock())
        shards_["A"].foreign_asked(b)
        await shards_["A"].idle()
        # a: 3 replicas, b: 2, of 8 GPUs each on 8-GPU nodes, plus one warm node.
        last = pools["A"].plans[-1]
        assert (last.nodes_for_replicas, last.nodes_wanted) == (5, 6)
        assert pools["B"].plans == []
    finally:
        for each in shards_.values():
            await each.drain(timeout_s=5.0)


class FailingOnce:
    """The real store behind the reactor's seam, failing the next `failures` reads (as a
    bug in a snapshot or the engine would)."""

    def __init__(self, inner: store.SignalStore, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def snapshot(self, model: str, *, now: float, stale_after_s: float,
                 latency_metric: vocabulary.LatencyMetric = vocabulary.DEFAULT_LATENCY_METRIC,
                 shared_sources: Collection[str] = ()) -> types.SignalSnapshot:
        if self.failures > 0:
            self.failures -= 1
            raise OverflowError("cannot convert float infinity to integer")
        return self.inner.snapshot(model, now=now, stale_after_s=stale_after_s,
                                   latency_metric=latency_metric,
                                   shared_sources=shared_sources)


async def test_a_failed_evaluation_is_counted_holds_and_the_next_one_runs(
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    signals = store.SignalStore()
    registry = factories.loaded_state(policy())
    flaky = FailingOnce(signals, failures=1)
    loop_reactor = reactor.Reactor(state=registry, store=flaky, reader=cluster,
                                   actuator=cluster, wall_clock=clock, backstop_s=5.0)
    remove = signals.add_listener(loop_reactor.notify)
    try:
        cluster.current[KEY] = 3
        loop_reactor.set_policies({KEY: policy()})  # this evaluation fails
        await loop_reactor.idle()
        status = registry.status(KEY)
        assert status is not None and status.evaluation_errors == 1
        assert cluster.applied == [] and cluster.current[KEY] == 3
        signals.put([sample(clock=clock, source="a", in_flight=80.0)])  # the next one works
        await loop_reactor.idle()
        assert [d.desired for d in cluster.applied] == [8]
        status = registry.status(KEY)
        assert status is not None and status.evaluation_errors == 1
    finally:
        remove()
        await loop_reactor.drain(timeout_s=5.0)


async def test_taking_over_from_a_share_of_the_signals_starts_the_down_window_again(
    wiring: tuple[reactor.Reactor, store.SignalStore, service_state.ServiceState],
    cluster: FakeCluster, clock: FakeClock,
) -> None:
    loop_reactor, signals, registry = wiring
    for replica in range(50):
        signals.put([sample(clock=clock, source=f"pod-{replica}", in_flight=4.2)])
    await loop_reactor.idle()
    assert cluster.current[KEY] == 20
    # Past the down window, this instance sees 5 replicas' worth: a follower in a queue
    # group that received a share of the reports. Taking over, it holds the count a
    # window long, as a restarted one does...
    clock.now += 400
    loop_reactor.take_over_from_a_share()
    signals.put([sample(clock=clock, source="pod-0", in_flight=50.0)])
    await loop_reactor.idle()
    status = registry.status(KEY)
    assert status is not None and status.last is not None
    assert cluster.current[KEY] == 20
    assert any(c.name == "stabilization_down" for c in status.last.decision.clamps)
    # ... and only that window: what it sees from then on decides.
    clock.now += 400
    signals.put([sample(clock=clock, source="pod-0", in_flight=50.0)])
    await loop_reactor.idle()
    assert cluster.current[KEY] < 20


async def _after_a_step(clock: FakeClock, *, shared_queue_sources: tuple[str, ...]
                        ) -> types.Decision:
    """One replica learns 0.1 replicas per req/s at 10 req/s; then a step to 44 req/s
    leaves 830 waiting at the gateway `gateway`, which reports them over NATS."""
    spec = {"signals": {"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}},
            "replicas": {"min": 1, "max": 50},
            "sources": {"sharedQueueSources": list(shared_queue_sources)},
            "behavior": {"scaleUp": {"stabilizationSeconds": 0, "policies": [
                {"type": "Pods", "value": 100, "periodSeconds": 15}]}}}
    stepped = factories.policy(spec=spec)
    signals, fake = store.SignalStore(), FakeCluster(current=1)
    loop_reactor = reactor.Reactor(state=factories.loaded_state(stepped), store=signals,
                                   reader=fake, actuator=fake, wall_clock=clock,
                                   backstop_s=5.0)
    remove = signals.add_listener(loop_reactor.notify)
    loop_reactor.set_policies({KEY: stepped})
    await loop_reactor.idle()
    Signal = vocabulary.Signal

    def report(source: str, **values: float) -> None:
        signals.put([samples.Sample(model=KEY, signal=Signal(name), source=source,
                                    ts=clock.now, value=value)
                     for name, value in values.items()])

    for _ in range(20):
        clock.now += 2.0
        report("nats/pod-a", in_flight=10, queue_depth=0, arrival_rate=10,
               completion_rate=10)
        await loop_reactor.idle()
    clock.now += 2.0
    report("nats/gateway", queue_depth=830)
    report("nats/pod-a", in_flight=20, queue_depth=0, arrival_rate=44, completion_rate=13)
    await loop_reactor.idle()
    remove()
    await loop_reactor.drain(timeout_s=5.0)
    return fake.applied[-1]


async def test_a_gateway_the_policy_names_is_a_queue_every_new_replica_drains(
        clock: FakeClock) -> None:
    # The same 830 waiting: at a replica (a gateway not named) new replicas only take
    # new arrivals; in the gateway's queue (named in sharedQueueSources) they drain it,
    # and the queue grows until they are ready, so the step buys more.
    own = await _after_a_step(clock, shared_queue_sources=())
    shared = await _after_a_step(clock, shared_queue_sources=("gateway",))
    own_queue, shared_queue = (next(s for s in d.signals if s.name == "queue_depth")
                               for d in (own, shared))
    assert "the shared queue" not in own_queue.detail
    assert "draining the shared queue: 830 waiting" in shared_queue.detail
    assert shared.desired > own.desired > 1
