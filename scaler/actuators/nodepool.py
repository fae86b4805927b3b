"""Node pool actuators: placeholder pause pods (headroom) and Cluster API MachineDeployments."""

from __future__ import annotations

import hashlib
import json
import logging

from scaler.actuators import base, replicas, timeline
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.engine import types
from scaler.policy import model

log = logging.getLogger(__name__)

POOL_LABEL = "scaler.io/pool"
HASH_ANNOTATION = "scaler.io/template-hash"
CAPI_MIN = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
CAPI_MAX = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"


def placeholder_name(pool: model.NodePool) -> str:
    return f"scaler-placeholder-{pool.name}"[:63].rstrip("-")


def placeholder_template(pool: model.NodePool, plan: types.NodePlan, *,
                         settings: kube_settings.PlaceholderSettings) -> kube.Obj:
    """The pod template of one placeholder: a pause container holding a whole node's GPUs.

    With gpusPerNode 8, each placeholder requests 8 GPUs, so the node autoscaler must boot
    one node per placeholder pod; a real replica preempts it (lower PriorityClass) and lands
    on a node that is already up. Extended resources need requests == limits.
    """
    labels = {timeline.PLACEHOLDER_LABEL: "true", POOL_LABEL: pool.name}
    gpus = {plan.resource_name: str(plan.placeholder_gpus)}
    spec: kube.Obj = {
        "priorityClassName": settings.priority_class,
        "terminationGracePeriodSeconds": 0,
        "tolerations": ([t.manifest() for t in pool.tolerations] if pool.tolerations is not None
                        else [dict(t) for t in settings.tolerations]),
        "containers": [{
            "name": "pause", "image": settings.image,
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi", **gpus},
                          "limits": {"memory": "16Mi", **gpus}},
        }],
    }
    if pool.node_selector:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(pool.node_selector.items())
            ]}]}}}
    return {"metadata": {"labels": labels}, "spec": spec}


