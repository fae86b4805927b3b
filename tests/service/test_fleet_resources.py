"""GpuPool and GpuBudget resources end to end: created through the Kubernetes API (the
emulator, or a real cluster with SCALER_TEST_KUBECONFIG), read by the service's informers,
arbitrated with real NATS signals; an invalid one keeps the last good, with the reason in
its Valid condition. Every name is unique, and what the test creates it removes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
import pytest

from scaler.actuators import client as kube
from scaler.actuators import rbac
from scaler.emulator import env as kube_env
from scaler.policy import crd
from scaler.service import runner

from . import factories
from .test_end_to_end import eventually, nats_url

FIXTURES = (nats_url,)  # the real nats-server of the end-to-end tests, used by name

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CHAT, EMBED = "chat", "embed"


@dataclass(frozen=True, slots=True)
class World:
    """The cluster, the names this test owns in it, and the running service."""

    kube: kube_env.KubeTestEnv
    service: runner.Service
    pool: str
    budget: str
    tenant: str

    def key(self, model: str) -> str:
        return f"{self.kube.namespace}/{model}"

    def url(self, kind: crd.Kind, name: str) -> str:
        return f"{kind.collection()}/{name}"


async def until(check: Callable[[], Awaitable[bool]], *, what: str,
                timeout_s: float = 15.0) -> None:
    """Poll the cluster every 50 ms until `check()` holds (a bound, not a measurement)."""
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)
    assert await check(), what


async def install_crds(api: kube.KubeApi) -> None:
    """The chart's three CRDs (kept if a real cluster has them), once they are served."""
    for kind in crd.KINDS:
        try:
            await api.request("POST", CRDS, body=crd.definition(kind))
        except kube.KubeError as error:
            if error.status != 409:
                raise

    async def served() -> bool:
        try:
            for kind in crd.KINDS:
                await api.get(kind.collection())
        except kube.KubeError:
            return False  # not yet Established
        return True

    await until(served, what="the CRDs are served")


def pool_body(name: str, *, reserved: int = 4) -> dict[str, Any]:
    # 2 nodes x 8 GPUs, `reserved` held for training: 12 for the models by default. No
    # node of a real cluster has the selector, so none is excluded from the pool's GPUs.
    return {"apiVersion": crd.API_VERSION, "kind": "GpuPool", "metadata": {"name": name},
            "spec": {"gpusPerNode": 8, "maxNodes": 2, "nodeSelector": {"scaler.io/pool": name},
                     "reservations": [{"name": "training", "gpus": reserved}]}}


def budget_body(name: str, *, tenant: str, pool: str, borrow: bool = True) -> dict[str, Any]:
    # The tenant is guaranteed 8 GPUs of the pool and may hold 10 in all.
    return {"apiVersion": crd.API_VERSION, "kind": "GpuBudget", "metadata": {"name": name},
            "spec": {"tenant": tenant, "pool": pool, "guaranteedGpus": 8, "maxGpus": 10,
                     "borrow": borrow}}


def policy_body(name: str, *, tier: str, tenant: str, pool: str) -> dict[str, Any]:
    instant = {"stabilizationSeconds": 0,
               "policies": [{"type": "Pods", "value": 100, "periodSeconds": 1}]}
    return {"apiVersion": crd.API_VERSION, "kind": "ScalePolicy",
            "metadata": {"name": name, "labels": {"tenant": tenant}},
            "spec": {"target": {"name": name}, "tier": tier,
                     "replicas": {"min": 1, "max": 20},
                     "signals": {"concurrency": {"targetPerReplica": 10}},
                     "behavior": {"scaleUp": instant, "scaleDown": instant},
                     "coldStart": {"imagePullSeconds": 1, "modelLoadSeconds": 1,
                                   "readinessSeconds": 1},
                     "nodePool": {"name": pool, "gpusPerNode": 8, "actuator": "none"}}}


