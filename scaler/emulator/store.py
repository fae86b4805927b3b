"""The emulator's object store: resource types, resourceVersions, and watch fan-out."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scaler.actuators.timefmt import rfc3339

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One API resource: where it lives and which subresources it has.

    scale_spec / scale_status / scale_selector: dotted paths that the `/scale`
    subresource maps (as a CRD's `subresources.scale` declares them); None = no `/scale`.
    builtin: strategic merge patch is accepted only for built-in types (CRDs answer 415).
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

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


def _scaled(**kwargs: Any) -> ResourceType:
    return ResourceType(
        has_status=True,
        scale_spec="spec.replicas",
        scale_status="status.replicas",
        scale_selector="status.selector",
        **kwargs,
    )


DEFAULT_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", has_status=True),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass",
                 namespaced=False),
    _scaled(group="apps", version="v1", plural="deployments", kind="Deployment"),
    _scaled(group="apps", version="v1", plural="statefulsets", kind="StatefulSet"),
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                 has_status=True),
    ResourceType("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", has_status=True,
                 builtin=False),
    _scaled(group="cluster.x-k8s.io", version="v1beta1", plural="machinedeployments",
            kind="MachineDeployment", builtin=False),
    # The CRD with a scale subresource: LeaderWorkerSet, as multi-node inference uses it.
    _scaled(group="leaderworkerset.x-k8s.io", version="v1", plural="leaderworkersets",
            kind="LeaderWorkerSet", builtin=False),
)


class StoreError(Exception):
    """An API error with its HTTP code and Kubernetes `reason`, turned into a Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


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


class Store:
    """All objects, keyed by (group, plural) then (namespace, name).

    One resourceVersion counter for the whole store, like etcd's revision: every write
    gets the next integer; lists report the current one; watches replay from the event
    history (the last `history` writes; older versions answer 410 Gone).
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

    def type_for(self, group: str, plural: str) -> ResourceType:
        try:
            return self.types[(group, plural)]
        except KeyError:
            raise StoreError(404, "NotFound", f"the server could not find the requested "
                             f"resource ({plural}.{group or 'core'})") from None

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

    def list(self, rtype: ResourceType, namespace: str | None) -> list[Obj]:
        items = self.objects[rtype.key]
        return [
            copy.deepcopy(obj) for (ns, _), obj in sorted(items.items())
            if namespace is None or ns == namespace
        ]

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.objects[rtype.key].get((namespace or "", name))
        if obj is None:
            group = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
            raise StoreError(404, "NotFound", f'{group} "{name}" not found')
        return copy.deepcopy(obj)

    def _stamp(self, rtype: ResourceType, obj: Obj) -> None:
        self.revision += 1
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        obj["metadata"]["resourceVersion"] = str(self.revision)

    def create(self, rtype: ResourceType, namespace: str | None, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise StoreError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if rtype.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise StoreError(400, "BadRequest", "the namespace of the object does "
                                 "not match the namespace on the request")
            meta["namespace"] = namespace
        key = (namespace or "", meta["name"])
        if key in self.objects[rtype.key]:
            raise StoreError(409, "AlreadyExists",
                             f'{rtype.plural} "{meta["name"]}" already exists')
        if meta.get("resourceVersion"):
            raise StoreError(400, "BadRequest",
                             "resourceVersion should not be set on objects to be created")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        if "spec" in obj:
            meta["generation"] = 1
        if rtype.key == ("apps", "deployments"):
            obj["spec"].setdefault("replicas", 1)
        self._stamp(rtype, obj)
        self.objects[rtype.key][key] = obj
        self._publish(rtype, "ADDED", obj)
        return copy.deepcopy(obj)

    def update(self, rtype: ResourceType, namespace: str | None, name: str, new: Obj, *,
               subresource: str | None = None) -> Obj:
        """Replace an object, checking `metadata.resourceVersion` when the caller set it.

        subresource "status" changes only `.status`; None changes everything but `.status`
        (for types with a status subresource), as the API server's update strategies do.
        """
        current = self.get(rtype, namespace, name)
        expected = (new.get("metadata") or {}).get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise StoreError(
                409, "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        new_meta = new.get("metadata") or {}
        if new_meta.get("name", name) != name:
            raise StoreError(400, "BadRequest", "the name of the object does not match")
        if subresource == "status":
            updated = copy.deepcopy(current)
            updated["status"] = copy.deepcopy(new.get("status"))
        else:
            updated = copy.deepcopy(new)
            meta = updated.setdefault("metadata", {})
            for immutable in ("uid", "creationTimestamp", "namespace", "name", "generation"):
                if immutable in current["metadata"]:
                    meta[immutable] = current["metadata"][immutable]
            if rtype.has_status:
                if "status" in current:
                    updated["status"] = current["status"]
                else:
                    updated.pop("status", None)
            if "generation" in meta and updated.get("spec") != current.get("spec"):
                meta["generation"] += 1
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
