"""What the deployment controller writes to a Deployment's status, and a writer that does it.

In a real cluster the kube-controller-manager answers every spec change (create, scale,
patch, update) with a status write a few milliseconds later: `observedGeneration`,
`replicas`, `updatedReplicas`, `readyReplicas`/`availableReplicas` as pods become ready,
and the `Available`/`Progressing` conditions. Each such write moves the object's
`resourceVersion` (not its `generation`), so a client that read the object before it and
then writes with that resourceVersion gets 409: the race the actuators must survive.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Callable

from scaler.actuators import timeline
from scaler.actuators.timefmt import rfc3339
from scaler.emulator.store import NAME_ALPHABET, Obj, ResourceType, Store, StoreError, WatchEvent

KEY = ("apps", "deployments")
MANAGER = "kube-controller-manager"
REVISION = "deployment.kubernetes.io/revision"


def owned_pods(store: Store, pods: ResourceType, deployment: Obj) -> list[Obj]:
    """The pods whose controller ownerReference is `deployment` (by uid)."""
    uid = deployment["metadata"]["uid"]
    return [
        p for p in store.list(pods, deployment["metadata"]["namespace"])
        if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
    ]


def replica_set_name(deployment: Obj) -> str:
    """`<deployment>-<pod-template-hash>`: a stable hash of the pod template."""
    template = json.dumps((deployment.get("spec") or {}).get("template"), sort_keys=True)
    digest = hashlib.sha256(template.encode()).digest()
    suffix = "".join(NAME_ALPHABET[b % len(NAME_ALPHABET)] for b in digest[:10])
    return f"{deployment['metadata']['name']}-{suffix}"


def _scaled_value(value: object, replicas: int, *, round_up: bool) -> int:
    """An IntOrString such as "25%" or 1 against `replicas` (25% of 10: 2 down, 3 up)."""
    if isinstance(value, str) and value.endswith("%"):
        exact = int(value[:-1]) * replicas / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value) if isinstance(value, int | str) else 0


def max_unavailable(spec: Obj, replicas: int) -> int:
    """How many pods may be unavailable with the Deployment still `Available`."""
    strategy = spec.get("strategy") or {}
    if strategy.get("type") != "RollingUpdate" or replicas == 0:
        return 0
    rolling = strategy.get("rollingUpdate") or {}
    unavailable = _scaled_value(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    surge = _scaled_value(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    # Both zero would deadlock a rollout, so the controller allows one unavailable.
    return 1 if unavailable == 0 and surge == 0 else min(unavailable, replicas)


def _condition(previous: Obj, *, kind: str, status: str, reason: str, message: str,
               now: str) -> Obj:
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == kind), None)
    if old is not None and (old.get("status"), old.get("reason")) == (status, reason):
        return {**old, "message": message}
    return {"type": kind, "status": status, "lastUpdateTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message}


def status(deployment: Obj, *, pods: list[Obj] | None, now: float) -> Obj:
    """The status the deployment controller writes for `deployment`.

    pods None: nothing runs pods, so every replica counts as ready at once; otherwise the
    ready ones among `pods`. Zero counts are left out, as the API serializes them.
    With 4 replicas, 25% maxUnavailable allows 1 down: 3 ready is `Available`.
    """
    spec = deployment.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    if pods is None:
        total = ready = replicas
    else:
        total = len(pods)
        ready = sum(1 for p in pods if timeline.is_true(p, "Ready"))
    previous = deployment.get("status") or {}
    stamp = rfc3339(now)
    rs = replica_set_name(deployment)
    available = ready >= replicas - max_unavailable(spec, replicas)
    complete = total == replicas and ready == replicas
    counts = {"replicas": total, "updatedReplicas": total, "readyReplicas": ready,
              "availableReplicas": ready, "unavailableReplicas": max(replicas - ready, 0)}
    result: Obj = {"observedGeneration": deployment["metadata"].get("generation", 1)}
    result.update({k: v for k, v in counts.items() if v})
    result["conditions"] = [
        _condition(previous, kind="Available", now=stamp,
                   status="True" if available else "False",
                   reason="MinimumReplicasAvailable" if available
                   else "MinimumReplicasUnavailable",
                   message="Deployment has minimum availability." if available
                   else "Deployment does not have minimum availability."),
        _condition(previous, kind="Progressing", now=stamp, status="True",
                   reason="NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                   message=f'ReplicaSet "{rs}" has successfully progressed.' if complete
                   else f'ReplicaSet "{rs}" is progressing.'),
    ]
    return result


def write_status(store: Store, deployment: Obj, *, pods: list[Obj] | None) -> bool:
    """Write `status(...)` to the status subresource when it differs; True if it did."""
    new = status(deployment, pods=pods, now=store.clock())
    if deployment.get("status") == new:
        return False
    meta = deployment["metadata"]
    store.update(store.types[KEY], meta["namespace"], meta["name"],
                 {**deployment, "status": new}, subresource="status", manager=MANAGER)
    return True


class StatusWriter:
    """The deployment controller's status writes, `delay_s` after each spec change.

    It listens to the store in-process and answers a Deployment whose `generation` is
    ahead of its `status.observedGeneration` on the event loop `delay_s` later, never in
    the same request. `pods_counted()` true: a pod controller runs, so ready counts come
    from the Deployment's pods rather than from `spec.replicas`.
    """

    def __init__(self, store: Store, *, delay_s: float, pods: ResourceType,
                 pods_counted: Callable[[], bool]) -> None:
        self.store = store
        self.delay_s = delay_s
        self._pods = pods
        self._pods_counted = pods_counted
        self._pending: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._replica_sets: dict[tuple[str, str], str] = {}
        self.writes = 0
        """Status writes made, for tests that wait for the controller."""

    def start(self) -> None:
        self.store.listeners.append(self._on_event)

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)
        for handle in self._pending.values():
            handle.cancel()
        self._pending.clear()

    def _on_event(self, event: WatchEvent) -> None:
        if event.resource != KEY or event.type == "DELETED":
            return
        meta = event.obj["metadata"]
        observed = (event.obj.get("status") or {}).get("observedGeneration")
        key = (meta["namespace"], meta["name"])
        if observed == meta.get("generation") or key in self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # seeded before any loop runs: no client can race it yet
            self._write(key)
            return
        self._pending[key] = loop.call_later(self.delay_s, self._write, key)

    def _write(self, key: tuple[str, str]) -> None:
        self._pending.pop(key, None)
        deployment = self.store.find(self.store.types[KEY], *key)
        if deployment is None:
            return
        pods = owned_pods(self.store, self._pods, deployment) if self._pods_counted() else None
        try:
            deployment = self._annotate_revision(key, deployment)
            written = write_status(self.store, deployment, pods=pods)
        except StoreError:  # pragma: no cover - the object is read and written synchronously
            return
        self.writes += written

    def _annotate_revision(self, key: tuple[str, str], deployment: Obj) -> Obj:
        """The controller's first write: `deployment.kubernetes.io/revision` on the object
        itself ("1", then one more for each new pod template), an update of the main
        resource that moves resourceVersion but not generation, before the status write."""
        replica_set = replica_set_name(deployment)
        previous = self._replica_sets.get(key)
        self._replica_sets[key] = replica_set
        annotations = deployment["metadata"].get("annotations") or {}
        revision = annotations.get(REVISION)
        if revision is None:
            wanted = "1"
        elif previous not in (None, replica_set) and str(revision).isdigit():
            wanted = str(int(revision) + 1)
        else:
            return deployment
        meta = {**deployment["metadata"], "annotations": {**annotations, REVISION: wanted}}
        return self.store.update(self.store.types[KEY], key[0], key[1],
                                 {**deployment, "metadata": meta}, manager=MANAGER)
