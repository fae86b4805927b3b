"""Deployment replicas -> running `scaler sim-server` processes, with the profile's cold start.

The part of a cluster that turns a Deployment's `spec.replicas` into serving replicas, for
one Deployment in the Kubernetes API emulator (in-process): the ReplicaSet controller
(pods created and removed, least useful first), the scheduler (pods bound to nodes with
free GPUs), a cluster autoscaler (a node booted for a pod that fits nowhere, removed
after 10 min empty), the kubelet (the sim-server process started, the pod Ready one pod
start after it was scheduled) and the endpoints controller (a Ready replica added to the
proxy, a removed one drained first). Its timings are the simulator's cluster model
(`scaler.sim.cluster.SimCluster`): scheduled when a node has room, Ready at scheduled +
image pull + model load + readiness, a node ready `node_boot_s` after it was asked for,
a removed ready pod serving what it has and going when that is done. It is the only
writer of the Deployment's status (the emulator's status writer must be off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaler import emulator as kube_emulator
from scaler.actuators import nodepool
from scaler.actuators.timefmt import rfc3339
from scaler.demo import local
from scaler.emulator import deployments
from scaler.emulator import store as emulator_store
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, proxy

log = logging.getLogger(__name__)

# What `scaler sim-server` prints once it serves: "... on http://127.0.0.1:PORT/v1".
_URL_LINE = re.compile(rb" on (http://\S+)/v1")
STOP_TIMEOUT_S = 5.0


@dataclass(slots=True)
class ReplicaRecord:
    """One pod's life, in epoch seconds (None: not yet); `late_s` is how much later than
    its profile's start the process answered (a busy machine's share of a cold start)."""

    pod: str
    created_at: float
    gpus: int
    node: str | None = None
    scheduled_at: float | None = None
    started_at: float | None = None
    ready_at: float | None = None
    drain_at: float | None = None
    gone_at: float | None = None
    url: str | None = None
    spawned: bool = False
    late_s: float = 0.0
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def phase(self) -> str:
        if self.gone_at is not None:
            return "gone"
        if self.drain_at is not None:
            return "draining"
        if self.ready_at is not None:
            return "ready"
        return "pending" if self.scheduled_at is None else "starting"

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "gpus": self.gpus, "node": self.node,
                "created_at": self.created_at, "scheduled_at": self.scheduled_at,
                "started_at": self.started_at, "ready_at": self.ready_at,
                "drain_at": self.drain_at, "gone_at": self.gone_at,
                "late_s": round(self.late_s, 3)}


@dataclass(slots=True)
class NodeRecord:
    """A GPU node of the pool: Ready at `ready_at`; its Node object exists from then on."""

    name: str
    ready_at: float
    gpus: int
    used: int = 0
    empty_since: float | None = None
    registered: bool = False
    gone: bool = False


@dataclass(frozen=True, slots=True)
class Target:
    """The Deployment the controller runs, and what its replicas are."""

    namespace: str
    name: str
    served_model: str
    profile_path: Path
    gpus_per_replica: int
    resource_name: str
    pool: sim_cluster.PoolConfig
    pool_name: str
    node_labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    """The Deployment at one moment (epoch seconds): spec.replicas, pods holding GPUs
    (starting, ready and draining ones), ready pods, nodes."""

    at: float
    desired: int
    allocated: int
    ready: int
    nodes: int


class ReplicaController:
    """Reconciles one Deployment of the emulator into sim-server processes every interval.

    `nats_url`: each sim-server publishes its DESIGN 4.2 signals there (source = pod name).
    `log_dir`: where each process's stderr goes (else discarded).
    """

    def __init__(self, emulator: kube_emulator.KubeEmulator, target: Target, *,
                 profile: profiles.ReplicaProfile, balancer: proxy.Proxy,
                 nats_url: str | None, log_dir: Path | None = None,
                 clock: Callable[[], float] = time.time, interval_s: float = 0.05) -> None:
        if emulator.status_writer is not None:
            raise ValueError("the emulator's status writer is on: the replica controller "
                             "writes the Deployment's status, and there must be one writer")
        self.emulator = emulator
        self.target = target
        self.profile = profile
        self.balancer = balancer
        self.nats_url = nats_url
        self.log_dir = log_dir
        self.clock = clock
        self.interval_s = interval_s
        self.replicas: dict[str, ReplicaRecord] = {}
        self.nodes: list[NodeRecord] = []
        self.samples: list[Sample] = []
        self._pods = emulator.resource("", "pods")
        self._deployments = emulator.resource("apps", "deployments")
        self._node_type = emulator.resource("", "nodes")
        self._tasks: set[asyncio.Task[None]] = set()

    # -- seeding -------------------------------------------------------------------------

    def create_deployment(self, *, replicas: int) -> None:
        """The target Deployment, as `scaler run --local` seeds it (GPU requests included),
        and the Ready nodes that hold its first `replicas` (the simulator's start)."""
        target = self.target
        self.emulator.ensure_namespace(target.namespace)
        labels = {"app": target.name}
        resources = {"requests": {target.resource_name: str(target.gpus_per_replica)},
                     "limits": {target.resource_name: str(target.gpus_per_replica)}}
        self.emulator.store.create(self._deployments, target.namespace, {
            "metadata": {"name": target.name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "sim-server", "image": "scaler-sim-server",
                          "resources": resources}]}}},
        }, manager="kubectl")
        now = self.clock()
        for _ in range(math.ceil(replicas / self.per_node) if replicas else 0):
            self._boot_node(ready_at=now)

    @property
    def per_node(self) -> int:
        return max(1, self.target.pool.gpus_per_node // self.target.gpus_per_replica)

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self.reconcile()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.close()

    def reconcile(self) -> None:
        """One pass: replicas to spec, pods to nodes, starts, readiness, drains, status."""
        now = self.clock()
        deployment = self.emulator.store.find(self._deployments, self.target.namespace,
                                              self.target.name)
        if deployment is None:
            return
        want = int((deployment.get("spec") or {}).get("replicas", 1))
        self._scale(want, now=now)
        self._schedule(now=now)
        self._nodes(now=now)
        for record in list(self.replicas.values()):
            self._advance(record, now=now)
        self._status(deployment)
        self._sample(want, now=now)

    def live(self) -> list[ReplicaRecord]:
        """Replicas that count towards spec.replicas: not draining, not gone."""
        return [r for r in self.replicas.values() if r.phase in ("pending", "starting", "ready")]

    def _scale(self, want: int, *, now: float) -> None:
        live = self.live()
        for _ in range(want - len(live)):
            self._create_pod(now=now)
        if len(live) > want:
            # The ReplicaSet controller's order (the simulator's too): unscheduled, then
            # not ready, then the newest ready.
            rank = {"pending": 0, "starting": 1, "ready": 2}
            victims = sorted(live, key=lambda r: (rank[r.phase], -r.created_at))
            for record in victims[: len(live) - want]:
                if record.phase == "ready":
                    self._drain(record, now=now)
                else:
                    self._gone(record, now=now)

    def _create_pod(self, *, now: float) -> None:
        target = self.target
        deployment = self.emulator.store.get(self._deployments, target.namespace, target.name)
        template = deployment["spec"]["template"]
        name = f"{target.name}-{uuid.uuid4().hex[:10]}"
        self.emulator.store.create(self._pods, target.namespace, {
            "metadata": {"name": name, "labels": dict(template["metadata"]["labels"]),
                         "ownerReferences": [{
                             "apiVersion": "apps/v1", "kind": "Deployment",
                             "name": target.name, "uid": deployment["metadata"]["uid"],
                             "controller": True}]},
            "spec": dict(template["spec"]), "status": {"phase": "Pending"},
        }, manager=deployments.MANAGER)
        self.replicas[name] = ReplicaRecord(pod=name, created_at=now,
                                            gpus=self.target.gpus_per_replica)

    def _schedule(self, *, now: float) -> None:
        """Bind pending pods as the simulator does: a node with room, Ready ones first, then
        booting ones (scheduled when it is up); else boot a node within maxNodes."""
        pending = sorted((r for r in self.replicas.values() if r.phase == "pending"
                          and r.node is None), key=lambda r: r.created_at)
        for record in pending:
            node = self._room(record.gpus, now=now)
            if node is None:
                pool = self.target.pool
                if pool.max_nodes is not None and self._live_nodes() >= pool.max_nodes:
                    continue
                node = self._boot_node(ready_at=now + pool.node_boot_s)
            node.used += record.gpus
            node.empty_since = None
            record.node = node.name
            record.scheduled_at = max(now, node.ready_at)

    def _room(self, gpus: int, *, now: float) -> NodeRecord | None:
        fits = [n for n in self.nodes if not n.gone and n.gpus - n.used >= gpus]
        fits.sort(key=lambda n: (n.ready_at > now, n.ready_at))
        return fits[0] if fits else None

    def _live_nodes(self) -> int:
        return sum(1 for n in self.nodes if not n.gone)

    def _boot_node(self, *, ready_at: float) -> NodeRecord:
        node = NodeRecord(name=f"{self.target.pool_name}-{len(self.nodes)}", ready_at=ready_at,
                          gpus=self.target.pool.gpus_per_node)
        self.nodes.append(node)
        return node

    def _nodes(self, *, now: float) -> None:
        """Nodes register when booted (the kubelet's Node object) and go after
        NODE_UNNEEDED_S empty (the cluster autoscaler's scale-down-unneeded-time)."""
        store = self.emulator.store
        for node in self.nodes:
            if not node.registered and not node.gone and node.ready_at <= now:
                seed = local.PoolSeed(name=self.target.pool_name, nodes=1,
                                      gpus_per_node=node.gpus,
                                      resource_names=(self.target.resource_name,),
                                      labels=self.target.node_labels)
                manifest = local.node_manifest(seed, node.name)
                store.create(self._node_type, None, manifest, manager="kubelet")
                created = store.get(self._node_type, None, node.name)
                store.update(self._node_type, None, node.name,
                             {**created, "status": manifest["status"]}, subresource="status",
                             manager="kubelet")
                node.registered = True
            if (node.registered and not node.gone and node.used == 0
                    and node.empty_since is not None
                    and now - node.empty_since >= sim_cluster.NODE_UNNEEDED_S):
                store.delete(self._node_type, None, node.name)
                node.gone = True

    def _advance(self, record: ReplicaRecord, *, now: float) -> None:
        cold = self.profile.cold_start
        if record.phase == "starting" and record.scheduled_at is not None:
            if not record.spawned and now >= record.scheduled_at:
                # Bound to its node: the process starts now (its Python start-up is part
                # of the pull and load), the container "runs" once the pull is done.
                self._bind(record, now=now)
                record.spawned = True
                self._track(self._start(record))
            if (record.spawned and record.started_at is None
                    and now >= record.scheduled_at + cold.image_pull_seconds):
                record.started_at = now
                self._pod_status(record, running=True, ready=False, now=now)
            due = record.scheduled_at + cold.pod_start_seconds
            if record.started_at is not None and now >= due and record.url:
                record.late_s = max(0.0, now - due - self.interval_s)
                record.ready_at = now
                self._pod_status(record, running=True, ready=True, now=now)
                self.balancer.add(record.pod, record.url)
        elif record.phase == "draining" and not self.balancer.outstanding(record.pod):
            self._gone(record, now=now)

    def _bind(self, record: ReplicaRecord, *, now: float) -> None:
        store = self.emulator.store
        pod = store.get(self._pods, self.target.namespace, record.pod)
        pod = store.update(self._pods, self.target.namespace, record.pod,
                           {**pod, "spec": {**pod["spec"], "nodeName": record.node}},
                           manager="kube-scheduler")
        status = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(now)}]}
        store.update(self._pods, self.target.namespace, record.pod, {**pod, "status": status},
                     subresource="status", manager="kube-scheduler")

    def _pod_status(self, record: ReplicaRecord, *, running: bool, ready: bool,
                    now: float) -> None:
        store = self.emulator.store
        pod = store.find(self._pods, self.target.namespace, record.pod)
        if pod is None:
            return
        status = dict(pod.get("status") or {})
        conditions = list(status.get("conditions") or [])
        if running:
            status["phase"] = "Running"
            status["containerStatuses"] = [{
                "name": "sim-server", "image": "scaler-sim-server", "imageID": "",
                "ready": ready, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": rfc3339(record.started_at or now)}}}]
        if ready:
            conditions += [{"type": kind, "status": "True", "lastTransitionTime": rfc3339(now)}
                           for kind in ("ContainersReady", "Ready")]
        status["conditions"] = conditions
        store.update(self._pods, self.target.namespace, record.pod, {**pod, "status": status},
                     subresource="status", manager="kubelet")

    def _drain(self, record: ReplicaRecord, *, now: float) -> None:
        """Out of the proxy (no new requests) and Terminating; gone once it has served
        what it had (`_advance`)."""
        record.drain_at = now
        self.balancer.remove(record.pod)
        with contextlib.suppress(emulator_store.StoreError):
            self.emulator.store.mark_deleting(self._pods, self.target.namespace, record.pod)

    def _gone(self, record: ReplicaRecord, *, now: float) -> None:
        record.gone_at = now
        self.balancer.remove(record.pod)
        with contextlib.suppress(emulator_store.StoreError):
            self.emulator.store.delete(self._pods, self.target.namespace, record.pod)
        for node in self.nodes:
            if node.name == record.node:
                node.used -= record.gpus
                if node.used == 0:
                    node.empty_since = now
        if record.process is not None:
            self._track(stop_process(record.process))

    def _status(self, deployment: dict[str, Any]) -> None:
        live = {r.pod for r in self.live()}
        pods = [p for p in deployments.owned_pods(self.emulator.store, self._pods, deployment)
                if p["metadata"]["name"] in live]
        with contextlib.suppress(emulator_store.StoreError):
            deployments.write_status(self.emulator.store, deployment, pods=pods)

    def _sample(self, want: int, *, now: float) -> None:
        records = self.replicas.values()
        sample = Sample(at=now, desired=want,
                        allocated=sum(1 for r in records if r.phase != "gone"),
                        ready=sum(1 for r in records if r.phase == "ready"),
                        nodes=sum(1 for n in self.nodes if not n.gone))
        last = self.samples[-1] if self.samples else None
        if last is None or (last.desired, last.allocated, last.ready, last.nodes) != (
                sample.desired, sample.allocated, sample.ready, sample.nodes):
            self.samples.append(sample)

    # -- processes -----------------------------------------------------------------------

    def command(self, record: ReplicaRecord) -> list[str]:
        """The pod's container: `scaler sim-server` with this profile, on a free port."""
        target = self.target
        argv = [sys.executable, "-m", "scaler", "sim-server", "--profile",
                str(target.profile_path), "--port", "0", "--served-model-name",
                target.served_model, "--output-tokens", "max"]
        if self.nats_url is not None:
            argv += ["--nats", self.nats_url, "--model-key",
                     f"{target.namespace}/{target.name}", "--source", record.pod]
        return argv

    async def _start(self, record: ReplicaRecord) -> None:
        stderr: Any = asyncio.subprocess.DEVNULL
        if self.log_dir is not None:
            stderr = (self.log_dir / f"{record.pod}.log").open("wb")
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(record), stdout=asyncio.subprocess.PIPE, stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL)
        finally:
            if stderr is not asyncio.subprocess.DEVNULL:
                stderr.close()
        record.process = process
        if record.gone_at is not None:  # removed while it was being started
            await stop_process(process)
            return
        assert process.stdout is not None
        while line := await process.stdout.readline():
            found = _URL_LINE.search(line)
            if found and record.url is None:
                record.url = found.group(1).decode()
        if record.gone_at is None:
            log.warning("sim-server of %s exited with %s", record.pod, await process.wait())

    def _track(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every process (their pods stay: the run is over)."""
        now = self.clock()
        for record in self.replicas.values():
            if record.gone_at is None:
                record.gone_at = now
                if record.process is not None:
                    self._track(stop_process(record.process))
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S * 2)
        for task in tasks:
            task.cancel()


async def stop_process(process: asyncio.subprocess.Process) -> None:
    """SIGTERM (a pod's deletion), then SIGKILL after STOP_TIMEOUT_S (its grace period)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def node_labels(pool_name: str, selector: dict[str, str]) -> dict[str, str]:
    """The labels of the pool's nodes, as `scaler run --local` gives them."""
    return {nodepool.POOL_LABEL: pool_name, **selector}
