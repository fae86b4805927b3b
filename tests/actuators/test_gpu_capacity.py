"""Honest capacity: GPUs with DCGM health errors and DRA devices, Events when GPUs leave a pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from scaler.actuators import cluster_reader, dra, events, gpu_health, timeline
from scaler.actuators import settings as kube_settings
from scaler.core import gpus
from scaler.emulator import ControllerSettings, EmulatorController, Fault
from scaler.emulator.env import KubeTestEnv, ManualClock
from scaler.policy import model

from .factories import make_policy

DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'


def fault(node: str, gpu: int, *, xid: int = 79, uuid: str = "") -> gpus.GpuFault:
    return gpus.GpuFault(node=node, gpu=str(gpu), uuid=uuid, xids=(xid,))


def node_info(name: str, *, allocatable: int, capacity: int | None = None,
              resource: str = "nvidia.com/gpu", ready: bool = True) -> timeline.NodeInfo:
    return timeline.NodeInfo(
        name=name, labels={"pool": "h100"}, ready=ready, cordoned=False,
        allocatable={resource: allocatable}, created_at=None,
        capacity={resource: allocatable if capacity is None else capacity})


# -- pure --------------------------------------------------------------------------------

def test_faulty_gpus_leave_the_node_once() -> None:
    telemetry = gpus.GpuTelemetry(at=0, faults=(fault("a", 5), fault("a", 6), fault("b", 0),
                                                fault("c", 1)),
                                  gpus_per_node={"a": 8, "b": 8, "c": 8})
    nodes = [node_info("a", allocatable=8),
             node_info("b", allocatable=7, capacity=8),   # the plugin already took it out
             node_info("c", allocatable=8, ready=False)]  # not Ready: all out already
    counted, exclusions = gpu_health.exclude_faulty(nodes, telemetry,
                                                    resource_name="nvidia.com/gpu")
    assert [n.allocatable["nvidia.com/gpu"] for n in counted] == [6, 7, 8]
    assert [e.text for e in exclusions] == ["node a: 2 of 8 GPUs excluded: XID 79 on GPU 5, 6"]


@pytest.mark.parametrize(("faulty", "allocatable", "capacity", "resource", "gpus_on_node",
                          "excluded"), [
    (2, 8, 8, "nvidia.com/gpu", 8, 2),
    (2, 8, 9, "nvidia.com/gpu", 9, 1),            # one already out of allocatable
    (9, 8, 8, "nvidia.com/gpu", 8, 8),            # never more than the node has
    (2, 56, 56, "nvidia.com/mig-1g.10gb", 8, 14),  # 7 slices per GPU
    (1, 56, 56, "nvidia.com/mig-1g.10gb", None, 1),  # GPU count unknown: one device each
    (0, 8, 8, "nvidia.com/gpu", 8, 0),
])
def test_excluded_devices(faulty: int, allocatable: int, capacity: int, resource: str,
                          gpus_on_node: int | None, excluded: int) -> None:
    assert gpu_health.excluded_devices(faulty=faulty, allocatable=allocatable,
                                       capacity=capacity, resource_name=resource,
                                       gpus_on_node=gpus_on_node) == excluded


def test_fault_reasons_read_as_people_say_them() -> None:
    both = gpus.GpuFault(node="a", gpu="1", xids=(48, 79), dbe_errors=2)
    assert both.reason == "XID 48, 79 and double-bit ECC"


def device(name: str, *, node: str = "a", **attributes: object) -> dra.Device:
    return dra.Device(driver=DRIVER, pool=node, name=name, node=node,
                      attributes={f"{DRIVER}/{k}": v for k, v in attributes.items()})


@pytest.mark.parametrize(("expression", "matches"), [
    (SELECTOR, True),
    ('device.driver == "other.example.com"', False),
    (f'device.attributes["{DRIVER}"].type != "mig"', True),
    (f'device.attributes["{DRIVER}"].missing != "x"', False),  # absent is never a match
    (f'device.attributes["{DRIVER}"].index == 3', True),
    (f'device.attributes["{DRIVER}"].healthy', True),
])
def test_device_class_selectors(expression: str, matches: bool) -> None:
    gpu = device("gpu-3", type="gpu", index=3, healthy=True)
    assert dra.selector_matches(expression, gpu) is matches


def test_selectors_outside_the_subset_are_refused_not_guessed() -> None:
    with pytest.raises(dra.UnsupportedSelector, match="only `&&`"):
        dra.selector_matches('device.capacity["gpu.nvidia.com"].memory.compareTo('
                             'quantity("40Gi")) >= 0', device("gpu-0"))


def slice_of(node: str, count: int, *, generation: int = 1, first: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "type": {"string": "gpu"}, "index": {"int": i},
                         "uuid": {"string": f"GPU-{node}-{i}"}}}
                         for i in range(first, first + count)]}}


def test_only_a_pools_newest_generation_counts() -> None:
    found = dra.devices([slice_of("a", 4, generation=1), slice_of("a", 2, generation=2),
                         {"spec": {"driver": DRIVER, "allNodes": True,
                                   "pool": {"name": "fabric", "generation": 1},
                                   "devices": [{"name": "nic-0"}]}}])
    assert [(d.node, d.name) for d in found] == [("a", "gpu-0"), ("a", "gpu-1")]
    assert found[0].attribute(DRIVER, "uuid") == "GPU-a-0"  # unqualified: driver's domain


# -- the reader, against the emulator ----------------------------------------------------

@pytest.fixture
async def recorded(kube: KubeTestEnv, wall_clock: ManualClock
                   ) -> AsyncIterator[tuple[cluster_reader.KubeClusterReader, list[Any]]]:
    """A reader with an Event recorder and a settable DCGM reading."""
    settings = kube.settings.model_copy(update={"watch_namespaces": (kube.namespace,)})
    recorder = events.EventRecorder(kube.api, settings=kube_settings.EventSettings(),
                                    wall_clock=wall_clock, instance="test",
                                    monotonic=lambda: 0.0)
    reading: list[Any] = [None]
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                              wall_clock=wall_clock, recorder=recorder,
                                              telemetry=lambda: reading[0])
    await reader.start()
    try:
        yield reader, reading
    finally:
        await reader.stop()


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.01)


def gpu_node(name: str, *, gpus_count: int, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "h100"}},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus_count)},
                       "capacity": {"nvidia.com/gpu": str(gpus_count)},
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2025-11-29T00:00:00Z"}]}}


async def scaler_events(kube: KubeTestEnv) -> list[tuple[str, str]]:
    listing = await kube.api.get(f"/api/v1/namespaces/{kube.namespace}/events")
    return [(e["reason"], e["message"]) for e in listing["items"]
            if e["reason"].startswith("GpuCapacity")]


POOL = model.NodePool(name="h100", gpus_per_node=8, node_selector={"pool": "h100"})


@pytest.mark.emulator_only
async def test_faulty_gpus_are_not_capacity_and_an_event_says_so(
        kube: KubeTestEnv,
        recorded: tuple[cluster_reader.KubeClusterReader, list[Any]]) -> None:
    reader, reading = recorded
    assert kube.emulator is not None
    nodes = kube.emulator.resource("", "nodes")
    for name, cordoned in (("gpu-3", False), ("gpu-4", False), ("gpu-5", True)):
        kube.emulator.store.create(nodes, None, gpu_node(name, gpus_count=8, cordoned=cordoned))
    await kube.create_deployment("llama", replicas=0)
    await until(lambda: len(reader.nodes.objects) == 3)
    policy = make_policy(kube.namespace, "llama", node_pool=POOL, gpus_per_replica=4)

    def usable() -> int | None:
        return reader.usable_gpus(node_selector=POOL.node_selector,
                                  resource_name="nvidia.com/gpu")

    assert usable() == 16

    reading[0] = gpus.GpuTelemetry(at=0, faults=(fault("gpu-3", 5), fault("gpu-3", 6)))
    assert usable() == 14
    cluster = await reader.read(policy)
    note = "node gpu-3: 2 of 8 GPUs excluded: XID 79 on GPU 5, 6"
    assert (cluster.free_replica_slots, cluster.excluded_gpus) == (2 + 1, 2)  # 8/4 + 6/4
    assert cluster.capacity_notes == (note,)
    await reader.read(policy)  # the same exclusion again: no second Event
    assert await scaler_events(kube) == [("GpuCapacityExcluded", f"pool h100: {note}")]

    reading[0] = gpus.GpuTelemetry(at=0)
    cluster = await reader.read(policy)
    assert (cluster.free_replica_slots, cluster.capacity_notes) == (4, ())
    assert sorted(await scaler_events(kube)) == [  # listed by generated name: sorted
        ("GpuCapacityExcluded", f"pool h100: {note}"),
        ("GpuCapacityRestored", "pool h100: no GPUs excluded")]


@pytest.mark.emulator_only
async def test_dra_capacity_is_the_class_devices_minus_claims_and_faults(
        kube: KubeTestEnv, wall_clock: ManualClock,
        recorded: tuple[cluster_reader.KubeClusterReader, list[Any]]) -> None:
    reader, reading = recorded
    assert kube.emulator is not None
    nodes = kube.emulator.resource("", "nodes")
    for name in ("dra-a", "dra-b"):
        kube.emulator.store.create(nodes, None, gpu_node(name, gpus_count=0))
        await kube.api.request("POST", dra.SLICES_PATH, body=slice_of(name, 4))
    await kube.api.request("POST", dra.CLASSES_PATH, body={
        "metadata": {"name": CLASS}, "spec": {"selectors": [{"cel": {"expression": SELECTOR}}]}})
    claims = dra.claims_path(kube.namespace)
    claim = await kube.api.request("POST", claims, body={
        "metadata": {"name": "llama-0-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS, "count": 2}}]}}})
    await kube.api.request("PUT", f"{claims}/llama-0-gpu/status", body={**claim, "status": {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "dra-a", "device": f"gpu-{i}"}
            for i in (0, 1)]}}}})
    # One replica runs (its GPUs are the claim's); DCGM sees it busy.
    controller = EmulatorController(kube.emulator, ControllerSettings())
    await kube.create_deployment("llama", replicas=1)
    for _ in range(3):
        controller.reconcile()
    await until(lambda: any(timeline.is_true(p, "Ready")
                            for p in reader.pods[kube.namespace].objects.values()))
    [pod] = reader.pods[kube.namespace].objects.values()
    reading[0] = gpus.GpuTelemetry(
        at=0, faults=(fault("dra-b", 3, uuid="GPU-dra-b-3"),),
        sm_active={(kube.namespace, pod["metadata"]["name"]): 0.42})

    policy = make_policy(kube.namespace, "llama", node_pool=POOL, gpus_per_replica=2)
    policy = policy.model_copy(update={"spec": policy.spec.model_copy(update={
        "resources": model.Resources(gpus_per_replica=2, device_class_name=CLASS)})})
    await reader.update([policy])
    cluster = await reader.read(policy)
    # dra-a: 4 devices, 2 claimed -> 1 slot; dra-b: 4, 1 faulty -> 3 free -> 1 slot.
    assert cluster.free_replica_slots == 2
    assert cluster.capacity_notes == ("node dra-b: 1 of 4 GPUs excluded: XID 79 on GPU 3",)
    assert cluster.gpu_sm_active == pytest.approx(0.42)
    capacity = reader.pool_capacity(POOL, resource_name="nvidia.com/gpu", gpus_per_replica=2,
                                    device_class_name=CLASS)
    assert capacity is not None
    assert (capacity.allocatable_gpus, capacity.used_gpus) == (7, 2)
    assert reader.usable_gpus(node_selector=POOL.node_selector, resource_name="nvidia.com/gpu",
                              device_class_name=CLASS) == 7
    unknown = reader.pool_reading(node_selector={}, resource_name="nvidia.com/gpu",
                                  gpus_per_replica=1, device_class_name="missing")
    assert (unknown.capacity, unknown.notes) == (None, ("DeviceClass missing not found",))


@pytest.mark.emulator_only
async def test_a_cluster_without_dra_leaves_capacity_unknown_not_the_decision(
        kube: KubeTestEnv, wall_clock: ManualClock) -> None:
    assert kube.emulator is not None
    kube.emulator.inject(Fault(path="resource.k8s.io", status=404, message="not found",
                               times=1000))
    settings = kube.settings.model_copy(update={"watch_namespaces": (kube.namespace,),
                                                "request_timeout_s": 0.5})
    reader = cluster_reader.KubeClusterReader(kube.api, settings=settings,
                                              wall_clock=wall_clock)
    await reader.start()
    try:
        await kube.create_deployment("llama", replicas=2)
        policy = make_policy(kube.namespace, "llama", node_pool=POOL)
        policy = policy.model_copy(update={"spec": policy.spec.model_copy(update={
            "resources": model.Resources(device_class_name=CLASS)})})
        cluster = await reader.read(policy)
        assert (cluster.current, cluster.free_replica_slots) == (2, None)
        [note] = cluster.capacity_notes
        assert note.startswith("/apis/resource.k8s.io/v1/resourceslices not listed")
    finally:
        await reader.stop()