@pytest.fixture
async def world(nats_url: str) -> AsyncIterator[World]:
    suffix = uuid.uuid4().hex[:8]
    pool, budget, tenant = f"h100-{suffix}", f"search-{suffix}", f"search-{suffix}"
    async with kube_env.kube_test_env(kubeconfig=REAL_CLUSTER, wall_clock=time.time) as env:
        await install_crds(env.api)
        for name, tier in ((CHAT, "online"), (EMBED, "batch")):
            await env.create_deployment(name, replicas=1)
            await env.create(crd.API_VERSION, crd.PLURAL,
                             policy_body(name, tier=tier, tenant=tenant, pool=pool))
        # The pool exists before the service starts (its first list), the budget comes
        # after (its watch).
        await env.api.request("POST", crd.GPU_POOL.collection(), body=pool_body(pool))
        config = factories.resource_settings(nats_url=nats_url, kube=env.settings,
                                             namespace=env.namespace)
        service = runner.Service(config)
        try:
            await service.start()
            await eventually(lambda: service.state.ready and bool(service.state.leader),
                             what="service ready and leading")
            await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
            yield World(kube=env, service=service, pool=pool, budget=budget, tenant=tenant)
        finally:
            await service.stop()
            for kind, name in ((crd.GPU_BUDGET, budget), (crd.GPU_POOL, pool)):
                try:
                    await env.api.request("DELETE", f"{kind.collection()}/{name}")
                except kube.KubeError as error:
                    if not error.not_found:
                        raise


