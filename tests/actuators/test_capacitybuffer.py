"""The capacitybuffer node-pool actuator: a CapacityBuffer sized from the engine's node plan."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scaler.actuators import base, capacitybuffer, client, nodepool, rbac, wiring
from scaler.actuators import settings as kube_settings
from scaler.core import vocabulary
from scaler.emulator import env as kube_env
from scaler.emulator import server as emulator_server
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.engine import nodes, types
from scaler.policy import model
from scaler.service import reactor
from scaler.signals import samples, store
from tests.service import factories as service_factories
from tests.service import fakes

from .factories import interleaved, write_status

pytestmark = pytest.mark.kube

POOL = model.NodePool(name="h100", gpus_per_node=8, node_selector={"pool": "h100"},
                      actuator="capacitybuffer")


def settings_for(namespace: str) -> kube_settings.KubeSettings:
    return kube_settings.KubeSettings(
        capacitybuffer=kube_settings.CapacityBufferSettings(enabled=True, namespace=namespace),
        placeholder=kube_settings.PlaceholderSettings(namespace=namespace))


def actuator_for(kube: KubeTestEnv, api: client.KubeApi | None = None, *,
                 dry_run: bool = False) -> capacitybuffer.CapacityBufferActuator:
    settings = settings_for(kube.namespace).model_copy(update={"dry_run": dry_run})
    return capacitybuffer.CapacityBufferActuator(api or kube.api, settings=settings,
                                                 leader=base.AlwaysLeader())


def engine_plan(*, replicas: int, forecast: int, pool: model.NodePool = POOL
                ) -> types.NodePlan:
    """The engine's plan for one TP8 model on the pool: `forecast - replicas` warm nodes."""
    return nodes.plan_pool(pool, resource_name="nvidia.com/gpu", demands=[types.PoolDemand(
        model="inference/llama-70b", gpus_per_replica=8, replicas=replicas,
        forecast_replicas=forecast)])


def buffer_path(kube: KubeTestEnv) -> str:
    return f"{kube.collection('autoscaling.x-k8s.io/v1alpha1', 'capacitybuffers')}/scaler-h100"


def template_path(kube: KubeTestEnv) -> str:
    return f"{kube.collection('v1', 'podtemplates')}/scaler-h100"


async def test_buffer_follows_the_engine_node_plan(kube: KubeTestEnv) -> None:
    """Warm nodes 0 -> 2 -> 1: nothing is created for 0; then one buffer chunk per warm
    node, each chunk a whole node's GPUs, so the autoscaler keeps exactly that many."""
    actuator = actuator_for(kube)
    plans = [engine_plan(replicas=2, forecast=2), engine_plan(replicas=2, forecast=4),
             engine_plan(replicas=2, forecast=3)]
    assert [p.headroom_nodes for p in plans] == [0, 2, 1]

    none = await actuator.apply(POOL, plans[0])
    listing = await kube.api.get(kube.collection("autoscaling.x-k8s.io/v1alpha1",
                                                 "capacitybuffers"))
    created = await actuator.apply(POOL, plans[1])
    two = await kube.api.get(buffer_path(kube))
    shrunk = await actuator.apply(POOL, plans[2])
    one = await kube.api.get(buffer_path(kube))

    assert none.outcome is base.Outcome.UNCHANGED and listing["items"] == []
    assert (created.outcome, created.previous, created.desired) == (base.Outcome.APPLIED, 0, 2)
    assert (shrunk.outcome, shrunk.previous, shrunk.desired) == (base.Outcome.APPLIED, 2, 1)
    assert two["spec"]["replicas"] == 2 and one["spec"]["replicas"] == 1
    assert one["spec"]["podTemplateRef"] == {"name": "scaler-h100"}
    assert one["spec"]["provisioningStrategy"] == "buffer.x-k8s.io/active-capacity"
    assert "scalableRef" not in one["spec"] and "percentage" not in one["spec"]
    template = (await kube.api.get(template_path(kube)))["template"]["spec"]
    container = template["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == str(plans[2].gpus_per_node)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(plans[2].gpus_per_node)
    assert "priorityClassName" not in template  # virtual pods: nothing to preempt
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}]


def _writes(kube: KubeTestEnv) -> int | None:
    """Writes the emulator has seen (a no-op write keeps the resourceVersion, so only the
    request log shows one); None on a real cluster, where generation tells instead."""
    if kube.emulator is None:
        return None
    return sum(1 for r in kube.emulator.requests if r.method in ("POST", "PATCH", "PUT"))


