"""The cluster reader: replicas, pod timelines -> cold-start observations, pool capacity."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from scaler.actuators import cluster_reader, selectors
from scaler.emulator import ControllerSettings, EmulatorController, Fault
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.engine import types
from scaler.policy import model

from .factories import make_policy

pytestmark = pytest.mark.kube

EVERYTHING = selectors.Selector()


@pytest.fixture
async def reader(kube: KubeTestEnv, wall_clock: ManualClock
                 ) -> AsyncIterator[cluster_reader.KubeClusterReader]:
    settings = kube.settings.model_copy(update={"watch_namespaces": (kube.namespace,)})
    cluster = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                               wall_clock=wall_clock)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


async def until(check: Callable[[], bool]) -> None:
    """Wait for the watch to deliver (bounded: the test fails rather than hangs)."""
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.01)


def node(name: str, *, gpus: int, ready: bool = True, cordoned: bool = False,
         pool: str = "h100") -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"pool": pool}},
        "spec": {"unschedulable": cordoned},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": "2025-11-29T00:00:00Z"}]},
    }


async def test_reads_current_replicas_from_scale(kube: KubeTestEnv,
                                                 reader: cluster_reader.KubeClusterReader) -> None:
    await kube.create_deployment("llama", replicas=3)
    cluster = await reader.read(make_policy(kube.namespace, "llama"))
    assert cluster.current == 3
    assert cluster.free_replica_slots is None  # no node pool in the policy


@pytest.mark.emulator_only
async def test_pod_timelines_become_cold_start_observations(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader, wall_clock: ManualClock,
) -> None:
    """Scheduled after 5 s, containers started 60 s later, Ready 20 s after: 85 s."""
    assert kube.emulator is not None
    controller = EmulatorController(kube.emulator, ControllerSettings(
        schedule_delay_s=5, start_delay_s=60, ready_delay_s=20))
    await kube.create_deployment("llama", replicas=2)
    policy = make_policy(kube.namespace, "llama")
    created = wall_clock.now

    controller.reconcile()
    await until(lambda: len(reader.pods[kube.namespace].objects) == 2)
    cluster = await reader.read(policy)
    assert (cluster.current, cluster.ready) == (2, 0)
    assert cluster.starting == (created, created)
    assert cluster.observations == ()

    for step in (5, 60, 20):
        wall_clock.advance(step)
        controller.reconcile()
    await until(lambda: len(reader.observations(kube.namespace, EVERYTHING)) == 2)

    cluster = await reader.read(policy)
    assert (cluster.ready, cluster.starting) == (2, ())
    assert cluster.observations == (
        types.ColdStartObservation(created_at=created, ready_at=created + 85, node_boot_s=0),
    ) * 2
    assert cluster.observations[0].pod_start_s == 85

    # Scaling in removes a pod: no longer ready capacity, but what it taught stays.
    await kube.api.merge_patch(f"{kube.collection('apps/v1', 'deployments')}/llama/scale",
                               {"spec": {"replicas": 1}})
    controller.reconcile()
    await until(lambda: len(reader.pods[kube.namespace].objects) == 1)
    cluster = await reader.read(policy)
    assert (cluster.current, cluster.ready, len(cluster.observations)) == (1, 1, 2)


@pytest.mark.emulator_only
async def test_the_pods_grace_period_is_read_for_the_cut_warning(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader) -> None:
    """The shortest terminationGracePeriodSeconds of the target's live pods: the API
    server's default 30 s, or what the template sets (`spare.cut_warning` reads it)."""
    assert kube.emulator is not None
    controller = EmulatorController(kube.emulator, ControllerSettings())
    deployments = kube.collection("apps/v1", "deployments")
    await kube.create_deployment("chat", replicas=1)
    await kube.create_deployment("reasoner", replicas=2)
    await kube.api.merge_patch(f"{deployments}/reasoner", {
        "spec": {"template": {"spec": {"terminationGracePeriodSeconds": 600}}}})
    no_pods = await reader.read(make_policy(kube.namespace, "chat"))
    assert no_pods.grace_period_s is None  # no pod yet: unknown

    controller.reconcile()
    await until(lambda: len(reader.pods[kube.namespace].objects) == 3)
    assert (await reader.read(make_policy(kube.namespace, "chat"))).grace_period_s == 30.0
    assert (await reader.read(make_policy(kube.namespace, "reasoner"))).grace_period_s == 600.0


