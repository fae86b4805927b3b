"""Pure: GPUs published through Dynamic Resource Allocation (resource.k8s.io/v1) per node.

Capacity is the devices of a DeviceClass in the nodes' ResourceSlices; use is the devices
allocated in ResourceClaims (a replica built from a ResourceClaimTemplate holds one claim,
allocated by the scheduler). Field names follow k8s.io/api resource/v1 (Kubernetes 1.34).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scaler.actuators import gpu_health, timeline
from scaler.core import gpus

Obj = Mapping[str, Any]
DeviceId = tuple[str, str, str]  # (driver, pool, device): unique in the cluster
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def claims_path(namespace: str) -> str:
    if not namespace:
        return "/apis/resource.k8s.io/v1/resourceclaims"
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


class UnsupportedSelector(ValueError):
    """A DeviceClass CEL selector outside the subset the scaler evaluates."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a node-local ResourceSlice; attributes keyed by their fully qualified
    name (an unqualified one is in the driver's domain, as the API defines it)."""

    driver: str
    pool: str
    name: str
    node: str
    attributes: dict[str, object] = field(default_factory=dict)

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    def attribute(self, domain: str, name: str) -> object:
        return self.attributes.get(f"{domain}/{name}")


def _attribute_value(raw: object) -> object:
    """A DeviceAttribute ({"string": ...}, {"int": ...}, {"bool": ...}, {"version": ...})."""
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def devices(slices: Iterable[Obj]) -> list[Device]:
    """The devices of node-local slices, from each pool's newest generation only.

    "A consumer must only use ResourceSlices with the highest generation number" (the
    ResourceSlice type's doc): a driver updating a pool bumps the generation of all its
    slices, and an old slice left over must not count twice. Slices without
    `spec.nodeName` (network-attached devices, `allNodes`/`nodeSelector`) belong to no
    one node and are not a node pool's capacity.
    """
    listed = [s for s in slices if isinstance(s.get("spec"), Mapping)]
    newest: dict[tuple[str, str], int] = {}
    for each in listed:
        spec = each["spec"]
        key = (str(spec.get("driver")), str((spec.get("pool") or {}).get("name")))
        generation = int((spec.get("pool") or {}).get("generation") or 0)
        newest[key] = max(newest.get(key, generation), generation)
    out: list[Device] = []
    for each in listed:
        spec = each["spec"]
        driver = str(spec.get("driver") or "")
        pool = spec.get("pool") or {}
        key = (driver, str(pool.get("name")))
        node = spec.get("nodeName")
        if not node or int(pool.get("generation") or 0) < newest[key]:
            continue
        for device in spec.get("devices") or []:
            attributes = {
                (name if "/" in name else f"{driver}/{name}"): _attribute_value(value)
                for name, value in (device.get("attributes") or {}).items()}
            out.append(Device(driver=driver, pool=str(pool.get("name")),
                              name=str(device.get("name")), node=str(node),
                              attributes=attributes))
    return out


# The CEL subset: `&&` of comparisons `device.driver == "x"` and
# `device.attributes["domain"].name == value` (or `!=`, or a bool attribute alone), the
# form DRA drivers' DeviceClasses use, e.g. `device.driver == "gpu.nvidia.com" &&
# device.attributes["gpu.nvidia.com"].type == "gpu"`.
_TERM = re.compile(
    r'^\s*(?P<operand>device\.driver|device\.attributes\[\s*"(?P<domain>[^"]+)"\s*\]'
    r'\s*\.\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*))'
    r'\s*(?:(?P<op>==|!=)\s*(?P<literal>"[^"]*"|\'[^\']*\'|-?[0-9]+|true|false))?\s*$')


def _literal(text: str) -> object:
    if text[0] in "\"'":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    return int(text)


def selector_matches(expression: str, device: Device) -> bool:
    """Evaluate one DeviceClass CEL selector on a device; UnsupportedSelector outside the
    subset (rather than a guess that would count devices the scheduler never gives)."""
    result = True
    for term in expression.split("&&"):
        found = _TERM.match(term)
        if found is None:
            raise UnsupportedSelector(
                f"CEL selector {expression!r}: only `&&` of `device.driver == \"...\"` and "
                "`device.attributes[\"domain\"].name == value` terms are evaluated")
        if found["operand"] == "device.driver":
            value: object = device.driver
        else:
            value = device.attribute(found["domain"], found["name"])
        if found["op"] is None:
            result = result and value is True
        elif found["op"] == "==":
            result = result and value == _literal(found["literal"])
        else:
            result = result and value is not None and value != _literal(found["literal"])
    return result


def class_selectors(device_class: Obj) -> tuple[str, ...]:
    """The CEL expressions of a DeviceClass's `spec.selectors[].cel.expression`."""
    selectors = (device_class.get("spec") or {}).get("selectors") or []
    return tuple(str((s.get("cel") or {}).get("expression") or "") for s in selectors
                 if isinstance(s, Mapping))


def of_class(found: Iterable[Device], selectors: tuple[str, ...]) -> list[Device]:
    """Devices every selector of the class accepts (a class without selectors takes all)."""
    return [d for d in found if all(selector_matches(e, d) for e in selectors)]


def allocated(claims: Iterable[Obj]) -> set[DeviceId]:
    """Devices allocated in claims' `status.allocation.devices.results`; admin access
    (monitoring beside the real user) does not take a device."""
    out: set[DeviceId] = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue
            out.add((str(result.get("driver")), str(result.get("pool")),
                     str(result.get("device"))))
    return out


def _faulty(device: Device, faults: tuple[gpus.GpuFault, ...]) -> gpus.GpuFault | None:
    """The fault of a device, matched by the driver's `uuid` attribute (the NVIDIA DRA
    driver publishes it, as dcgm-exporter labels `UUID`), else by `index` (= `gpu`)."""
    for fault in faults:
        if fault.uuid and fault.uuid == device.attribute(device.driver, "uuid"):
            return fault
        if str(device.attribute(device.driver, "index")) == fault.gpu:
            return fault
    return None


def pool_capacity(*, nodes: Iterable[timeline.NodeInfo], class_devices: Iterable[Device],
                  in_use: set[DeviceId], node_selector: Mapping[str, str],
                  device_class: str, gpus_per_replica: int,
                  telemetry: gpus.GpuTelemetry | None
                  ) -> tuple[timeline.PoolCapacity, tuple[gpu_health.NodeExclusion, ...]]:
    """A pool's devices of `device_class`, counted as the extended-resource path counts GPUs.

    Members: nodes matching `node_selector` (any node with such devices when it is empty).
    A device with a DCGM fault is neither usable nor free; a replica needs
    `gpus_per_replica` free devices on one node. Example: a node with 8 devices, 4
    allocated and 1 faulty, replicas of 2: 3 free, 1 slot.
    """
    by_node: dict[str, list[Device]] = {}
    for device in class_devices:
        by_node.setdefault(device.node, []).append(device)
    members = [n for n in nodes
               if all(n.labels.get(k) == v for k, v in node_selector.items())
               and (node_selector or by_node.get(n.name))]
    healthy = [n for n in members if n.healthy]
    usable = used = slots = 0
    exclusions: list[gpu_health.NodeExclusion] = []
    for node in healthy:
        here = by_node.get(node.name, [])
        faults = telemetry.faults_on(node.name) if telemetry is not None else ()
        bad = {d.id: f for d in here if (f := _faulty(d, faults)) is not None}
        if bad:
            exclusions.append(gpu_health.NodeExclusion(
                node=node.name, excluded=len(bad), of=len(here),
                faults=tuple(f for f in faults if f in bad.values())))
        good = [d for d in here if d.id not in bad]
        taken = sum(1 for d in good if d.id in in_use)
        usable += len(good)
        used += taken
        slots += (len(good) - taken) // gpus_per_replica
    capacity = timeline.PoolCapacity(
        resource_name=device_class, nodes=len(members), healthy_nodes=len(healthy),
        unhealthy=tuple(sorted(n.name for n in members if not n.healthy)),
        allocatable_gpus=usable, used_gpus=used, free_replica_slots=slots)
    return capacity, tuple(exclusions)
