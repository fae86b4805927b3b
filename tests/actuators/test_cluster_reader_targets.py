"""The cluster reader's targets: Deployments and StatefulSets from watched informers (no
request per read), custom resources through GET /scale, absent targets as a 404."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from scaler.actuators import client, cluster_reader, replicas, resources, watch
from scaler.emulator import Fault
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.policy import model

from .factories import make_policy
from .test_cluster_reader import until
from .test_deletion_cost import RecordingApi, recording

pytestmark = pytest.mark.kube

KINDS = ("Deployment", "StatefulSet")
PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}


async def create_workload(kube: KubeTestEnv, kind: str, name: str, *, replicas: int,
                          selector: client.Obj | None = None) -> client.Obj:
    """A Deployment or StatefulSet of pause containers labelled app=<name>, tier=gpu,
    valid for a real API server too (a StatefulSet's pods are then really created)."""
    labels = {"app": name, "tier": "gpu"}
    # Older API servers require a StatefulSet's serviceName (the headless Service need not
    # exist for the object to be valid).
    service = {"serviceName": name} if kind == "StatefulSet" else {}
    return await kube.create("apps/v1", PLURALS[kind], {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            **service,
            "replicas": replicas,
            "selector": selector or {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main",
                                         "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    })


def target(kube: KubeTestEnv, kind: str, name: str) -> tuple[model.ScalePolicy,
                                                               resources.ObjectRef]:
    policy = make_policy(kube.namespace, name, kind=kind)
    return policy, resources.target_ref(policy)


def reader_on(kube: KubeTestEnv, api: client.KubeApi, wall_clock: ManualClock, *,
              cluster_wide: bool = False) -> cluster_reader.KubeClusterReader:
    settings = kube.settings.model_copy(update={
        "watch_namespaces": () if cluster_wide else (kube.namespace,),
        "cluster_wide": cluster_wide})
    return cluster_reader.KubeClusterReader(api, settings=settings, wall_clock=wall_clock)


@pytest.fixture
def api(kube: KubeTestEnv) -> RecordingApi:
    return recording(kube)


@pytest.fixture
async def reader(kube: KubeTestEnv, api: RecordingApi, wall_clock: ManualClock
                 ) -> AsyncIterator[cluster_reader.KubeClusterReader]:
    cluster = reader_on(kube, api, wall_clock)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


def gets_of_reads(api: RecordingApi, reader: cluster_reader.KubeClusterReader,
                  since: int) -> list[str]:
    """The GETs made since call `since`, other than the lists of the reader's informers."""
    listed = {i.path for i in (reader.nodes, *reader.pods.values(),
                               *reader.workloads.values())}
    return [path for method, path in api.calls[since:]
            if method == "GET" and path not in listed]


@pytest.mark.parametrize("kind", KINDS)
async def test_someone_elses_replicas_change_is_read_after_its_watch_event(
        kube: KubeTestEnv, api: RecordingApi, reader: cluster_reader.KubeClusterReader,
        kind: str) -> None:
    await create_workload(kube, kind, "llama", replicas=2)
    policy, ref = target(kube, kind, "llama")
    assert (await reader.read(policy)).current == 2
    informer = reader.workload_informer(ref)
    assert informer is not None and informer.synced.is_set()

    await kube.api.merge_patch(ref.scale_path, {"spec": {"replicas": 5}})  # another writer
    key = f"{ref.namespace}/{ref.name}"
    await until(lambda: replicas.spec_replicas(informer.objects[key]) == 5)
    before = len(api.calls)
    assert (await reader.read(policy)).current == 5
    assert gets_of_reads(api, reader, before) == []  # synced: no request per read


@pytest.mark.parametrize("kind", KINDS)
async def test_the_target_watch_keeps_only_what_a_read_needs(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader, kind: str) -> None:
    """Every target is held for the life of the process: its replicas, selector and
    version, not its template, conditions and managed fields (as served: 15.8 KiB in
    memory a Deployment after a scale write; kept: 1.4 KiB)."""
    await create_workload(kube, kind, "llama", replicas=2)
    policy, ref = target(kube, kind, "llama")
    await kube.api.merge_patch(ref.scale_path, {"spec": {"replicas": 3}})
    served = await kube.api.get(ref.path)
    assert (await reader.read(policy)).current == 3
    informer = reader.workload_informer(ref)
    assert informer is not None
    key = f"{ref.namespace}/{ref.name}"
    await until(lambda: replicas.spec_replicas(informer.objects[key]) == 3)
    held = informer.objects[key]
    # status.replicas is the controller's to write, at its own pace (here and in a real
    # cluster): its value races the read, what is kept of it does not.
    assert held == {
        "metadata": {"name": "llama", "namespace": kube.namespace,
                     "resourceVersion": held["metadata"]["resourceVersion"]},
        "spec": {"replicas": 3, "selector": served["spec"]["selector"]},
        "status": {"replicas": held["status"]["replicas"]}}
    assert held["status"]["replicas"] in (None, 2, 3)


async def test_an_informer_keeps_no_managed_fields(kube: KubeTestEnv) -> None:
    """A real API server records an entry per field manager on every object (the emulator
    too); no reader here uses them, so no informer keeps them: a pod, node or policy copy
    is the object without `metadata.managedFields`, otherwise as served."""
    await create_workload(kube, "Deployment", "llama", replicas=1)
    path = kube.collection("apps/v1", "deployments")
    await kube.api.merge_patch(f"{path}/llama/scale", {"spec": {"replicas": 2}})
    served = await kube.api.get(f"{path}/llama")
    assert served["metadata"]["managedFields"]
    informer = watch.Informer(kube.api, path=path, settings=kube.settings)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), timeout=10)
        held = informer.objects[f"{kube.namespace}/llama"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "managedFields" not in held["metadata"]
    if held["metadata"]["resourceVersion"] == served["metadata"]["resourceVersion"]:
        # A list's items carry no apiVersion and kind (the list does), as a GET's object does.
        listed = {k: v for k, v in served.items() if k not in ("apiVersion", "kind")}
        without = {k: v for k, v in served["metadata"].items() if k != "managedFields"}
        assert held == {**listed, "metadata": without}


@pytest.mark.parametrize("kind", KINDS)
async def test_an_absent_or_deleted_target_is_a_404_as_before(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader, kind: str) -> None:
    """Not 0 replicas: the read fails as the GET of /scale did, so nothing is decided."""
    policy, ref = target(kube, kind, "gone")
    with pytest.raises(client.KubeError) as absent:
        await reader.read(policy)
    assert absent.value.not_found

    await create_workload(kube, kind, "gone", replicas=1)
    assert (await reader.read(policy)).current == 1
    await kube.api.request("DELETE", ref.path)
    informer = reader.workload_informer(ref)
    assert informer is not None
    await until(lambda: f"{ref.namespace}/{ref.name}" not in informer.objects)
    with pytest.raises(client.KubeError) as deleted:
        await reader.read(policy)
    assert deleted.value.not_found


async def test_a_target_created_after_the_list_is_read_before_its_event(
        kube: KubeTestEnv, api: RecordingApi, reader: cluster_reader.KubeClusterReader) -> None:
    """A target the informer does not hold yet is read with one GET of /scale."""
    await create_workload(kube, "Deployment", "first", replicas=1)
    await reader.read(target(kube, "Deployment", "first")[0])
    informer = reader.workload_informer(target(kube, "Deployment", "first")[1])
    assert informer is not None
    before = len(api.calls)
    await create_workload(kube, "Deployment", "fresh", replicas=4)
    policy, ref = target(kube, "Deployment", "fresh")
    held = f"{ref.namespace}/{ref.name}" in informer.objects
    assert (await reader.read(policy)).current == 4
    assert gets_of_reads(api, reader, before) == ([] if held else [ref.scale_path])


def pod(name: str, labels: dict[str, str], *, ready: bool, created: str) -> client.Obj:
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": created},
        "spec": {"containers": [{"name": "main", "image": "i"}], "nodeName": "n1"},
        "status": {"phase": "Running" if ready else "Pending", "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "lastTransitionTime": created}]},
    }


@pytest.mark.emulator_only
@pytest.mark.parametrize("kind", KINDS)
async def test_the_cluster_state_is_the_one_a_get_of_scale_gives(
        kube: KubeTestEnv, api: RecordingApi, wall_clock: ManualClock, kind: str) -> None:
    """Same current, ready, starting and selected pods as through /scale (the path a
    reader takes when the kind's list is refused, as with RBAC of an older release)."""
    assert kube.emulator is not None
    selector = {"matchLabels": {"app": "llama"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]},
                                     {"key": "canary", "operator": "DoesNotExist"}]}
    await create_workload(kube, kind, "llama", replicas=3, selector=selector)
    pods = kube.emulator.resource("", "pods")
    mine = {"app": "llama", "tier": "gpu"}
    for name, labels, ready in (("ready", mine, True), ("starting", mine, False),
                                ("canary", {**mine, "canary": "1"}, True),
                                ("other", {"app": "other", "tier": "gpu"}, True)):
        kube.emulator.store.create(pods, kube.namespace, pod(
            name, labels, ready=ready, created="2025-11-29T00:00:00Z"))
    policy, ref = target(kube, kind, "llama")

    states, selected = [], []
    for refused in (False, True):
        cluster = reader_on(kube, api, wall_clock)
        if refused:
            kube.emulator.inject(Fault(
                verb="list", status=403, times=1000,
                path=f"^{cluster_reader.workloads_path(ref.plural, kube.namespace)}$"))
        await cluster.start()
        try:
            informer = cluster.workload_informer(ref)
            assert informer is not None
            await until(lambda: informer.synced.is_set() or informer.last_error is not None)  # noqa: B023
            await until(lambda: len(cluster.pods[kube.namespace].objects) == 4)  # noqa: B023
            before = len(api.calls)
            states.append(await cluster.read(policy))
            selected.append(cluster.pod_names(policy))
            assert gets_of_reads(api, cluster, before) == ([ref.scale_path] if refused else [])
        finally:
            await cluster.stop()
    informed, scaled = states
    assert informed == scaled
    assert (informed.current, informed.ready, len(informed.starting)) == (3, 1, 1)
    assert selected == [frozenset({"ready", "starting"})] * 2


@pytest.mark.emulator_only
async def test_a_custom_resource_target_is_read_through_its_scale(
        kube: KubeTestEnv, api: RecordingApi, reader: cluster_reader.KubeClusterReader) -> None:
    await kube.create("leaderworkerset.x-k8s.io/v1", "leaderworkersets", {
        "metadata": {"name": "lws"}, "spec": {"replicas": 2}})
    policy = make_policy(kube.namespace, "lws", kind="LeaderWorkerSet",
                         api_version="leaderworkerset.x-k8s.io/v1")
    ref = resources.target_ref(policy)
    assert reader.workload_informer(ref) is None
    for _ in range(2):
        before = len(api.calls)
        assert (await reader.read(policy)).current == 2
        assert gets_of_reads(api, reader, before) == [ref.scale_path]
    assert not any("leaderworkersets" in path and not path.endswith("/scale")
                   for _, path in api.calls)


@pytest.mark.emulator_only
async def test_targets_are_watched_where_pods_are(
        kube: KubeTestEnv, api: RecordingApi, wall_clock: ManualClock) -> None:
    """Cluster-wide: one watch of each kind over every namespace. Default settings: one in
    each policy namespace, stopped with its pods when no policy is left there."""
    await create_workload(kube, "Deployment", "llama", replicas=1)
    policy, _ = target(kube, "Deployment", "llama")
    wide = reader_on(kube, api, wall_clock, cluster_wide=True)
    await wide.start()
    try:
        assert (await wide.read(policy)).current == 1
        assert set(wide.workloads) == {("deployments", cluster_reader.ALL_NAMESPACES)}
    finally:
        await wide.stop()

    settings = kube.settings.model_copy(update={"watch_namespaces": ()})
    default = cluster_reader.KubeClusterReader(api, settings=settings, wall_clock=wall_clock)
    await default.start()
    try:
        assert (await default.read(policy)).current == 1
        assert set(default.workloads) == {("deployments", kube.namespace)}
        await default.update([make_policy("elsewhere", "llama")])
        assert default.workloads == {}
    finally:
        await default.stop()


@pytest.mark.emulator_only
async def test_the_target_watch_relists_after_410_and_resumes_after_a_drop(
        kube: KubeTestEnv, reader: cluster_reader.KubeClusterReader) -> None:
    """The emulator serves deployment watches as pod watches (bookmarks, 410 Gone)."""
    assert kube.emulator is not None
    await create_workload(kube, "Deployment", "llama", replicas=1)
    policy, ref = target(kube, "Deployment", "llama")
    await reader.read(policy)
    informer = reader.workload_informer(ref)
    assert informer is not None
    path = f"^{cluster_reader.workloads_path('deployments', kube.namespace)}$"
    kube.emulator.inject(Fault(verb="watch", path=path, drop_watch=True))
    kube.emulator.inject(Fault(verb="watch", path=path, status=410))
    kube.emulator.store.close_watchers()  # the informer meets both faults on its way back
    await kube.api.merge_patch(ref.scale_path, {"spec": {"replicas": 6}})
    await until(lambda: informer.lists == 2)
    await until(lambda: replicas.spec_replicas(informer.objects[f"{ref.namespace}/llama"]) == 6)
    assert (await reader.read(policy)).current == 6