async def test_no_write_when_nothing_changed(kube: KubeTestEnv) -> None:
    actuator = actuator_for(kube)
    plan = engine_plan(replicas=1, forecast=3)
    assert (await actuator.apply(POOL, plan)).written
    generation = (await kube.api.get(buffer_path(kube)))["metadata"]["generation"]
    version = (await kube.api.get(template_path(kube)))["metadata"]["resourceVersion"]

    writes_before = _writes(kube)
    again = await actuator.apply(POOL, plan)

    assert (again.outcome, again.previous) == (base.Outcome.UNCHANGED, 2)
    assert _writes(kube) == writes_before
    # generation moves with spec writes only (a controller's status writes leave it).
    assert (await kube.api.get(buffer_path(kube)))["metadata"]["generation"] == generation
    assert (await kube.api.get(template_path(kube)))["metadata"]["resourceVersion"] == version


async def test_a_new_pool_shape_rewrites_the_template_not_the_replicas(kube: KubeTestEnv
                                                                      ) -> None:
    actuator = actuator_for(kube)
    plan = engine_plan(replicas=1, forecast=2)
    assert (await actuator.apply(POOL, plan)).written
    await kube.api.merge_patch(template_path(kube),
                               {"metadata": {"annotations": {"team/owner": "gpu"}}})
    generation = (await kube.api.get(buffer_path(kube)))["metadata"]["generation"]

    changed = await actuator.apply(POOL.model_copy(update={"node_selector": {}}), plan)

    stored = await kube.api.get(template_path(kube))
    assert changed.outcome is base.Outcome.APPLIED
    assert "affinity" not in stored["template"]["spec"]
    assert stored["metadata"]["annotations"]["team/owner"] == "gpu"
    assert (await kube.api.get(buffer_path(kube)))["metadata"]["generation"] == generation


async def test_dry_run_writes_nothing(kube: KubeTestEnv) -> None:
    outcome = await actuator_for(kube, dry_run=True).apply(
        POOL, engine_plan(replicas=1, forecast=3))
    assert (outcome.outcome, outcome.desired) == (base.Outcome.DRY_RUN, 2)
    for plural, version in (("capacitybuffers", "autoscaling.x-k8s.io/v1alpha1"),
                            ("podtemplates", "v1")):
        assert (await kube.api.get(kube.collection(version, plural)))["items"] == []


@pytest.mark.emulator_only  # the status write is the emulator's stand-in for CA's controller
async def test_status_writes_are_no_conflict_another_writer_is(kube: KubeTestEnv) -> None:
    path = buffer_path(kube)
    assert (await actuator_for(kube).apply(POOL, engine_plan(replicas=1, forecast=2))).written

    async def buffer_controller(read: client.Obj) -> None:
        await write_status(kube.api, path)

    async def other_writer(read: client.Obj) -> None:
        await kube.api.merge_patch(path, {"spec": {"replicas": 7}})

    grown = await actuator_for(kube, interleaved(
        kube.api, after_read_of=path, other_writer=buffer_controller)).apply(
        POOL, engine_plan(replicas=1, forecast=3))
    fought = await actuator_for(kube, interleaved(
        kube.api, after_read_of=path, other_writer=other_writer)).apply(
        POOL, engine_plan(replicas=1, forecast=4))

    assert (grown.outcome, grown.previous) == (base.Outcome.APPLIED, 1)
    assert (fought.outcome, fought.previous) == (base.Outcome.CONFLICT, 7)
    assert (await kube.api.get(path))["spec"]["replicas"] == 7


@pytest.fixture
async def no_crd(wall_clock: ManualClock) -> AsyncIterator[KubeTestEnv]:
    """An emulator whose cluster has no CapacityBuffer CRD (an older Cluster Autoscaler)."""
    types_without = tuple(t for t in emulator_server.DEFAULT_TYPES
                          if t.plural != capacitybuffer.PLURAL)
    options = emulator_server.EmulatorOptions(types=types_without, status_writer=True)
    async with kube_env.kube_test_env(kubeconfig=None, wall_clock=wall_clock,
                                      options=options) as env:
        yield env


def pooled(name: str, pool: str, actuator: str) -> model.ScalePolicy:
    return service_factories.policy(name, spec={
        "signals": {"concurrency": {"targetPerReplica": 10}},
        "replicas": {"min": 1, "max": 50},
        "resources": {"gpusPerReplica": 8},
        "nodePool": {"name": pool, "gpusPerNode": 8, "warmNodes": 1, "actuator": actuator},
        "forecast": {"enabled": False},
    })


