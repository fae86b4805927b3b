"""A tiny Deployment and scheduler controller for the emulator: replicas -> pods -> Ready."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

from scaler.actuators import deletion_cost, selectors, timeline
from scaler.actuators.timefmt import parse_time, rfc3339
from scaler.emulator import deployments
from scaler.emulator.server import KubeEmulator
from scaler.emulator.store import Obj, StoreError
from scaler.engine import spare

SCHEDULER = "kube-scheduler"
KUBELET = "kubelet"


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Delays of each step of a pod's start, in wall-clock seconds of the emulator's clock.

    With schedule 1 s, start 60 s (image pull + model load) and ready 20 s, a pod created
    at t is scheduled at t+1, running at t+61 and Ready at t+81: 81 s of cold start.
    """

    schedule_delay_s: float = 0.0
    start_delay_s: float = 0.0
    ready_delay_s: float = 0.0
    interval_s: float = 0.05


def deletion_rank(pod: Obj) -> spare.RemovalRank:
    """The order in which a ReplicaSet removes pods on scale-down, first removed first:
    the pod's fields ranked by `spare.removal_rank` (the rule the simulator uses too)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    restarts = max((int(c.get("restartCount") or 0)
                    for c in status.get("containerStatuses") or []), default=0)
    return spare.removal_rank(
        scheduled=bool(spec.get("nodeName")), phase=str(status.get("phase")),
        ready=timeline.is_true(pod, "Ready"), cost=deletion_cost.effective_cost(pod),
        ready_at=parse_time((timeline.condition(pod, "Ready") or {}).get("lastTransitionTime")),
        restarts=restarts, created_at=parse_time(meta.get("creationTimestamp")))


class EmulatorController:
    """Reconciles Deployments into pods and walks pods through their start.

    Call `reconcile()` for one deterministic pass (tests with a fake clock), or `run()` as
    a background task. Pods land on a Ready, schedulable node with enough free extended
    resources (GPUs); when the store holds no nodes at all, they land on a virtual node.
    Deployment status then counts these pods (also in the emulator's status writer).
    """

    def __init__(self, emulator: KubeEmulator, settings: ControllerSettings) -> None:
        emulator.pods_run = True
        self.emulator = emulator
        self.settings = settings
        self._pods = emulator.resource("", "pods")
        self._deployments = emulator.resource("apps", "deployments")
        self._nodes = emulator.resource("", "nodes")

    async def run(self) -> None:
        while True:
            self.reconcile()
            await asyncio.sleep(self.settings.interval_s)

    def reconcile(self) -> None:
        for deployment in self.emulator.store.list(self._deployments, None):
            with contextlib.suppress(StoreError):  # deleted or changed meanwhile: next pass
                self._reconcile_deployment(deployment)
        for pod in self.emulator.store.list(self._pods, None):
            with contextlib.suppress(StoreError):
                self._advance(pod)
        for deployment in self.emulator.store.list(self._deployments, None):
            with contextlib.suppress(StoreError):
                self._status(deployment)

    def _owned(self, deployment: Obj) -> list[Obj]:
        return deployments.owned_pods(self.emulator.store, self._pods, deployment)

    def _reconcile_deployment(self, deployment: Obj) -> None:
        store = self.emulator.store
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        pods = self._owned(deployment)
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        for _ in range(want - len(pods)):
            pod_meta = dict(template.get("metadata") or {})
            pod_meta.update({
                "name": f"{meta['name']}-{uuid.uuid4().hex[:10]}",
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": meta["name"], "uid": meta["uid"],
                                     "controller": True}],
            })
            store.create(self._pods, meta["namespace"], {
                "metadata": pod_meta, "spec": dict(template.get("spec") or {}),
                "status": {"phase": "Pending"},
            }, manager=deployments.MANAGER)
        if len(pods) > want:
            for pod in sorted(pods, key=deletion_rank)[: len(pods) - want]:
                store.delete(self._pods, meta["namespace"], pod["metadata"]["name"])

    def _node_for(self, pod: Obj) -> str | None:
        nodes = self.emulator.store.list(self._nodes, None)
        if not nodes:
            return "emulator-node"
        need = timeline.extended_requests(pod)
        wanted_labels = (pod.get("spec") or {}).get("nodeSelector") or {}
        pods = self.emulator.store.list(self._pods, None)
        for node in nodes:
            labels = node["metadata"].get("labels") or {}
            ready = timeline.is_true(node, "Ready")
            if not ready or (node.get("spec") or {}).get("unschedulable"):
                continue
            if not selectors.Selector(tuple(
                    selectors.Requirement(k, "=", frozenset({v}))
                    for k, v in wanted_labels.items())).matches(labels):
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            used: dict[str, int] = {}
            for other in pods:
                if (other.get("spec") or {}).get("nodeName") == node["metadata"]["name"]:
                    for name, value in timeline.extended_requests(other).items():
                        used[name] = used.get(name, 0) + value
            if all(int(allocatable.get(n, 0)) - used.get(n, 0) >= v for n, v in need.items()):
                return str(node["metadata"]["name"])
        return None

    def _advance(self, pod: Obj) -> None:
        store, settings = self.emulator.store, self.settings
        now = store.clock()
        meta = pod["metadata"]
        created = parse_time(meta.get("creationTimestamp")) or now
        status = dict(pod.get("status") or {})
        conditions = list(status.get("conditions") or [])
        scheduled = timeline.condition(pod, "PodScheduled")
        changed = False
        if scheduled is None or scheduled.get("status") != "True":
            if now - created < settings.schedule_delay_s:
                return
            node = self._node_for(pod)
            if node is None:
                if scheduled is None:
                    conditions.append({"type": "PodScheduled", "status": "False",
                                       "reason": "Unschedulable",
                                       "lastTransitionTime": rfc3339(now)})
                    status["conditions"] = conditions
                    store.update(self._pods, meta["namespace"], meta["name"],
                                 {**pod, "status": status}, subresource="status",
                                 manager=SCHEDULER)
                return
            conditions = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True",
                               "lastTransitionTime": rfc3339(now)})
            pod = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
            pod = store.update(self._pods, meta["namespace"], meta["name"], pod,
                               manager=SCHEDULER)
            status["conditions"] = conditions
            store.update(self._pods, meta["namespace"], meta["name"],
                         {**pod, "status": status}, subresource="status", manager=SCHEDULER)
            return
        scheduled_at = parse_time(scheduled.get("lastTransitionTime")) or now
        containers = (pod.get("spec") or {}).get("containers") or []
        if status.get("phase") == "Pending" and now - scheduled_at >= settings.start_delay_s:
            status["phase"] = "Running"
            status["containerStatuses"] = [
                {"name": c.get("name", "main"), "image": c.get("image", "pause"), "imageID": "",
                 "ready": False, "started": True, "restartCount": 0,
                 "state": {"running": {"startedAt": rfc3339(now)}}} for c in containers]
            changed = True
        elif status.get("phase") == "Running" and timeline.condition(pod, "Ready") is None:
            started = min((parse_time(s["state"]["running"]["startedAt"]) or now
                           for s in status.get("containerStatuses") or []), default=now)
            if now - started >= settings.ready_delay_s:
                for kind in ("ContainersReady", "Ready"):
                    conditions.append({"type": kind, "status": "True",
                                       "lastTransitionTime": rfc3339(now)})
                status["conditions"] = conditions
                for container in status.get("containerStatuses") or []:
                    container["ready"] = True
                changed = True
        if changed:
            store.update(self._pods, meta["namespace"], meta["name"], {**pod, "status": status},
                         subresource="status", manager=KUBELET)

    def _status(self, deployment: Obj) -> None:
        deployments.write_status(self.emulator.store, deployment, pods=self._owned(deployment))
