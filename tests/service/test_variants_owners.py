"""Variants on the Kubernetes API (the emulator, or a real cluster with
SCALER_TEST_KUBECONFIG): an HPA created on a variant's target after the last write of the
mix is found within `OWNER_RECHECK_S` though no count changes, and its variant is then
reported HPA-owned and never patched. The reactor runs on a wall clock the test moves, so
the interval passes in no time; the reader, the actuator and the API are the real ones."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator

import pytest

from scaler.actuators import settings as kube_settings
from scaler.actuators import wiring
from scaler.core import vocabulary
from scaler.emulator import ControllerSettings, EmulatorController
from scaler.emulator import env as kube_env
from scaler.policy import fleet as policy_fleet
from scaler.policy import loader, model
from scaler.service import reactor
from scaler.service import variants as service_variants
from scaler.signals import samples, store

from . import factories
from .test_variant_rows import POOLS
from .test_variants_kube import _cancel

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")
H100, L40S = "chat-h100", "chat-l40s"
HPA = "chat-h100-hpa"
OWNER = f"HorizontalPodAutoscaler/{HPA}"


def _policy(namespace: str) -> model.ScalePolicy:
    # Yardstick 10 requests; an H100 replica serves 30, an L40S one 10 (POOLS' prices).
    instant = {"stabilizationSeconds": 0,
               "policies": [{"type": "Pods", "value": 100, "periodSeconds": 1}]}
    return factories.policy("chat", namespace=namespace, spec={
        "target": {"name": H100}, "replicas": {"min": 1, "max": 40},
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "behavior": {"scaleUp": instant, "scaleDown": instant},
        "coldStart": {"imagePullSeconds": 1, "modelLoadSeconds": 1, "readinessSeconds": 1},
        "variants": [
            {"name": "h100", "target": {"name": H100}, "nodePool": "h100", "capacity": 30},
            {"name": "l40s", "target": {"name": L40S}, "nodePool": "l40s", "capacity": 10}]})


class World:
    """The cluster, the real reader and actuator over it, and a reactor on `clock`."""

    def __init__(self, env: kube_env.KubeTestEnv, adapters: wiring.KubeAdapters,
                 clock: kube_env.ManualClock) -> None:
        self.env, self.clock = env, clock
        self.policy = _policy(env.namespace)
        self.signals = store.SignalStore()
        self.state = factories.loaded_state(self.policy)
        self.reactor = reactor.Reactor(state=self.state, store=self.signals,
                                       reader=adapters.reader, actuator=adapters.replicas,
                                       wall_clock=clock, backstop_s=5.0)
        result = loader.parse_documents(POOLS, "pools.yaml")
        assert not result.errors
        self.reactor.set_policies({self.policy.key: self.policy},
                                  fleet=policy_fleet.fleet_of(result))

    async def evaluate(self, in_flight: float) -> None:
        """A fresh report of `in_flight` requests now, and every evaluation it leads to
        (the model's, the fleet's arbitration, the model's again with the new mix)."""
        self.signals.put([samples.Sample(self.policy.key, vocabulary.Signal.IN_FLIGHT,
                                         "gateway", self.clock(), in_flight)])
        self.reactor.notify(self.policy.key)
        await self.reactor.idle()

    def owner(self) -> str | None:
        status = self.state.status(self.policy.key)
        assert status is not None and status.last is not None
        (h100, _) = status.last.variants
        return h100.owner

    async def replicas(self, name: str) -> int:
        scale = await self.env.api.get(
            f"{self.env.collection('apps/v1', 'deployments')}/{name}/scale")
        return int((scale.get("spec") or {}).get("replicas") or 0)

    def patches_of(self, name: str) -> list[str]:
        assert self.env.emulator is not None
        return [r.path for r in self.env.emulator.requests
                if r.method == "PATCH" and r.path.endswith(f"/{name}/scale")]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = kube_env.ManualClock(time.time())
    async with contextlib.AsyncExitStack() as stack:
        env = await stack.enter_async_context(
            kube_env.kube_test_env(kubeconfig=REAL_CLUSTER, wall_clock=clock))
        if env.emulator is not None:  # a real cluster's controllers start the pods
            controller = EmulatorController(env.emulator, ControllerSettings(interval_s=0.02))
            task = asyncio.create_task(controller.run())
            stack.push_async_callback(_cancel, task)
        await env.create_deployment(H100, replicas=2)
        await env.create_deployment(L40S, replicas=0)
        # ownership_ttl_s 0: the actuator asks for the HPAs at each check, so what is timed
        # here is the re-check's interval alone, not the actuator's cache on top.
        settings = env.settings.model_copy(update={
            "lease": kube_settings.LeaseSettings(enabled=False), "ownership_ttl_s": 0.0,
            "watch_namespaces": (env.namespace,)})
        adapters = await wiring.connect(settings, identity="test", wall_clock=clock)
        stack.push_async_callback(adapters.close)
        await adapters.start()
        built = World(env, adapters, clock)
        await adapters.update([built.policy])
        stack.push_async_callback(built.reactor.drain, timeout_s=5.0)
        async with asyncio.timeout(30):
            while (await built.env.api.get(built.env.collection("apps/v1", "deployments")
                                           + f"/{H100}")).get("status", {}).get(
                                               "readyReplicas") != 2:
                await asyncio.sleep(0.02)
        yield built


async def test_an_hpa_added_after_the_last_write_is_found_without_a_count_change(
        world: World) -> None:
    # 55 in flight: a demand of 60 requests, which the 2 warm H100 serve: the mix is
    # h100 2, l40s 0, what the targets hold. The first write checks the owners (none).
    await world.evaluate(55.0)
    assert world.reactor.arbiter.owners(world.policy.key) == {}
    first_check = world.reactor.arbiter.owners_checked_at(world.policy.key)
    assert first_check == world.clock()
    assert world.owner() is None

    await world.env.create("autoscaling/v2", "horizontalpodautoscalers", {
        "metadata": {"name": HPA},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": H100},
                 "minReplicas": 2, "maxReplicas": 2}})
    # Within the interval and no count to change: nothing is written or checked.
    world.clock.advance(service_variants.OWNER_RECHECK_S - 5.0)
    await world.evaluate(55.0)
    assert world.owner() is None
    assert world.reactor.arbiter.owners_checked_at(world.policy.key) == first_check

    # The interval is over: the unchanged mix is written, which finds the HPA.
    world.clock.advance(5.0)
    await world.evaluate(55.0)
    assert world.owner() == OWNER
    assert world.reactor.arbiter.owners(world.policy.key) == {"h100": OWNER}

    # 5 in flight: free to mix, one L40S would serve it and the H100s would go. The HPA
    # holds its 2 H100 (60), which serve it alone: not patched, and no L40S started.
    world.clock.advance(1.0)
    await world.evaluate(5.0)
    assert world.owner() == OWNER
    assert (await world.replicas(H100), await world.replicas(L40S)) == (2, 0)
    if world.env.emulator is not None:
        assert world.patches_of(H100) == []
