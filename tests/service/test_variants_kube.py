"""Variants end to end on the Kubernetes API (the emulator, or a real cluster with
SCALER_TEST_KUBECONFIG), with real NATS signals: each variant's replicas in the
ScalePolicy's status, in /metrics and in `scaler explain`; each variant's pool planned
from its own count; a variant an HPA scales left to it, said so, and counted in the mix.
Every name is unique, and what the test creates it removes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import nats
import pytest
from prometheus_client import parser

from scaler import cli
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.emulator import ControllerSettings, EmulatorController
from scaler.emulator import env as kube_env
from scaler.policy import crd
from scaler.service import runner

from . import factories
from .test_end_to_end import eventually, nats_url
from .test_fleet_resources import install_crds, until

FIXTURES = (nats_url,)  # the real nats-server of the end-to-end tests, used by name

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")
H100, L40S = "chat-h100", "chat-l40s"
HPA = "chat-h100-hpa"

# Yardstick: 10 requests per replica. An H100 replica serves 30 on 2 GPUs at 2.0 each
# (4.0/h, 0.133 per request), an L40S one 10 on 1 GPU at 1.0 (0.100 per request).
# Pool h100: 2 nodes of 4 GPUs (room for 4 H100 replicas); pool l40s: 1 node of 4.


@dataclass(frozen=True, slots=True)
class World:
    """The cluster, the pools this test owns in it, and the running service."""

    kube: kube_env.KubeTestEnv
    service: runner.Service
    h100: str
    l40s: str

    @property
    def key(self) -> str:
        return f"{self.kube.namespace}/chat"

    def scale_path(self, name: str) -> str:
        return f"{self.kube.collection('apps/v1', 'deployments')}/{name}/scale"

    async def replicas(self) -> tuple[int, int]:
        found = []
        for name in (H100, L40S):
            scale = await self.kube.api.get(self.scale_path(name))
            found.append(int((scale.get("spec") or {}).get("replicas") or 0))
        return found[0], found[1]

    async def status(self) -> dict[str, Any]:
        obj = await self.kube.api.get(
            f"{self.kube.collection(crd.API_VERSION, crd.PLURAL)}/chat")
        return dict(obj.get("status") or {})

    async def condition(self, kind: crd.ConditionType) -> dict[str, Any]:
        for item in (await self.status()).get("conditions") or []:
            if item["type"] == kind:
                return dict(item)
        return {}


def pool_body(name: str, *, nodes: int, hourly: float) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": "GpuPool", "metadata": {"name": name},
            "spec": {"gpusPerNode": 4, "maxNodes": nodes, "gpuHourly": hourly,
                     "nodeSelector": {"scaler.io/pool": name}}}


def policy_body(h100: str, l40s: str, *, tier: str = "online") -> dict[str, Any]:
    instant = {"stabilizationSeconds": 0,
               "policies": [{"type": "Pods", "value": 100, "periodSeconds": 1}]}
    return {"apiVersion": crd.API_VERSION, "kind": "ScalePolicy",
            "metadata": {"name": "chat"},
            "spec": {"target": {"name": H100}, "replicas": {"min": 1, "max": 40},
                     "tier": tier,
                     "signals": {"concurrency": {"targetPerReplica": 10}},
                     "behavior": {"scaleUp": instant, "scaleDown": instant},
                     "coldStart": {"imagePullSeconds": 1, "modelLoadSeconds": 1,
                                   "readinessSeconds": 1},
                     # The h100 pool's node settings; the l40s pool takes the same
                     # actuator on its own GpuPool's nodes.
                     "nodePool": {"name": h100, "gpusPerNode": 4, "actuator": "placeholder",
                                  "warmNodes": 1},
                     "variants": [
                         {"name": "h100", "target": {"name": H100}, "nodePool": h100,
                          "capacity": 30, "resources": {"gpusPerReplica": 2}},
                         {"name": "l40s", "target": {"name": L40S}, "nodePool": l40s,
                          "capacity": 10}]}}


def hpa_body(*, replicas: int) -> dict[str, Any]:
    # minReplicas = maxReplicas: a real HPA controller holds the count there whatever its
    # metrics say (the pause pods report none).
    return {"metadata": {"name": HPA},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": H100},
                     "minReplicas": replicas, "maxReplicas": replicas}}


Start = Callable[..., Awaitable[World]]


@pytest.fixture
async def start_world(nats_url: str) -> AsyncIterator[Start]:
    """Start a world: both Deployments at `h100` and `l40s` replicas, an HPA on the H100
    one when `hpa`, the pools and the policy (of `tier`) as resources, the service
    watching them."""
    stack = contextlib.AsyncExitStack()
    suffix = uuid.uuid4().hex[:8]
    h100, l40s = f"h100-{suffix}", f"l40s-{suffix}"

    async def start(*, h100_replicas: int, l40s_replicas: int, hpa: bool = False,
                    tier: str = "online") -> World:
        env = await stack.enter_async_context(
            kube_env.kube_test_env(kubeconfig=REAL_CLUSTER, wall_clock=time.time))
        await install_crds(env.api)
        if env.emulator is not None:  # a real cluster's controllers start the pods
            controller = EmulatorController(env.emulator, ControllerSettings(interval_s=0.02))
            task = asyncio.create_task(controller.run())
            stack.push_async_callback(_cancel, task)
        for name, count in ((H100, h100_replicas), (L40S, l40s_replicas)):
            await env.create_deployment(name, replicas=count)
        if hpa:
            await env.create("autoscaling/v2", "horizontalpodautoscalers",
                             hpa_body(replicas=h100_replicas))
        for name, nodes, hourly in ((h100, 2, 2.0), (l40s, 1, 1.0)):
            await env.api.request("POST", crd.GPU_POOL.collection(),
                                  body=pool_body(name, nodes=nodes, hourly=hourly))
            stack.push_async_callback(_delete, env.api, f"{crd.GPU_POOL.collection()}/{name}")
        await env.create(crd.API_VERSION, crd.PLURAL, policy_body(h100, l40s, tier=tier))
        config = factories.resource_settings(
            nats_url=nats_url, kube=env.settings, namespace=env.namespace,
            ownership_ttl_s=0.2, placeholder=kube_settings.PlaceholderSettings(
                enabled=True, namespace=env.namespace))
        service = runner.Service(config)
        stack.push_async_callback(service.stop)
        await service.start()
        await eventually(lambda: service.state.ready and bool(service.state.leader),
                         what="service ready and leading")
        await asyncio.wait_for(service.wait_sources_ready(), timeout=10)
        await eventually(lambda: {h100, l40s} <= set(service.watcher.current.pools),
                         what="both pools read")
        return World(kube=env, service=service, h100=h100, l40s=l40s)

    try:
        yield start
    finally:
        await stack.aclose()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _delete(api: kube.KubeApi, path: str) -> None:
    try:
        await api.request("DELETE", path)
    except kube.KubeError as error:
        if not error.not_found:
            raise


async def publish(nats_url: str, world: World, in_flight: float) -> None:
    """The model's in-flight requests, from one source that is no pod of either variant."""
    await report(nats_url, world, {"chat-0": in_flight})


