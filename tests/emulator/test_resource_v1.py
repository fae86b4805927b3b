"""resource.k8s.io/v1 (DRA, GA in Kubernetes 1.34): ResourceSlices, DeviceClasses, ResourceClaims.

As the real server serves them (kubernetes/kubernetes pkg/registry/resource/*/strategy.go,
k8s.io/api resource/v1 types.go): slices and classes are cluster-scoped, claims namespaced
with a status subresource; a slice starts at generation 1 and a spec change bumps it; slices
list by the `spec.nodeName` and `spec.driver` field selectors. Runs against a real cluster
with SCALER_TEST_KUBECONFIG (it creates and removes one class and one slice).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scaler.actuators import dra, watch
from scaler.emulator import env as kube_env

REAL_CLUSTER = os.environ.get("SCALER_TEST_KUBECONFIG")
DRIVER = "gpu.example.com"


@pytest.fixture
async def kube() -> AsyncIterator[kube_env.KubeTestEnv]:
    clock = kube_env.ManualClock(1_764_400_000.0)
    async with kube_env.kube_test_env(kubeconfig=REAL_CLUSTER, wall_clock=clock) as env:
        yield env


def new_slice(name: str, *, node: str, devices: int, generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}",
                                  "attributes": {"type": {"string": "gpu"},
                                                 "index": {"int": i}}}
                                 for i in range(devices)]}}


async def test_discovery_names_the_three_resources_and_their_scope(
        kube: kube_env.KubeTestEnv) -> None:
    groups = await kube.api.get("/apis")
    [group] = [g for g in groups["groups"] if g["name"] == "resource.k8s.io"]
    assert "resource.k8s.io/v1" in [v["groupVersion"] for v in group["versions"]]
    listing = await kube.api.get("/apis/resource.k8s.io/v1")
    scope = {r["name"]: r["namespaced"] for r in listing["resources"]}
    assert {"resourceslices": False, "deviceclasses": False, "resourceclaims": True,
            "resourceclaims/status": True}.items() <= scope.items()
    verbs = {r["name"]: set(r["verbs"]) for r in listing["resources"]}
    assert {"list", "watch", "get"} <= verbs["resourceslices"]


async def test_slices_are_cluster_scoped_versioned_and_selectable_by_node(
        kube: kube_env.KubeTestEnv) -> None:
    suffix = uuid.uuid4().hex[:8]
    names = [f"scaler-test-{suffix}-a", f"scaler-test-{suffix}-b"]
    try:
        created = await kube.api.request("POST", dra.SLICES_PATH, body=new_slice(
            names[0], node=f"node-{suffix}-a", devices=2))
        await kube.api.request("POST", dra.SLICES_PATH, body=new_slice(
            names[1], node=f"node-{suffix}-b", devices=1))
        assert "namespace" not in created["metadata"]
        assert created["metadata"]["generation"] == 1
        fewer = created["spec"]["devices"][:1]
        changed = {**created, "spec": {**created["spec"], "devices": fewer}}
        updated = await kube.api.request("PUT", f"{dra.SLICES_PATH}/{names[0]}", body=changed)
        assert updated["metadata"]["generation"] == 2
        same = await kube.api.request("PUT", f"{dra.SLICES_PATH}/{names[0]}", body=updated)
        assert same["metadata"]["generation"] == 2  # metadata-only: no spec change
        picked = await kube.api.get(f"{dra.SLICES_PATH}?fieldSelector=spec.nodeName%3Dnode-"
                                    f"{suffix}-b")
        assert [s["metadata"]["name"] for s in picked["items"]] == [names[1]]
        assert picked["kind"] == "ResourceSliceList"
    finally:
        for name in names:
            await kube.api.request("DELETE", f"{dra.SLICES_PATH}/{name}")


async def test_claims_are_namespaced_and_allocated_through_status(
        kube: kube_env.KubeTestEnv) -> None:
    claims = dra.claims_path(kube.namespace)
    class_name = f"scaler-test-{uuid.uuid4().hex[:8]}"
    await kube.api.request("POST", dra.CLASSES_PATH, body={
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    try:
        claim = await kube.api.request("POST", claims, body={
            "metadata": {"name": "llama-0-gpu"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class_name, "allocationMode": "ExactCount", "count": 2}}]}}})
        assert claim["metadata"]["namespace"] == kube.namespace
        allocation = {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": f"gpu-{i}"}
            for i in range(2)]}}
        # The claim's own endpoint ignores status; the status subresource writes it.
        ignored = await kube.api.request("PUT", f"{claims}/llama-0-gpu",
                                         body={**claim, "status": {"allocation": allocation}})
        assert not (ignored.get("status") or {}).get("allocation")
        written = await kube.api.request("PUT", f"{claims}/llama-0-gpu/status",
                                         body={**ignored, "status": {"allocation": allocation}})
        assert dra.allocated([written]) == {(DRIVER, "node-a", "gpu-0"),
                                            (DRIVER, "node-a", "gpu-1")}
    finally:
        await kube.api.request("DELETE", f"{dra.CLASSES_PATH}/{class_name}")


async def test_slices_are_watched(kube: kube_env.KubeTestEnv) -> None:
    informer = watch.Informer(kube.api, path=dra.SLICES_PATH, settings=kube.settings)
    task = asyncio.create_task(informer.run())
    name = f"scaler-test-{uuid.uuid4().hex[:8]}"
    try:
        async with asyncio.timeout(5):
            await informer.synced.wait()
            await kube.api.request("POST", dra.SLICES_PATH,
                                   body=new_slice(name, node=f"{name}-node", devices=1))
            while f"/{name}" not in informer.objects:
                await asyncio.sleep(0.01)
        [device] = dra.devices([informer.objects[f"/{name}"]])
        assert (device.node, device.attribute(DRIVER, "type")) == (f"{name}-node", "gpu")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await kube.api.request("DELETE", f"{dra.SLICES_PATH}/{name}")
