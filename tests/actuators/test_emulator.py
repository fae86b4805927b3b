"""The emulator speaks the wire protocol kubernetes_asyncio expects, unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client, watch

from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.emulator import EmulatorOptions, Fault, KubeEmulator
from scaler.emulator.env import ManualClock

pytestmark = [pytest.mark.kube, pytest.mark.emulator_only]


@pytest.fixture
async def emulator(wall_clock: ManualClock) -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator(clock=wall_clock, options=EmulatorOptions(
            bookmark_interval_s=0.05, history=20)) as emu:
        emu.ensure_namespace("ns")
        yield emu


@pytest.fixture
async def api_client(emulator: KubeEmulator) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api:
        yield api


def deployment(name: str, replicas: int = 1) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "i"}]}}}}


async def test_typed_client_crud_scale_and_conflicts(api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(api_client)
    created = await apps.create_namespaced_deployment("ns", deployment("web"))
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.metadata.creation_timestamp.timestamp() == 1_764_400_000

    scale = await apps.read_namespaced_deployment_scale("web", "ns")
    assert (scale.spec.replicas, scale.status.selector) == (1, "app=web")
    # kubernetes_asyncio sends a dict body as a strategic merge patch.
    patched = await apps.patch_namespaced_deployment_scale("web", "ns", {"spec": {"replicas": 4}})
    assert patched.spec.replicas == 4
    assert int(patched.metadata.resource_version) > int(scale.metadata.resource_version)

    # A stale resourceVersion is a 409 Conflict with a Status body, on /scale and on PUT.
    with pytest.raises(client.ApiException) as stale:
        await apps.patch_namespaced_deployment_scale(
            "web", "ns", {"metadata": {"resourceVersion": scale.metadata.resource_version},
                          "spec": {"replicas": 5}},
            _content_type="application/merge-patch+json")
    status = json.loads(stale.value.body)
    assert (stale.value.status, status["kind"], status["reason"]) == (409, "Status", "Conflict")
    created.spec.replicas = 9
    with pytest.raises(client.ApiException) as put_stale:
        await apps.replace_namespaced_deployment("web", "ns", created)
    assert put_stale.value.status == 409
    with pytest.raises(client.ApiException) as exists:
        await apps.create_namespaced_deployment("ns", deployment("web"))
    assert json.loads(exists.value.body)["reason"] == "AlreadyExists"

    # JSON patch; spec change bumps generation; status is its own subresource.
    current = await apps.patch_namespaced_deployment(
        "web", "ns", [{"op": "replace", "path": "/spec/replicas", "value": 2}])
    assert (current.spec.replicas, current.metadata.generation) == (2, 3)
    await apps.patch_namespaced_deployment_status(
        "web", "ns", {"status": {"readyReplicas": 2}},
        _content_type="application/merge-patch+json")
    ignored = await apps.patch_namespaced_deployment(
        "web", "ns", {"status": {"readyReplicas": 7}}, _content_type="application/merge-patch+json")
    assert ignored.status.ready_replicas == 2
    with pytest.raises(client.ApiException) as missing:
        await apps.read_namespaced_deployment("nope", "ns")
    assert missing.value.status == 404


async def test_custom_resources_reject_strategic_merge(api_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets",
        {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
         "metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    scale = await custom.patch_namespaced_custom_object_scale(
        "leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets", "lws",
        {"spec": {"replicas": 3}}, _content_type="application/merge-patch+json")
    assert scale["spec"]["replicas"] == 3
    # Without a content type the generated client sends a dict as a JSON patch, which the
    # API server rejects: why the actuators always name merge patch.
    with pytest.raises(client.ApiException) as wrong:
        await custom.patch_namespaced_custom_object_scale(
            "leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets", "lws",
            {"spec": {"replicas": 3}})
    assert wrong.value.status == 400  # not a list of operations: undecodable
    with pytest.raises(client.ApiException) as unsupported:
        await custom.patch_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets", "lws",
            {"spec": {"replicas": 3}}, _content_type="application/strategic-merge-patch+json")
    assert unsupported.value.status == 415


async def test_selectors_on_lists(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    for name, app, node in (("a", "web", "n1"), ("b", "web", ""), ("c", "db", "n1")):
        await core.create_namespaced_pod("ns", {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node or None, "containers": [{"name": "c", "image": "i"}]}})
    web = await core.list_namespaced_pod("ns", label_selector="app=web")
    assert sorted(p.metadata.name for p in web.items) == ["a", "b"]
    on_n1 = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert sorted(p.metadata.name for p in on_n1.items) == ["a", "c"]
    pending = await core.list_namespaced_pod("ns", label_selector="app in (web)",
                                             field_selector="spec.nodeName=")
    assert [p.metadata.name for p in pending.items] == ["b"]


async def test_watch_replays_from_version_with_bookmarks(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    listing = await core.list_namespaced_pod("ns")
    await core.create_namespaced_pod("ns", {"metadata": {"name": "p1"}, "spec": {
        "containers": [{"name": "c", "image": "i"}]}})
    seen: list[tuple[str, str]] = []
    async with watch.Watch() as stream:
        async for event in stream.stream(
                core.list_namespaced_pod, "ns", resource_version=listing.metadata.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=5):
            kind = event["type"]
            name = event["raw_object"]["metadata"].get("name")
            seen.append((kind, name))
            if kind == "ADDED" and name == "p1":
                await core.delete_namespaced_pod("p1", "ns")
            if kind == "BOOKMARK":
                break
    assert seen == [("ADDED", "p1"), ("DELETED", "p1"), ("BOOKMARK", None)]


async def test_watch_from_compacted_version_is_410(emulator: KubeEmulator,
                                                   api_client: client.ApiClient) -> None:
    api = kube.KubeApi(api_client, timeout_s=2)
    listing = await api.get("/api/v1/namespaces/ns/pods")
    for i in range(30):  # history keeps 20 writes
        await api.request("POST", "/api/v1/namespaces/ns/pods",
                          body={"metadata": {"name": f"p{i}"}, "spec": {}})
    events = [e async for e in api.watch(
        "/api/v1/namespaces/ns/pods",
        query={"resourceVersion": listing["metadata"]["resourceVersion"],
               "timeoutSeconds": "1"})]
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]


async def test_faults_are_injected_in_order(emulator: KubeEmulator,
                                            api_client: client.ApiClient) -> None:
    api = kube.KubeApi(api_client, timeout_s=2,
                       retry=kube_settings.RetrySettings(max_attempts=1))
    emulator.inject(Fault(verb="list", path="/pods$", status=429, retry_after=3))
    emulator.inject(Fault(verb="list", path="/pods$", status=500, times=1))
    with pytest.raises(kube.KubeError) as throttled:
        await api.get("/api/v1/namespaces/ns/pods")
    assert (throttled.value.status, throttled.value.retry_after) == (429, 3.0)
    with pytest.raises(kube.KubeError) as broken:
        await api.get("/api/v1/namespaces/ns/pods")
    assert broken.value.status == 500 and broken.value.transient
    assert (await api.get("/api/v1/namespaces/ns/pods"))["items"] == []

    emulator.inject(Fault(verb="watch", path="/pods$", drop_watch=True))
    with pytest.raises(kube.KubeError) as dropped:
        async with asyncio.timeout(5):
            async for _ in api.watch("/api/v1/namespaces/ns/pods", query={"timeoutSeconds": "5"}):
                pass
    assert dropped.value.status == 0