@pytest.mark.emulator_only
async def test_wait_for_a_new_node_counts_as_node_boot(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader, wall_clock: ManualClock,
) -> None:
    assert kube.emulator is not None
    nodes = kube.emulator.resource("", "nodes")
    kube.emulator.store.create(nodes, None, node("full", gpus=0))
    controller = EmulatorController(kube.emulator, ControllerSettings(
        start_delay_s=30, ready_delay_s=10))
    await kube.create_deployment("big", replicas=1, gpus=8)
    created = wall_clock.now
    controller.reconcile()  # no node has 8 free GPUs: Pending, Unschedulable

    wall_clock.advance(240)  # the node autoscaler boots a node in 4 min
    kube.emulator.store.create(nodes, None, node("fresh", gpus=8))
    controller.reconcile()  # scheduled at +240
    wall_clock.advance(30)
    controller.reconcile()
    wall_clock.advance(10)
    controller.reconcile()  # Ready at +280

    await until(lambda: "/fresh" in reader.nodes.objects)
    await until(lambda: bool(reader.observations(kube.namespace, EVERYTHING)))
    [observation] = reader.observations(kube.namespace, EVERYTHING)
    assert observation == types.ColdStartObservation(created, created + 280, node_boot_s=240)
    assert observation.pod_start_s == 40


@pytest.mark.emulator_only
async def test_unhealthy_nodes_are_not_capacity(kube: KubeTestEnv,
                                                reader: cluster_reader.KubeClusterReader) -> None:
    assert kube.emulator is not None
    nodes = kube.emulator.resource("", "nodes")
    store = kube.emulator.store
    store.create(nodes, None, node("good", gpus=8))
    store.create(nodes, None, node("not-ready", gpus=8, ready=False))
    store.create(nodes, None, node("cordoned", gpus=8, cordoned=True))
    store.create(nodes, None, node("other-pool", gpus=8, pool="a100"))
    # A 4-GPU replica already runs on the good node.
    controller = EmulatorController(kube.emulator, ControllerSettings())
    await kube.create_deployment("llama", replicas=1, gpus=4)
    controller.reconcile()
    await until(lambda: any((p.get("spec") or {}).get("nodeName") == "good"
                            for p in reader.pods[kube.namespace].objects.values()))
    await until(lambda: len(reader.nodes.objects) == 4)
    pool = model.NodePool(name="h100", gpus_per_node=8, node_selector={"pool": "h100"})

    capacity = reader.pool_capacity(pool, resource_name="nvidia.com/gpu", gpus_per_replica=4)

    assert (capacity.nodes, capacity.healthy_nodes) == (3, 1)
    assert capacity.unhealthy == ("cordoned", "not-ready")
    assert (capacity.allocatable_gpus, capacity.used_gpus, capacity.free_gpus) == (8, 4, 4)
    assert capacity.free_replica_slots == 1
    policy = make_policy(kube.namespace, "llama", node_pool=pool, gpus_per_replica=4)
    assert (await reader.read(policy)).free_replica_slots == 1


@pytest.mark.emulator_only
async def test_watch_survives_drops_and_relists_after_410(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader) -> None:
    assert kube.emulator is not None
    await until(lambda: reader.pods[kube.namespace].synced.is_set())
    pods = kube.emulator.resource("", "pods")
    store = kube.emulator.store
    path = f"^{cluster_reader.pods_path(kube.namespace)}$"
    kube.emulator.inject(Fault(verb="watch", path=path, drop_watch=True))
    kube.emulator.inject(Fault(verb="watch", path=path, status=410))
    # End the current stream so the informer hits both faults on its way back.
    store.close_watchers()
    for i in range(3):
        store.create(pods, kube.namespace, {"metadata": {"name": f"p{i}"}, "spec": {}})
    await until(lambda: reader.pods[kube.namespace].lists == 2)  # relisted after the 410
    await until(lambda: len(reader.pods[kube.namespace].objects) == 3)
    # the first, the dropped one, the one after the list
    assert reader.pods[kube.namespace].watches >= 3
    store.delete(pods, kube.namespace, "p0")
    await until(lambda: len(reader.pods[kube.namespace].objects) == 2)


