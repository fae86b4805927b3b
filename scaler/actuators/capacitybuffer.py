"""The capacitybuffer node-pool actuator: warm nodes as a Cluster Autoscaler CapacityBuffer."""

from __future__ import annotations

import logging

from scaler.actuators import base, nodepool, replicas
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.engine import types
from scaler.policy import model

log = logging.getLogger(__name__)

GROUP = "autoscaling.x-k8s.io"
PLURAL = "capacitybuffers"
KIND = "CapacityBuffer"
# The one strategy Cluster Autoscaler implements (and the CRD's default): it injects
# virtual pods of the template, one per buffer replica, into its scale-up simulation.
ACTIVE_CAPACITY = "buffer.x-k8s.io/active-capacity"


def buffer_name(pool: model.NodePool) -> str:
    """The CapacityBuffer's name, also its PodTemplate's: `scaler-<pool>`."""
    return f"scaler-{pool.name}"[:63].rstrip("-")


def chunk_template(pool: model.NodePool, plan: types.NodePlan, *,
                   settings: kube_settings.PlaceholderSettings) -> kube.Obj:
    """One buffer chunk: the placeholder pod shape (a pause container requesting a whole
    node's GPUs, the pool's tolerations and node affinity), without a PriorityClass.

    The spec's model is "replicas chunks of the template's shape": with gpusPerNode 8 a
    chunk requests 8 GPUs, fits only an empty node, so 2 replicas hold exactly 2 warm
    nodes, the unit the engine plans in. Chunks are virtual pods the autoscaler simulates;
    nothing is scheduled or preempted, so a PriorityClass (which may not exist) is dropped.
    """
    template = nodepool.placeholder_template(pool, plan, settings=settings)
    template["spec"].pop("priorityClassName", None)
    return template


def pod_template(pool: model.NodePool, plan: types.NodePlan, *,
                 settings: kube_settings.KubeSettings) -> kube.Obj:
    template = chunk_template(pool, plan, settings=settings.placeholder)
    return {
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": buffer_name(pool), "namespace": settings.capacitybuffer.namespace,
                     "labels": {nodepool.POOL_LABEL: pool.name},
                     "annotations": {nodepool.HASH_ANNOTATION: nodepool.template_digest(
                         template)}},
        "template": template,
    }


def capacity_buffer(pool: model.NodePool, plan: types.NodePlan, *,
                    settings: kube_settings.CapacityBufferSettings) -> kube.Obj:
    """`spec.replicas` = the plan's headroom nodes, chunks of `podTemplateRef`'s shape.

    Neither `percentage` (of a scalableRef's replicas: the pool's plan spans several
    models and holds a static floor, so it is not a fraction of one workload) nor `limits`
    (the plan is already capped by maxNodes) is set.
    """
    return {
        "apiVersion": f"{GROUP}/{settings.version}", "kind": KIND,
        "metadata": {"name": buffer_name(pool), "namespace": settings.namespace,
                     "labels": {nodepool.POOL_LABEL: pool.name}},
        "spec": {"provisioningStrategy": ACTIVE_CAPACITY,
                 "podTemplateRef": {"name": buffer_name(pool)},
                 "replicas": plan.placeholder_pods},
    }