async def publish(nats_url: str, world: World, in_flight: dict[str, float]) -> None:
    client = await nats.connect(nats_url)
    namespace = world.kube.namespace
    try:
        for name, value in in_flight.items():
            body = {"v": 1, "model": name, "namespace": namespace, "source": f"{name}-0",
                    "ts": time.time(), "in_flight": value}
            await client.publish(f"scaler.signals.{namespace}.{name}",
                                 json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


def holds(world: World, chat: int, embed: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        found = []
        for name in (CHAT, EMBED):
            scale = await world.kube.api.get(
                f"{world.kube.collection('apps/v1', 'deployments')}/{name}/scale")
            found.append(int((scale.get("spec") or {}).get("replicas") or 0))
        return found == [chat, embed]
    return check


def valid(world: World, kind: crd.Kind, name: str, status: str
          ) -> Callable[[], Awaitable[dict[str, Any]]]:
    """The resource's Valid condition once its status is `status` ({} until then)."""
    async def read() -> dict[str, Any]:
        obj = await world.kube.api.get(world.url(kind, name))
        for item in (obj.get("status") or {}).get("conditions") or []:
            if item["type"] == crd.VALID and item["status"] == status:
                return dict(item)
        return {}
    return read


async def condition(read: Callable[[], Awaitable[dict[str, Any]]], *, what: str
                    ) -> dict[str, Any]:
    async def ready() -> bool:
        return bool(await read())
    await until(ready, what=what)
    return await read()


async def test_a_pool_and_budget_from_the_api_are_arbitrated_and_removed(
        world: World, nats_url: str) -> None:
    service, api = world.service, world.kube.api
    assert set(service.watcher.current.pools) == {world.pool}
    await api.request("POST", crd.GPU_BUDGET.collection(),
                      body=budget_body(world.budget, tenant=world.tenant, pool=world.pool))
    await eventually(lambda: world.budget in service.watcher.current.budgets,
                     what="the budget read from its watch")
    loaded = service.watcher.current.pools[world.pool]
    assert loaded.path == f"gpupools/{world.pool}" and loaded.value.spec.reserved_gpus == 4

    # chat (online) wants 150 / 10 = 15 replicas, embed (batch) 100 / 10 = 10; one GPU
    # each. Floors first (1 + 1), the guarantee of 8 to online (chat 7), then the ceiling
    # of 10 leaves chat 2 more to borrow: chat 9, embed 1.
    await publish(nats_url, world, {CHAT: 150.0, EMBED: 100.0})
    await until(holds(world, 9, 1), what="chat 9 and embed 1")
    grant = service.reactor.arbiter.grant(world.key(CHAT))
    assert grant is not None
    assert grant.reason.startswith(f"capped by tenant {world.tenant}: 10 of 10 GPUs")
    for kind, name in ((crd.GPU_POOL, world.pool), (crd.GPU_BUDGET, world.budget)):
        written = await condition(valid(world, kind, name, "True"), what=f"{name} Valid")
        assert written["reason"] == "Valid"

    # The budget deleted: only the pool binds. 12 shareable GPUs, floors 1 + 1, online
    # first: chat 11, embed 1.
    await api.request("DELETE", world.url(crd.GPU_BUDGET, world.budget))
    await until(holds(world, 11, 1), what="chat 11 and embed 1 without the budget")
    assert world.budget not in service.watcher.current.budgets

    if world.kube.emulator is None:
        return  # a real cluster keeps no request log
    # Every fleet request was one `scaler kube rbac --policy-resources` grants, and each of
    # its fleet grants (list, watch, status patch of both kinds) was used.
    emulator = world.kube.emulator
    plan = rbac.plan(service.settings.kube, name="scaler", namespace="scaler",
                     policy_resources=True)
    plurals = {kind.plural for kind in crd.FLEET_KINDS}
    granted = {grant for grant in rbac.grants(rbac.manifests(plan), plan.subject)
               if grant[2].partition("/")[0] in plurals}
    used = {attributes for record in emulator.requests
            if (attributes := rbac.request_attributes(
                record.method, record.path, watch=record.verb == "watch")) is not None
            and attributes.resource.partition("/")[0] in plurals
            and attributes.verb in ("list", "watch", "patch")}
    assert used and all(rbac.allowed(granted, each) for each in used)
    # `get` of one pool or budget is granted for kubectl and users (`kubectl get gpupool
    # NAME`); the service itself only lists and watches them.
    assert {grant[3] for grant in granted} == {"get", "list", "watch", "patch"}
    assert all(any(rbac.authorizes(grant, each) for each in used)
               for grant in granted if grant[3] != "get")


async def test_an_invalid_pool_or_budget_keeps_the_last_good_with_the_reason(
        world: World, nats_url: str) -> None:
    service, api = world.service, world.kube.api
    await api.request("POST", crd.GPU_BUDGET.collection(),
                      body=budget_body(world.budget, tenant=world.tenant, pool=world.pool))
    await publish(nats_url, world, {CHAT: 150.0, EMBED: 100.0})
    await until(holds(world, 9, 1), what="chat 9 and embed 1")
    await condition(valid(world, crd.GPU_POOL, world.pool, "True"), what="pool Valid")

    # Reservations above the pool's 16 GPUs: the schema cannot say it, the service does.
    await api.merge_patch(world.url(crd.GPU_POOL, world.pool),
                          {"spec": {"reservations": [{"name": "training", "gpus": 40}]}})
    # Borrow off with a ceiling above the guarantee.
    await api.merge_patch(world.url(crd.GPU_BUDGET, world.budget), {"spec": {"borrow": False}})
    refused = await condition(valid(world, crd.GPU_POOL, world.pool, "False"),
                              what="pool Valid False")
    assert refused["reason"] == "InvalidSpec"
    assert refused["message"].startswith(f"gpupools/{world.pool} (document 0): spec: ")
    assert "reservations hold 40 GPUs, more than the pool's 16" in refused["message"]
    assert refused["message"].endswith("the last good version stays in force")
    stored = await api.get(world.url(crd.GPU_POOL, world.pool))
    assert stored["status"]["observedGeneration"] == stored["metadata"]["generation"] == 2
    budget = await condition(valid(world, crd.GPU_BUDGET, world.budget, "False"),
                             what="budget Valid False")
    assert "borrow is off" in budget["message"]

    # The last good pool and budget stay in force: the same arbitration.
    current = service.watcher.current
    assert current.pools[world.pool].value.spec.reserved_gpus == 4
    assert current.budgets[world.budget].value.spec.borrow is True
    load = service.state.policy_load
    assert load is not None
    assert {(error.path, error.field) for error in load.errors} == {
        (f"gpupools/{world.pool}", "spec"), (f"gpubudgets/{world.budget}", "spec")}
    await publish(nats_url, world, {CHAT: 150.0, EMBED: 100.0})
    await service.reactor.idle()
    assert await holds(world, 9, 1)()

    # Mended: valid again, in force (8 GPUs reserved now: 8 for the models, all chat's
    # but embed's floor).
    await api.merge_patch(world.url(crd.GPU_POOL, world.pool),
                          {"spec": {"reservations": [{"name": "training", "gpus": 8}]}})
    await condition(valid(world, crd.GPU_POOL, world.pool, "True"), what="pool Valid again")
    await until(holds(world, 7, 1), what="chat 7 and embed 1 on the mended pool")