async def _pods_in_two_namespaces(kube: KubeTestEnv) -> str:
    """Pod `here` in the test's namespace, pod `there` in another; returns the other."""
    assert kube.emulator is not None
    other = "other-" + kube.namespace
    await kube.api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
    pods = kube.emulator.resource("", "pods")
    for namespace, name in ((kube.namespace, "here"), (other, "there")):
        kube.emulator.store.create(pods, namespace, {"metadata": {"name": name}, "spec": {}})
    return other


@pytest.mark.emulator_only
async def test_pods_are_watched_in_the_policies_namespaces_only(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    """Default settings: a namespace is watched from its first policy on, and no longer
    once no policy is there; nothing is ever listed cluster-wide."""
    other = await _pods_in_two_namespaces(kube)
    await kube.create_deployment("llama", replicas=1)
    reader = cluster_reader.KubeClusterReader(kube.api, settings=kube.settings,
                                              wall_clock=wall_clock)
    await reader.start()
    try:
        assert reader.pods == {}
        await reader.read(make_policy(kube.namespace, "llama"))  # its first policy: listed
        assert set(reader.pods) == {kube.namespace}
        assert list(reader.pods[kube.namespace].objects) == [f"{kube.namespace}/here"]

        await reader.update([make_policy(other, "llama")])
        assert set(reader.pods) == {other}
        await until(lambda: reader.pods[other].synced.is_set())
        assert list(reader.pods[other].objects) == [f"{other}/there"]
    finally:
        await reader.stop()
    assert kube.emulator is not None
    paths = {r.path for r in kube.emulator.requests if r.verb in ("list", "watch")}
    assert "/api/v1/pods" not in paths
    assert {cluster_reader.pods_path(kube.namespace), cluster_reader.pods_path(other)} <= paths


async def test_a_policy_outside_the_watched_namespaces_is_refused(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader) -> None:
    with pytest.raises(cluster_reader.NamespaceNotWatched, match="not in kube.watch_namespaces"):
        await reader.read(make_policy("kube-system", "coredns"))
    assert set(reader.pods) == {kube.namespace}


@pytest.mark.emulator_only
async def test_cluster_wide_is_one_watch_over_every_namespace(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    other = await _pods_in_two_namespaces(kube)
    settings = kube.settings.model_copy(update={"cluster_wide": True})
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                              wall_clock=wall_clock)
    await reader.start()
    try:
        await kube.create_deployment("llama", replicas=1)
        await reader.read(make_policy(kube.namespace, "llama"))
        await reader.update([])  # fixed by the settings: changes nothing
        assert set(reader.pods) == {cluster_reader.ALL_NAMESPACES}
        assert set(reader.pods[""].objects) >= {f"{kube.namespace}/here", f"{other}/there"}
    finally:
        await reader.stop()


@pytest.mark.emulator_only
async def test_a_forbidden_pod_list_is_named_when_read_gives_up(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    kube.emulator.inject(Fault(verb="list", path=f"^{cluster_reader.pods_path(kube.namespace)}$",
                               status=403, times=1000))
    settings = kube.settings.model_copy(update={
        "watch_namespaces": (kube.namespace,), "request_timeout_s": 0.5})
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                              wall_clock=wall_clock)
    await reader.start()
    try:
        await kube.create_deployment("llama", replicas=1)
        await until(lambda: reader.pods[kube.namespace].last_error is not None)
        with pytest.raises(cluster_reader.NotSynced, match="403"):
            await reader.read(make_policy(kube.namespace, "llama"))
    finally:
        await reader.stop()