async def report(nats_url: str, world: World, work: Mapping[str, float]) -> None:
    """One signal message per source (a pod's name, DESIGN 4.2) with its in-flight."""
    client = await nats.connect(nats_url)
    namespace = world.kube.namespace
    try:
        for source, in_flight in work.items():
            body = {"v": 1, "model": "chat", "namespace": namespace, "source": source,
                    "ts": time.time(), "in_flight": in_flight}
            await client.publish(f"scaler.signals.{namespace}.chat", json.dumps(body).encode())
        await client.flush()
    finally:
        await client.close()


def holds(world: World, h100: int, l40s: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await world.replicas() == (h100, l40s)
    return check


async def metrics(world: World) -> dict[tuple[str, str], float]:
    """(family, variant) -> value of the service's per-variant gauges for this model."""
    assert world.service.http is not None
    async with aiohttp.ClientSession() as http, \
            http.get(world.service.http.url + "/metrics") as response:
        text = await response.text()
    return {(sample.name, sample.labels["variant"]): sample.value
            for family in parser.text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("scaler_variant_")
            and sample.labels.get("namespace") == world.kube.namespace}


async def explain(world: World, capsys: pytest.CaptureFixture[str]) -> str:
    assert world.service.http is not None
    code = await asyncio.to_thread(cli.main, ["explain", world.key, "--url",
                                              world.service.http.url])
    assert code == 0
    return capsys.readouterr().out


async def test_each_variant_in_status_metrics_explain_and_its_own_pool(
        start_world: Start, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    world = await start_world(h100_replicas=2, l40s_replicas=0)
    # 100 in flight: a demand of 100 requests. The 2 warm H100 serve 60; the 40 short go
    # to the cheapest cover, 4 L40S (4.0/h; 2 more H100 would cost 8.0/h), which fill pool
    # l40s: h100 2, l40s 4.
    await publish(nats_url, world, 100.0)
    await until(holds(world, 2, 4), what="h100 2, l40s 4")

    def row(name: str, *, desired: int, pool: str) -> dict[str, Any]:
        return {"name": name, "target": f"chat-{name}", "pool": pool,
                "desiredReplicas": desired, "currentReplicas": desired,
                "readyReplicas": desired, "startingReplicas": 0}

    want = [row("h100", desired=2, pool=world.h100), row("l40s", desired=4, pool=world.l40s)]
    spent = ("gpuHours", "cost", "idleCost")

    async def status_settled() -> bool:
        rows = (await world.status()).get("variants") or []
        return ([{k: v for k, v in r.items() if k not in spent} for r in rows] == want
                and all(r.get("gpuHours", 0) > 0 for r in rows))
    await until(status_settled, what="status.variants: every replica ready, GPU time accrued")
    status = await world.status()
    # Each variant's cost so far at its own pool's price (2.0 and 1.0 per GPU-hour). Status
    # rounds both to 6 decimals, so they agree to half a unit of each rounding: the cost's,
    # and the GPU-hours' times the price.
    for item, price in zip(status["variants"], (2.0, 1.0), strict=True):
        rounding = 0.5e-6 * (1 + price) + 1e-12
        assert item["cost"] == pytest.approx(price * item["gpuHours"], rel=0, abs=rounding)
        assert 0 <= item["idleCost"] <= item["cost"]
    # The model-level counts stay in yardstick replicas: 2 x 3 + 4 x 1 = 10.
    assert (status["currentReplicas"], status["desiredReplicas"]) == (10, 10)
    scaled = await world.condition(crd.ConditionType.VARIANTS_SCALED)
    assert (scaled["status"], scaled["reason"]) == ("True", "ScaledByScaler")

    found = await metrics(world)
    for name, count in (("h100", 2), ("l40s", 4)):
        for family in ("desired", "current", "ready"):
            assert found[(f"scaler_variant_{family}_replicas", name)] == count
        assert found[("scaler_variant_starting_replicas", name)] == 0
        assert found[("scaler_variant_hpa_owned", name)] == 0

    out = await explain(world, capsys)
    assert f"  - h100 (chat-h100, pool {world.h100}): 2 desired, 2 asked for, 2 ready, " \
           "0 starting; since start " in out
    assert f"  - l40s (chat-l40s, pool {world.l40s}): 4 desired, 4 asked for, 4 ready" in out
    assert "Note: variant h100: 2, l40s: 4; cheapest mix meeting the demand of 100" in out

    # Nodes per variant's pool, from its own count and GPUs: 2 H100 replicas of 2 GPUs fill
    # one 4-GPU node of pool h100; 4 L40S of 1 GPU one node of pool l40s (the model's 10
    # yardstick replicas of 1 GPU would have asked 3 nodes of pool h100 alone).
    def planned() -> dict[str, int]:
        return {p.plan.pool: p.plan.nodes_for_replicas for p in world.service.state.pools()}
    await eventually(lambda: planned() == {world.h100: 1, world.l40s: 1},
                     what="both pools planned from their variant")
    plans = {p.plan.pool: p.plan for p in world.service.state.pools()}
    # warmNodes 1 (the policy's nodePool, on both pools): pool h100 has room for it (2
    # nodes), pool l40s (1 node) not.
    assert (plans[world.h100].nodes_wanted, plans[world.h100].headroom_nodes) == (2, 1)
    assert (plans[world.l40s].nodes_wanted, plans[world.l40s].headroom_nodes) == (1, 0)
    assert "capped by maxNodes 1" in plans[world.l40s].reasons

    async def placeholder() -> bool:
        deployment = await world.kube.api.get(
            f"{world.kube.collection('apps/v1', 'deployments')}/scaler-placeholder-{world.h100}")
        return int(deployment["spec"]["replicas"]) == 1
    await until(placeholder, what=f"one placeholder node of pool {world.h100}")


async def test_a_variant_an_hpa_scales_is_left_to_it_said_so_and_counted(
        start_world: Start, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    world = await start_world(h100_replicas=3, l40s_replicas=4, hpa=True)
    await until(lambda: _ready(world, 3, 4), what="every replica ready")
    # 45 in flight: a demand of 50. Free to mix, the cheapest cover of what is held would
    # be 1 H100 + 2 L40S (6.0/h). The HPA holds its 3 H100, which serve 90 alone: the
    # scaler leaves them, counts them, and needs no L40S at all.
    await publish(nats_url, world, 45.0)
    await until(holds(world, 3, 0), what="l40s 0, the HPA's h100 untouched")
    if world.kube.emulator is not None:
        patched = [r.path for r in world.kube.emulator.requests
                   if r.method == "PATCH" and r.path.endswith(f"/{H100}/scale")]
        assert patched == []

    owner = f"HorizontalPodAutoscaler/{HPA}"

    await until(scaled(world, "False"), what="VariantsScaled False")
    condition = await world.condition(crd.ConditionType.VARIANTS_SCALED)
    assert condition["reason"] == "OwnedByHPA"
    assert condition["message"].startswith(f"variant h100 (chat-h100) is scaled by {owner}: "
                                           "not patched, its 3 ready and starting replicas "
                                           "count in the mix")

    async def rows_settled() -> bool:
        rows = {row["name"]: row for row in (await world.status()).get("variants") or []}
        return bool(rows.get("l40s", {}).get("desiredReplicas") == 0)
    await until(rows_settled, what="status.variants: l40s desired 0")
    rows = {row["name"]: row for row in (await world.status())["variants"]}
    assert rows["h100"]["scaledBy"] == owner and "scaledBy" not in rows["l40s"]
    assert (rows["h100"]["desiredReplicas"], rows["h100"]["currentReplicas"]) == (3, 3)

    events = (await world.kube.api.get(world.kube.collection("v1", "events")))["items"]
    mine = [e for e in events if (e.get("source") or {}).get("component") == "scaler"]
    on_policy = [e for e in mine if e["involvedObject"]["kind"] == "ScalePolicy"
                 and e["reason"] == "OwnedByHPA"]
    assert on_policy and on_policy[0]["type"] == "Warning"
    assert owner in on_policy[0]["message"] and "variant h100" in on_policy[0]["message"]
    skipped = [e for e in mine if e["involvedObject"]["name"] == H100
               and e["reason"] == "ScalerSkipped"]
    assert len(skipped) == 1 and "counts its replicas in the mix" in skipped[0]["message"]

    assert (await metrics(world))[("scaler_variant_hpa_owned", "h100")] == 1
    out = await explain(world, capsys)
    assert f"Warning: variant h100 (chat-h100) is scaled by {owner}: the scaler does not " \
           "patch it" in out
    assert f"h100 is scaled by {owner}: not patched, its 3 held counted" in out

    # The team removes its HPA: the variant is mixed again, and 2 of the 3 H100 serve the
    # 50 (the cheapest cover of what is held; nothing cold is started).
    await world.kube.api.request(
        "DELETE", f"{world.kube.collection('autoscaling/v2', 'horizontalpodautoscalers')}/{HPA}")
    await until(holds(world, 2, 0), what="h100 2 once the HPA is gone")

    await until(scaled(world, "True"), what="VariantsScaled True again")


def scaled(world: World, status: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool((await world.condition(crd.ConditionType.VARIANTS_SCALED)).get(
            "status") == status)
    return check


async def _ready(world: World, h100: int, l40s: int) -> bool:
    found = []
    for name in (H100, L40S):
        deployment = await world.kube.api.get(
            f"{world.kube.collection('apps/v1', 'deployments')}/{name}")
        found.append(int((deployment.get("status") or {}).get("readyReplicas") or 0))
    return found == [h100, l40s]
