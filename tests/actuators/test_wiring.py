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