@pytest.mark.emulator_only
async def test_a_missing_crd_is_reported_counted_and_other_pools_go_on(
        no_crd: KubeTestEnv, wall_clock: ManualClock) -> None:
    settings = settings_for(no_crd.namespace)
    buffered, placeheld = pooled("a", "buffered", "capacitybuffer"), pooled(
        "b", "placeheld", "placeholder")
    registry = service_factories.loaded_state(buffered, placeheld)
    signals = store.SignalStore()
    cluster = fakes.FakeCluster()
    loop_reactor = reactor.Reactor(
        state=registry, store=signals, reader=cluster, actuator=cluster,
        wall_clock=wall_clock, backstop_s=5.0, pool_actuators={
            "capacitybuffer": capacitybuffer.CapacityBufferActuator(
                no_crd.api, settings=settings, leader=base.AlwaysLeader()),
            "placeholder": nodepool.PlaceholderActuator(no_crd.api, settings=settings,
                                                        leader=base.AlwaysLeader())})
    remove = signals.add_listener(loop_reactor.notify)
    try:
        signals.put([samples.Sample(model=p.key, signal=vocabulary.Signal.IN_FLIGHT,
                                    source="p", ts=wall_clock.now, value=30.0)
                     for p in (buffered, placeheld)])
        loop_reactor.set_policies({p.key: p for p in (buffered, placeheld)})
        await loop_reactor.idle()
    finally:
        remove()
        await loop_reactor.drain(timeout_s=5.0)

    pools = {status.plan.pool: status for status in registry.pools()}
    assert pools["buffered"].outcome == "failed" and pools["buffered"].applies["failed"] >= 1
    assert "capacitybuffers.autoscaling.x-k8s.io" in pools["buffered"].reason
    assert "not installed" in pools["buffered"].reason
    assert pools["placeheld"].outcome == "applied"
    placeholder = await no_crd.api.get(
        f"{no_crd.collection('apps/v1', 'deployments')}/scaler-placeholder-placeheld")
    assert placeholder["spec"]["replicas"] == 1  # warmNodes 1


@pytest.mark.emulator_only
async def test_rbac_covers_exactly_the_requests_made(kube: KubeTestEnv) -> None:
    """Every request of a create, resize, template change and no-op is allowed by the
    `capacitybuffer` Role `scaler kube rbac` prints, and each of its grants is used."""
    assert kube.emulator is not None
    settings = settings_for(kube.namespace)
    actuator = actuator_for(kube)
    start = len(kube.emulator.requests)
    for plan, pool in ((engine_plan(replicas=1, forecast=3), POOL),
                       (engine_plan(replicas=1, forecast=2), POOL),
                       (engine_plan(replicas=1, forecast=2), POOL.model_copy(
                           update={"node_selector": {}})),
                       (engine_plan(replicas=1, forecast=2), POOL.model_copy(
                           update={"node_selector": {}}))):
        assert (await actuator.apply(pool, plan)).outcome in (base.Outcome.APPLIED,
                                                              base.Outcome.UNCHANGED)
    grants = rbac.plan(settings, name="scaler", namespace="scaler-system",
                       policy_namespaces=[kube.namespace])
    role = next(d for d in rbac.manifests(grants)
                if d["kind"] == "Role" and d["metadata"]["name"] == "scaler-capacitybuffer")
    assert role["metadata"]["namespace"] == kube.namespace
    granted = rbac.grants(rbac.manifests(grants), grants.subject)
    mine = {g for g in granted if (g[1], g[2]) in (("autoscaling.x-k8s.io", "capacitybuffers"),
                                                    ("", "podtemplates"))}
    used: set[rbac.Attributes] = set()
    for record in kube.emulator.requests[start:]:
        attributes = rbac.request_attributes(record.method, record.path)
        if attributes is None:  # discovery: every authenticated user may read it
            continue
        assert rbac.allowed(mine, attributes), f"not granted: {attributes}"
        used.add(attributes)
    assert {g for g in mine if not any(rbac.authorizes(g, u) for u in used)} == set()
    off = rbac.plan(kube_settings.KubeSettings(), name="scaler", namespace="scaler-system",
                    policy_namespaces=[kube.namespace])
    assert not any(d["metadata"]["name"] == "scaler-capacitybuffer"
                   for d in rbac.manifests(off))


async def test_wiring_builds_the_actuator_when_on(kube: KubeTestEnv,
                                                  wall_clock: ManualClock) -> None:
    off = await wiring.connect(kube.settings, identity="me", wall_clock=wall_clock)
    on = await wiring.connect(settings_for(kube.namespace).model_copy(
        update={"host": kube.settings.host, "kubeconfig": kube.settings.kubeconfig}),
        identity="me", wall_clock=wall_clock)
    try:
        assert "capacitybuffer" not in off.pools  # off by default: nothing is created
        assert isinstance(on.pools["capacitybuffer"], capacitybuffer.CapacityBufferActuator)
    finally:
        await off.close()
        await on.close()
