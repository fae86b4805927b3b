"""The emulator's object store: resource types, resourceVersions, and watch fan-out."""

from __future__ import annotations

import asyncio
import copy
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scaler.actuators.timefmt import rfc3339
from scaler.emulator import apierrors, defaults, fields
from scaler.emulator.apierrors import Obj as Obj
from scaler.emulator.apierrors import StoreError as StoreError


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One API resource: where it lives and which subresources it has.

    scale_spec / scale_status / scale_selector: dotted paths that the `/scale`
    subresource maps (as a CRD's `subresources.scale` declares them); None = no `/scale`.
    builtin: strategic merge patch is accepted only for built-in types (CRDs answer 415).
    generation: the type keeps `metadata.generation` (bumped on spec changes only); Leases,
    Pods, Events and ConfigMaps have none on a real server.
    unconditional_update: a PUT without `metadata.resourceVersion` is accepted (false for
    Leases and custom resources, whose strategies demand it: 422).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    has_status: bool = False
    scale_spec: str | None = None
    scale_status: str | None = None
    scale_selector: str | None = None
    builtin: bool = True
    generation: bool = False
    unconditional_update: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


def _scaled(*, builtin: bool = True, **kwargs: Any) -> ResourceType:
    return ResourceType(
        has_status=True,
        scale_spec="spec.replicas",
        scale_status="status.replicas",
        scale_selector="status.selector",
        builtin=builtin,
        generation=True,
        unconditional_update=builtin,
        **kwargs,
    )


DEFAULT_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", has_status=True),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", unconditional_update=False),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass",
                 namespaced=False),
    _scaled(group="apps", version="v1", plural="deployments", kind="Deployment"),
    _scaled(group="apps", version="v1", plural="statefulsets", kind="StatefulSet"),
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                 has_status=True),
    ResourceType("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", has_status=True,
                 builtin=False, generation=True, unconditional_update=False),
    _scaled(group="cluster.x-k8s.io", version="v1beta1", plural="machinedeployments",
            kind="MachineDeployment", builtin=False),
    # Cluster Autoscaler's warm capacity: a CapacityBuffer names a PodTemplate of its namespace.
    ResourceType("", "v1", "podtemplates", "PodTemplate"),
    ResourceType("autoscaling.x-k8s.io", "v1alpha1", "capacitybuffers", "CapacityBuffer",
                 has_status=True, builtin=False, generation=True, unconditional_update=False),
    # Dynamic Resource Allocation, resource.k8s.io/v1 (GA in 1.34): slices and classes are
    # cluster-scoped and bump metadata.generation on spec changes (the resourceslice and
    # deviceclass strategies in pkg/registry/resource); claims are namespaced, with status.
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False,
                 generation=True),
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False,
                 generation=True),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", has_status=True),
    # The CRD with a scale subresource: LeaderWorkerSet, as multi-node inference uses it.
    _scaled(group="leaderworkerset.x-k8s.io", version="v1", plural="leaderworkersets",
            kind="LeaderWorkerSet", builtin=False),
)


@dataclass(slots=True)
class WatchEvent:
    resource_version: int
    type: str
    resource: tuple[str, str]
    obj: Obj


@dataclass(slots=True)
class Watcher:
    resource: tuple[str, str]
    accepts: Callable[[Obj], bool]
    queue: asyncio.Queue[WatchEvent | None] = field(default_factory=asyncio.Queue)


