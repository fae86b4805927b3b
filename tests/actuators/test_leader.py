"""Leader election on one Lease: acquire, renew, failover, release, and no double patching."""

from __future__ import annotations

import asyncio

import pytest

from scaler.actuators import base, events, leader, replicas
from scaler.actuators import settings as kube_settings
from scaler.emulator.env import KubeTestEnv, ManualClock

from .factories import make_decision, make_policy

pytestmark = pytest.mark.kube


def elector(kube: KubeTestEnv, identity: str, *, wall_clock: ManualClock,
            monotonic: ManualClock | None,
            settings: kube_settings.LeaseSettings | None = None) -> leader.LeaseElector:
    settings = settings or kube_settings.LeaseSettings(namespace=kube.namespace, name="leader")
    return leader.LeaseElector(kube.api, settings=settings, identity=identity,
                               wall_clock=wall_clock, monotonic=monotonic)


def only_one(a: leader.LeaseElector, b: leader.LeaseElector) -> None:
    assert not (a.is_leader and b.is_leader), "two leaders at once"


async def lease(kube: KubeTestEnv) -> dict[str, object]:
    body = await kube.api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{kube.namespace}/leases/leader")
    return dict(body["spec"])


async def test_failover_without_double_patching(kube: KubeTestEnv, wall_clock: ManualClock,
                                                monotonic: ManualClock) -> None:
    a = elector(kube, "a", wall_clock=wall_clock, monotonic=monotonic)
    b = elector(kube, "b", wall_clock=wall_clock, monotonic=monotonic)
    await kube.create_deployment("model", replicas=1)
    policy = make_policy(kube.namespace, "model")
    settings = kube_settings.KubeSettings()

    def actuator_for(elect: leader.LeaseElector) -> replicas.KubeReplicaActuator:
        recorder = events.EventRecorder(kube.api, settings=settings.events,
                                        wall_clock=wall_clock, instance=elect.identity)
        return replicas.KubeReplicaActuator(kube.api, settings=settings, recorder=recorder,
                                            leader=elect)

    act_a, act_b = actuator_for(a), actuator_for(b)

    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    only_one(a, b)
    spec = await lease(kube)
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert str(spec["renewTime"]).endswith("Z") and "." in str(spec["renewTime"])  # MicroTime

    # Both get the same decision; only the leader writes it.
    outcomes = [await act.apply(policy, make_decision(policy.key, current=1, desired=2))
                for act in (act_a, act_b)]
    assert [o.outcome for o in outcomes] == [base.Outcome.APPLIED, base.Outcome.NOT_LEADER]

    # a stops renewing (hung or partitioned). After its renew deadline (10 s) it stops
    # acting; b may take over only once the lease is unchanged for 15 s.
    monotonic.advance(11)
    assert not a.is_leader
    assert await b.try_acquire_or_renew() is False
    only_one(a, b)
    monotonic.advance(5)
    assert await b.try_acquire_or_renew() is True
    only_one(a, b)
    assert b.is_leader
    spec = await lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1

    # a comes back: it sees b renewing and stays a follower.
    assert await a.try_acquire_or_renew() is False
    outcomes = [await act.apply(policy, make_decision(policy.key, current=2, desired=3))
                for act in (act_a, act_b)]
    assert [o.outcome for o in outcomes] == [base.Outcome.NOT_LEADER, base.Outcome.APPLIED]
    scale = await kube.api.get(f"{kube.collection('apps/v1', 'deployments')}/model/scale")
    assert scale["spec"].get("replicas", 0) == 3  # a real Scale omits 0
    if kube.emulator is not None:
        assert kube.emulator.count(method="PATCH", path="/model/scale$") == 2


async def test_renewing_leader_keeps_the_lease(kube: KubeTestEnv, wall_clock: ManualClock,
                                               monotonic: ManualClock) -> None:
    a = elector(kube, "a", wall_clock=wall_clock, monotonic=monotonic)
    b = elector(kube, "b", wall_clock=wall_clock, monotonic=monotonic)
    assert await a.try_acquire_or_renew()
    for _ in range(10):  # 10 rounds of 2 s: 20 s, past one lease duration
        monotonic.advance(2)
        wall_clock.advance(2)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        only_one(a, b)
    assert (await lease(kube))["leaseTransitions"] == 0


async def test_release_hands_over_at_once(kube: KubeTestEnv, wall_clock: ManualClock,
                                          monotonic: ManualClock) -> None:
    a = elector(kube, "a", wall_clock=wall_clock, monotonic=monotonic)
    b = elector(kube, "b", wall_clock=wall_clock, monotonic=monotonic)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()

    await a.release()

    assert not a.is_leader
    assert await b.try_acquire_or_renew()  # no wait for expiry
    assert (await lease(kube))["holderIdentity"] == "b"


async def test_simultaneous_candidates_elect_exactly_one(
        kube: KubeTestEnv, wall_clock: ManualClock, monotonic: ManualClock) -> None:
    candidates = [elector(kube, f"c{i}", wall_clock=wall_clock, monotonic=monotonic)
                  for i in range(4)]
    won = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
    assert won.count(True) == 1

    # The winner dies; after expiry all race again for the same Lease: still exactly one.
    winner = candidates[won.index(True)]
    rest = [c for c in candidates if c is not winner]
    # Followers time expiry from when they first saw the lease, not from its renewTime.
    assert not any(await asyncio.gather(*(c.try_acquire_or_renew() for c in rest)))
    monotonic.advance(16)
    won = await asyncio.gather(*(c.try_acquire_or_renew() for c in rest))
    assert won.count(True) == 1
    assert sum(c.is_leader for c in candidates) == 1


async def test_run_loop_fails_over_on_shutdown(kube: KubeTestEnv,
                                               wall_clock: ManualClock) -> None:
    """The run loops on the real event loop clock, with short timings."""
    settings = kube_settings.LeaseSettings(namespace=kube.namespace, name="leader",
                                           lease_duration_s=2, renew_deadline_s=1.0,
                                           retry_period_s=0.05)
    a = elector(kube, "a", wall_clock=wall_clock, monotonic=None, settings=settings)
    b = elector(kube, "b", wall_clock=wall_clock, monotonic=None, settings=settings)

    async def until(check: leader.LeaseElector) -> None:
        async with asyncio.timeout(5):
            while not check.is_leader:
                await asyncio.sleep(0.02)

    task_a = asyncio.create_task(a.run(), name="elector-a")
    await until(a)
    task_b = asyncio.create_task(b.run(), name="elector-b")
    try:
        await asyncio.sleep(0.2)
        assert a.is_leader and not b.is_leader
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)
        await a.release()
        await until(b)
        assert not a.is_leader
    finally:
        task_a.cancel()
        task_b.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