def template_digest(template: kube.Obj) -> str:
    """What `HASH_ANNOTATION` holds: the API server adds defaults to a stored template, so
    comparing templates would always differ; a hash of what we asked for tells us instead."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def placeholder_deployment(pool: model.NodePool, plan: types.NodePlan, *,
                           settings: kube_settings.PlaceholderSettings) -> kube.Obj:
    template = placeholder_template(pool, plan, settings=settings)
    digest = template_digest(template)
    labels = {timeline.PLACEHOLDER_LABEL: "true", POOL_LABEL: pool.name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": placeholder_name(pool), "namespace": settings.namespace,
                     "labels": labels, "annotations": {HASH_ANNOTATION: digest}},
        "spec": {"replicas": plan.placeholder_pods, "selector": {"matchLabels": labels},
                 "template": template},
    }


class _PoolActuator:
    """What both pool actuators hold: the API, the settings and the leader gate."""

    def __init__(self, api: kube.KubeApi, *, settings: kube_settings.KubeSettings,
                 leader: base.LeaderElector) -> None:
        self.api = api
        self.settings = settings
        self.leader = leader


class PlaceholderActuator(_PoolActuator):
    """Implements `base.NodePoolActuator` with a Deployment of low-priority pause pods."""

    async def apply(self, pool: model.NodePool, plan: types.NodePlan) -> base.ApplyOutcome:
        want = placeholder_deployment(pool, plan, settings=self.settings.placeholder)
        namespace = self.settings.placeholder.namespace
        collection = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        path = f"{collection}/{want['metadata']['name']}"
        target = f"Deployment/{namespace}/{want['metadata']['name']}"

        def outcome(kind: base.Outcome, previous: int | None, reason: str) -> base.ApplyOutcome:
            return base.ApplyOutcome(kind, target, previous, plan.placeholder_pods, reason)

        if not self.leader.is_leader:
            return outcome(base.Outcome.NOT_LEADER, None, "not the leader")
        try:
            current = await self.api.get(path)
        except kube.KubeError as error:
            if not error.not_found:
                return outcome(base.Outcome.FAILED, None, f"cannot read: {error}")
            if plan.placeholder_pods == 0:
                return outcome(base.Outcome.UNCHANGED, 0, "no headroom wanted, none exists")
            if self.settings.dry_run:
                return outcome(base.Outcome.DRY_RUN, 0, "would create")
            try:
                await self.api.request("POST", collection, body=want)
            except kube.KubeError as create_error:
                kind = base.Outcome.CONFLICT if create_error.status == 409 else base.Outcome.FAILED
                return outcome(kind, 0, f"create failed: {create_error}")
            return outcome(base.Outcome.APPLIED, 0,
                           f"created with {plan.placeholder_pods} placeholder pods")
        current_pods = replicas.spec_replicas(current)
        digest = ((current.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION)
        wanted_digest = want["metadata"]["annotations"][HASH_ANNOTATION]
        if current_pods == plan.placeholder_pods and digest == wanted_digest:
            return outcome(base.Outcome.UNCHANGED, current_pods, "already as planned")
        if self.settings.dry_run:
            return outcome(base.Outcome.DRY_RUN, current_pods,
                           f"would set {current_pods} -> {plan.placeholder_pods} placeholder pods")
        # One JSON patch carries replicas and template together (never half of a change),
        # guarded by spec.replicas as read, not by the resourceVersion the deployment
        # controller moves with every status write.
        template: tuple[kube.Obj, ...] = ()
        if digest != wanted_digest:
            template = ({"op": "add", "path": "/spec/template", "value": want["spec"]["template"]},
                        annotation_op(current, HASH_ANNOTATION, wanted_digest))
        written = await replicas.guarded_patch(self.api, path, read=current,
                                               replicas=plan.placeholder_pods, also=template)
        if written.outcome is not base.Outcome.APPLIED:
            return outcome(written.outcome, written.current, written.reason)
        log.info("placeholders of pool %s: %d -> %d", pool.name, current_pods,
                 plan.placeholder_pods)
        return outcome(base.Outcome.APPLIED, current_pods, "; ".join(plan.reasons) or "resized")


def annotation_op(obj: kube.Obj, key: str, value: str) -> kube.Obj:
    """A JSON patch op setting one annotation, keeping the others (the deployment controller
    keeps its revision there); `/` in the key is `~1` in a JSON pointer."""
    if isinstance((obj.get("metadata") or {}).get("annotations"), dict):
        pointer = key.replace("~", "~0").replace("/", "~1")
        return {"op": "add", "path": f"/metadata/annotations/{pointer}", "value": value}
    return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}


def _annotation_int(annotations: dict[str, str], key: str) -> int | None:
    try:
        return int(annotations[key])
    except (KeyError, ValueError):
        return None


def machine_count(*, wanted: int, current: int, pool: model.NodePool,
                  annotations: dict[str, str]) -> tuple[int, list[str]]:
    """Machines to ask for: the plan's nodes within the MachineDeployment's autoscaler
    bounds and the pool's maxNodes; never fewer than now unless the pool allows scale-down.

    wanted 7, current 3, max-size 5 -> 5 ("max 5"); wanted 1, current 3, scaleDown false
    -> 3 (node removal stays with the cluster's own node autoscaler).
    """
    notes: list[str] = []
    low = _annotation_int(annotations, CAPI_MIN) or 0
    highs = [h for h in (_annotation_int(annotations, CAPI_MAX), pool.max_nodes) if h is not None]
    desired = max(wanted, low)
    if desired != wanted:
        notes.append(f"min {low}")
    if highs and desired > min(highs):
        desired = min(highs)
        notes.append(f"max {desired}")
    if desired < current and not pool.scale_down:
        notes.append(f"scale-down left to the node autoscaler (keeps {current})")
        desired = current
    return desired, notes


class ClusterApiActuator(_PoolActuator):
    """Implements `base.NodePoolActuator` by patching `machinedeployments/scale`."""

    async def apply(self, pool: model.NodePool, plan: types.NodePlan) -> base.ApplyOutcome:
        namespace = self.settings.clusterapi_namespace
        name = pool.machine_deployment or pool.name
        path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{namespace}/machinedeployments/{name}"
        target = f"MachineDeployment/{namespace}/{name}"
        if not self.leader.is_leader:
            return base.ApplyOutcome(base.Outcome.NOT_LEADER, target, None, plan.nodes_wanted,
                                     "not the leader")
        try:
            machine_deployment = await self.api.get(path)
        except kube.KubeError as error:
            return base.ApplyOutcome(base.Outcome.FAILED, target, None, plan.nodes_wanted,
                                     f"cannot read: {error}")
        current = int((machine_deployment.get("spec") or {}).get("replicas") or 0)
        desired, notes = machine_count(
            wanted=plan.nodes_wanted, current=current, pool=pool,
            annotations=dict((machine_deployment.get("metadata") or {}).get("annotations") or {}))
        reason = "; ".join([*plan.reasons, *notes])

        def outcome(kind: base.Outcome, why: str) -> base.ApplyOutcome:
            return base.ApplyOutcome(kind, target, current, desired, why)

        if desired == current:
            return outcome(base.Outcome.UNCHANGED, reason or "already as planned")
        if self.settings.dry_run:
            return outcome(base.Outcome.DRY_RUN, f"would set {current} -> {desired}; {reason}")
        # The patch goes to `/scale` (RBAC grants patch there only), so its test is written
        # against the Scale this read stands for, which omits replicas when 0.
        scale = {"spec": {"replicas": current} if current else {}}
        written = await replicas.guarded_patch(self.api, f"{path}/scale", read=scale,
                                               replicas=desired, read_path=path)
        if written.outcome is not base.Outcome.APPLIED:
            return outcome(written.outcome, written.reason)
        log.info("machines of pool %s: %d -> %d (%s)", pool.name, current, desired, reason)
        return outcome(base.Outcome.APPLIED, reason or f"{current} -> {desired}")