def get_path(obj: Obj, path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def set_path(obj: Obj, path: str, value: Any) -> None:
    parts = path.split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


Listener = Callable[[WatchEvent], None]
Check = Callable[[Obj], None]
"""Validation run on an object about to be stored; raises StoreError (422) to refuse it."""
# Generated name suffixes: five characters of the alphabet Kubernetes uses (no vowels, so
# no words; no 0, 1, 3 that read as letters).
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generated_suffix() -> str:
    return "".join(secrets.choice(NAME_ALPHABET) for _ in range(5))


class Store:
    """All objects, keyed by (group, plural) then (namespace, name).

    One resourceVersion counter for the whole store, like etcd's revision: every write
    gets the next integer; lists report the current one; watches replay from the event
    history (the last `history` writes; older versions answer 410 Gone). A write that
    changes nothing is not a write: it keeps the resourceVersion and sends no event, as
    etcd's guaranteed update skips identical bytes.

    `listeners` are called synchronously with every event (in-process controllers).
    `manager` on a write records it in `metadata.managedFields` (None: not recorded).
    """

    def __init__(self, *, types: tuple[ResourceType, ...], clock: Callable[[], float],
                 history: int = 10_000) -> None:
        self.types = {t.key: t for t in types}
        self.clock = clock
        self.revision = 1
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {
            t.key: {} for t in types
        }
        self.events: deque[WatchEvent] = deque(maxlen=history)
        self.watchers: list[Watcher] = []
        self.listeners: list[Listener] = []

    def type_for(self, group: str, plural: str) -> ResourceType:
        try:
            return self.types[(group, plural)]
        except KeyError:
            raise StoreError(404, "NotFound",
                             "the server could not find the requested resource") from None

    @property
    def oldest_replayable(self) -> int:
        """Watches from this resourceVersion or later can be replayed."""
        return self.events[0].resource_version - 1 if self.events else self.revision

    def _publish(self, rtype: ResourceType, kind: str, obj: Obj) -> None:
        event = WatchEvent(self.revision, kind, rtype.key, copy.deepcopy(obj))
        self.events.append(event)
        for watcher in self.watchers:
            if watcher.resource == rtype.key and watcher.accepts(obj):
                watcher.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event)

    def list(self, rtype: ResourceType, namespace: str | None) -> list[Obj]:
        items = self.objects[rtype.key]
        return [
            copy.deepcopy(obj) for (ns, _), obj in sorted(items.items())
            if namespace is None or ns == namespace
        ]

    def find(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj | None:
        obj = self.objects[rtype.key].get((namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.find(rtype, namespace, name)
        if obj is None:
            raise apierrors.not_found(resource=rtype.plural, group=rtype.group, name=name)
        return obj

    def _stamp(self, rtype: ResourceType, obj: Obj) -> None:
        self.revision += 1
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        obj["metadata"]["resourceVersion"] = str(self.revision)

    def _manage(self, *, old: Obj | None, new: Obj, rtype: ResourceType,
                manager: str | None, subresource: str | None) -> None:
        if manager is None:
            return
        new.setdefault("apiVersion", rtype.api_version)
        entries = fields.record(old=old, new=new, manager=manager, subresource=subresource,
                                time=rfc3339(self.clock()))
        if entries:
            new["metadata"]["managedFields"] = entries

    def create(self, rtype: ResourceType, namespace: str | None, obj: Obj, *,
               manager: str | None = None, check: Check | None = None) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise apierrors.invalid(kind=rtype.kind, group=rtype.group, name="", errors=[
                    apierrors.required("metadata.name", "name or generateName is required")])
            meta["name"] = meta["generateName"] + generated_suffix()
        if rtype.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise apierrors.bad_request("the namespace of the provided object does not "
                                            "match the namespace sent on the request")
            meta["namespace"] = namespace
        else:  # BeforeCreate clears a cluster-scoped object's namespace
            meta.pop("namespace", None)
        key = (namespace or "", meta["name"])
        if key in self.objects[rtype.key]:
            raise apierrors.already_exists(resource=rtype.plural, group=rtype.group,
                                           name=meta["name"])
        if meta.get("resourceVersion"):
            raise apierrors.bad_request("resourceVersion should not be set on objects to be "
                                        "created")
        for system in ("managedFields", "generation", "deletionTimestamp"):
            meta.pop(system, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        if rtype.generation:
            meta["generation"] = 1
        if rtype.key in (("apps", "deployments"), ("apps", "statefulsets")):
            obj["status"] = {}  # the controller writes it (PrepareForCreate clears it)
        elif not rtype.builtin and rtype.has_status:
            # A custom resource with a status subresource: the apiextensions server's
            # PrepareForCreate drops the status sent with a create; only /status writes it.
            obj.pop("status", None)
        defaults.apply(rtype.key, obj)
        if check is not None:
            check(obj)
        self._manage(old=None, new=obj, rtype=rtype, manager=manager, subresource=None)
        self._stamp(rtype, obj)
        self.objects[rtype.key][key] = obj
        self._publish(rtype, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(self, rtype: ResourceType, namespace: str | None, name: str, new: Obj, *,
               subresource: str | None = None, manager: str | None = None,
               check: Check | None = None) -> Obj:
        """Replace an object, checking `metadata.resourceVersion` when the caller set it.

        subresource "status" changes only `.status`; "scale" and None change everything
        but `.status` (for types with a status subresource), as the API server's update
        strategies do.
        """
        current = self.get(rtype, namespace, name)
        expected = (new.get("metadata") or {}).get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise apierrors.conflict(resource=rtype.plural, group=rtype.group, name=name)
        new_meta = new.get("metadata") or {}
        if new_meta.get("name", name) != name:
            raise apierrors.bad_request(f"the name of the object ({new_meta['name']}) does "
                                        f"not match the name on the URL ({name})")
        if subresource == "status":
            updated = copy.deepcopy(current)
            updated["status"] = copy.deepcopy(new.get("status"))
        else:
            updated = copy.deepcopy(new)
            meta = updated.setdefault("metadata", {})
            for immutable in ("uid", "creationTimestamp", "namespace", "name", "generation",
                              "deletionTimestamp", "managedFields"):
                meta.pop(immutable, None)
                if immutable in current["metadata"]:
                    meta[immutable] = current["metadata"][immutable]
            if rtype.has_status:
                if "status" in current:
                    updated["status"] = current["status"]
                else:
                    updated.pop("status", None)
            defaults.apply(rtype.key, updated)
            if "generation" in meta and updated.get("spec") != current.get("spec"):
                meta["generation"] += 1
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        updated["apiVersion"], updated["kind"] = rtype.api_version, rtype.kind
        if check is not None:
            check(updated)
        if updated == current:
            return current  # a no-op write: same resourceVersion, no watch event
        self._manage(old=current, new=updated, rtype=rtype, manager=manager,
                     subresource=subresource)
        self._stamp(rtype, updated)
        self.objects[rtype.key][(namespace or "", name)] = updated
        self._publish(rtype, "MODIFIED", updated)
        return copy.deepcopy(updated)

    def mark_deleting(self, rtype: ResourceType, namespace: str | None, name: str, *,
                      status: Obj | None = None) -> Obj:
        """Set `metadata.deletionTimestamp` (and `status`): the object is going, not gone."""
        updated = self.get(rtype, namespace, name)
        updated["metadata"]["deletionTimestamp"] = rfc3339(self.clock())
        if status is not None:
            updated["status"] = status
        self._stamp(rtype, updated)
        self.objects[rtype.key][(namespace or "", name)] = updated
        self._publish(rtype, "MODIFIED", updated)
        return copy.deepcopy(updated)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        current = self.get(rtype, namespace, name)
        del self.objects[rtype.key][(namespace or "", name)]
        self.revision += 1
        current["metadata"]["resourceVersion"] = str(self.revision)
        self._publish(rtype, "DELETED", current)
        return current

    def subscribe(self, rtype: ResourceType, accepts: Callable[[Obj], bool]) -> Watcher:
        watcher = Watcher(rtype.key, accepts)
        self.watchers.append(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    def close_watchers(self) -> None:
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)
