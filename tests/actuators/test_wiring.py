"""The adapters built from settings work together over one client."""

from __future__ import annotations

import asyncio

import pytest

from scaler.actuators import base, wiring
from scaler.actuators import settings as kube_settings
from scaler.emulator.env import KubeTestEnv, ManualClock

from .factories import make_decision, make_policy

pytestmark = pytest.mark.kube


async def test_connect_read_apply_close(kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    settings = kube.settings.model_copy(update={
        "lease": kube_settings.LeaseSettings(namespace=kube.namespace, retry_period_s=0.05,
                                             renew_deadline_s=1, lease_duration_s=2)})
    adapters = await wiring.connect(settings, identity="scaler-0", wall_clock=wall_clock)
    await adapters.start()
    elector = asyncio.create_task(adapters.leader.run(), name="leader")
    try:
        async with asyncio.timeout(5):
            while not adapters.leader.is_leader:
                await asyncio.sleep(0.02)
        assert isinstance(adapters.reader, base.ClusterReader)
        assert isinstance(adapters.replicas, base.ReplicaActuator)
        assert all(isinstance(p, base.NodePoolActuator) for p in adapters.pools.values())
        await kube.create_deployment("llama", replicas=1)
        policy = make_policy(kube.namespace, "llama")
        cluster = await adapters.reader.read(policy)
        outcome = await adapters.replicas.apply(
            policy, make_decision(policy.key, current=cluster.current, desired=2))
        assert outcome.outcome is base.Outcome.APPLIED
    finally:
        elector.cancel()
        await asyncio.gather(elector, return_exceptions=True)
        await adapters.close()
    lease = await kube.api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{kube.namespace}/leases/scaler-leader")
    assert not lease["spec"].get("holderIdentity")  # released on close


async def until_leading(*adapters: wiring.KubeAdapters) -> None:
    async with asyncio.timeout(5):
        while not all(each.leader.is_leader for each in adapters):
            await asyncio.sleep(0.02)


async def test_dry_run_beside_a_live_instance_never_takes_the_shared_lease(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    """`scaler run --dry-run` started first, then a live instance with the same settings:
    the live one leads at once and patches; the dry-run one, leading only its own Lease,
    patches nothing, and the shared Lease never changes hands."""
    lease = kube_settings.LeaseSettings(namespace=kube.namespace, retry_period_s=0.05,
                                        renew_deadline_s=1, lease_duration_s=2)
    live_settings = kube.settings.model_copy(update={"lease": lease})
    dry_settings = live_settings.model_copy(update={"dry_run": True})
    await kube.create_deployment("llama", replicas=1)
    policy = make_policy(kube.namespace, "llama")
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{kube.namespace}/leases"
    dry = await wiring.connect(dry_settings, identity="dry", wall_clock=wall_clock)
    live = await wiring.connect(live_settings, identity="live", wall_clock=wall_clock)
    electors: list[asyncio.Task[None]] = []
    try:
        electors.append(asyncio.create_task(dry.leader.run(), name="leader-dry"))
        await until_leading(dry)
        electors.append(asyncio.create_task(live.leader.run(), name="leader-live"))
        await until_leading(live)

        dry_run = await dry.replicas.apply(policy, make_decision(policy.key, current=1,
                                                                 desired=4))
        applied = await live.replicas.apply(policy, make_decision(policy.key, current=1,
                                                                  desired=2))
        await asyncio.sleep(0.3)  # several renewal rounds of both
        assert dry.leader.is_leader and live.leader.is_leader
        shared = await kube.api.get(f"{leases}/scaler-leader")
        own = await kube.api.get(f"{leases}/scaler-leader-dry-run")
    finally:
        for task in electors:
            task.cancel()
        await asyncio.gather(*electors, return_exceptions=True)
        await dry.close()
        await live.close()

    assert (dry_run.outcome, applied.outcome) == (base.Outcome.DRY_RUN, base.Outcome.APPLIED)
    scale = await kube.api.get(f"{kube.collection('apps/v1', 'deployments')}/llama/scale")
    assert scale["spec"].get("replicas", 0) == 2
    assert (shared["spec"]["holderIdentity"], shared["spec"]["leaseTransitions"]) == ("live", 0)
    assert own["spec"]["holderIdentity"] == "dry"