class CapacityBufferActuator:
    """Implements `base.NodePoolActuator` with one CapacityBuffer and its PodTemplate.

    Flow: leader? -> GET the buffer (404: is the CRD served at all?) -> GET the PodTemplate
    -> nothing differs? UNCHANGED, no write -> dry-run? -> write the template first (the
    buffer never names a template that is not there yet), preconditioned on the
    resourceVersion read (no controller writes PodTemplates) -> write the buffer's
    replicas with `replicas.guarded_patch` (a test of spec.replicas, so the autoscaler's
    status writes are never a conflict). Transient errors are retried by `kube.KubeApi`.
    """

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 leader: base.LeaderElector) -> None:
        self.api = api
        self.settings = settings
        self.leader = leader

    def _collection(self, api_version: str, plural: str) -> str:
        root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return f"{root}/namespaces/{self.settings.capacitybuffer.namespace}/{plural}"

    async def missing_crd(self) -> str | None:
        """Why no CapacityBuffer can be written here (the CRD is not installed), or None.

        Asked of discovery after a 404: a missing object and a missing type both answer
        404, and autoscaling.x-k8s.io may be served for ProvisioningRequests alone.
        """
        version = f"{GROUP}/{self.settings.capacitybuffer.version}"
        try:
            listing = await self.api.get(f"/apis/{version}")
        except kube.KubeError as error:
            if not error.not_found:
                raise
            listing = {}
        if any(r.get("name") == PLURAL for r in listing.get("resources") or []):
            return None
        return (f"CRD {PLURAL}.{GROUP} ({version}) is not installed: install Cluster "
                "Autoscaler's CapacityBuffer CRD (1.34+; v1beta1 needs 1.35+), or pick "
                "another nodePool.actuator")

    async def apply(self, pool: model.NodePool, plan: types.NodePlan) -> base.ApplyOutcome:
        settings = self.settings.capacitybuffer
        want = capacity_buffer(pool, plan, settings=settings)
        template = pod_template(pool, plan, settings=self.settings)
        collection = self._collection(f"{GROUP}/{settings.version}", PLURAL)
        path = f"{collection}/{want['metadata']['name']}"
        target = f"{KIND}/{settings.namespace}/{want['metadata']['name']}"
        wanted = plan.placeholder_pods

        def outcome(kind: base.Outcome, previous: int | None, reason: str) -> base.ApplyOutcome:
            return base.ApplyOutcome(kind, target, previous, wanted, reason)

        if not self.leader.is_leader:
            return outcome(base.Outcome.NOT_LEADER, None, "not the leader")
        current: kube.Obj | None
        try:
            current = await self.api.get(path)
            missing = None
        except kube.KubeError as error:
            if not error.not_found:
                return outcome(base.Outcome.FAILED, None, f"cannot read: {error}")
            current = None
            try:
                missing = await self.missing_crd()
            except kube.KubeError as discovery_error:
                return outcome(base.Outcome.FAILED, None, f"cannot read: {discovery_error}")
        if missing is not None:
            log.warning("node pool %s: %s", pool.name, missing)
            return outcome(base.Outcome.FAILED, None, missing)
        if current is None and wanted == 0:
            return outcome(base.Outcome.UNCHANGED, 0, "no headroom wanted, none exists")
        previous = replicas.spec_replicas(current) if current is not None else 0
        spec = (current or {}).get("spec") or {}
        also: list[kube.Obj] = []
        if spec.get("podTemplateRef") != want["spec"]["podTemplateRef"]:
            also.append({"op": "add", "path": "/spec/podTemplateRef",
                         "value": want["spec"]["podTemplateRef"]})
        if "scalableRef" in spec:  # exclusive with podTemplateRef (the CRD's CEL rule)
            also.append({"op": "remove", "path": "/spec/scalableRef"})
        template_path = f"{self._collection('v1', 'podtemplates')}/{buffer_name(pool)}"
        try:
            stored_template: kube.Obj | None = await self.api.get(template_path)
        except kube.KubeError as error:
            if not error.not_found:
                return outcome(base.Outcome.FAILED, previous, f"cannot read PodTemplate: {error}")
            stored_template = None
        stored_meta = (stored_template or {}).get("metadata") or {}
        template_stale = stored_template is None or (stored_meta.get("annotations") or {}).get(
            nodepool.HASH_ANNOTATION) != template["metadata"]["annotations"][
            nodepool.HASH_ANNOTATION]
        if current is not None and previous == wanted and not also and not template_stale:
            return outcome(base.Outcome.UNCHANGED, previous, "already as planned")
        if self.settings.dry_run:
            verb = "create" if current is None else f"set {previous} -> {wanted} chunks"
            return outcome(base.Outcome.DRY_RUN, previous, f"would {verb}")
        if template_stale:
            failed = await self._write_template(template_path, stored_template, template)
            if failed is not None:
                return outcome(failed[0], previous, failed[1])
        reason = "; ".join(plan.reasons) or "resized"
        if current is None:
            try:
                await self.api.request("POST", collection, body=want)
            except kube.KubeError as error:
                kind = base.Outcome.CONFLICT if error.status == 409 else base.Outcome.FAILED
                return outcome(kind, 0, f"create failed: {error}")
            log.info("capacity buffer of pool %s: created with %d chunks", pool.name, wanted)
            return outcome(base.Outcome.APPLIED, 0, f"created with {wanted} chunks; {reason}")
        if previous != wanted or also:
            written = await replicas.guarded_patch(self.api, path, read=current,
                                                   replicas=wanted, also=tuple(also))
            if written.outcome is not base.Outcome.APPLIED:
                return outcome(written.outcome, written.current, written.reason)
        log.info("capacity buffer of pool %s: %d -> %d chunks", pool.name, previous, wanted)
        return outcome(base.Outcome.APPLIED, previous, reason)

    async def _write_template(self, path: str, stored: kube.Obj | None, want: kube.Obj
                              ) -> tuple[base.Outcome, str] | None:
        """Create the PodTemplate, or replace its template and hash; None when written."""
        try:
            if stored is None:
                collection = path.rsplit("/", 1)[0]
                await self.api.request("POST", collection, body=want)
                return None
            await self.api.json_patch(path, [
                {"op": "test", "path": "/metadata/resourceVersion",
                 "value": stored["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/template", "value": want["template"]},
                nodepool.annotation_op(stored, nodepool.HASH_ANNOTATION,
                                       want["metadata"]["annotations"][nodepool.HASH_ANNOTATION]),
            ])
        except kube.KubeError as error:
            if stored is not None and (error.status == 422 or error.conflict):
                # A failed test and an invalid value are both 422: the re-read tells them apart.
                try:
                    now = await self.api.get(path)
                except kube.KubeError as read_error:
                    return (base.Outcome.FAILED,
                            f"PodTemplate write refused ({error}); re-read failed: {read_error}")
                if now["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                    return (base.Outcome.CONFLICT,
                            "PodTemplate changed since it was read (another writer): re-plan")
            kind = base.Outcome.CONFLICT if error.status == 409 else base.Outcome.FAILED
            return kind, f"PodTemplate write failed: {error}"
        return None
