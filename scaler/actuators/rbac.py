"""The exact RBAC the Kubernetes adapters need, as data: `scaler kube rbac` prints it, the
Helm chart renders the same objects, and tests check both against every request made."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from scaler.actuators import resources
from scaler.actuators import settings as kube_settings
from scaler.core import errors
from scaler.policy import model

Scope = Literal["cluster", "targets", "lease", "learned", "placeholder", "clusterapi",
                "capacitybuffer", "policies", "deletioncost", "fleet"]
Obj = dict[str, Any]  # one manifest, as YAML loads it

API_VERSION = "rbac.authorization.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class Rule:
    """One RBAC rule. scope: where it is granted: `cluster` (a ClusterRole: nodes are not
    namespaced), `targets` (a Role in each watched namespace, or one ClusterRole when
    cluster-wide), `lease` / `learned` / `placeholder` / `clusterapi` / `capacitybuffer` (a
    Role in that one namespace)."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    scope: Scope
    why: str


RULES: tuple[Rule, ...] = (
    Rule("", ("nodes",), ("list", "watch"), "cluster",
         "pool capacity: allocatable GPUs, Ready, cordoned (nodes are cluster-scoped)"),
    Rule("", ("pods",), ("list", "watch"), "targets",
         "pod start timelines, ready and starting replicas, GPUs in use on pool nodes"),
    Rule("resource.k8s.io", ("resourceslices", "deviceclasses"), ("list", "watch"), "cluster",
         "DRA pool capacity: the devices of a policy's DeviceClass (read only for policies "
         "with resources.deviceClassName; both are cluster-scoped)"),
    Rule("resource.k8s.io", ("resourceclaims",), ("list", "watch"), "targets",
         "DRA devices in use: the allocated ResourceClaims of replicas"),
    Rule("apps", ("deployments", "statefulsets"), ("list", "watch"), "targets",
         "replicas and selector of Deployment and StatefulSet targets, watched rather than "
         "a GET of /scale at every read"),
    Rule("apps", ("deployments/scale", "statefulsets/scale"), ("get", "patch"), "targets",
         "read replicas before a write (and of other kinds at every read), set replicas"),
    Rule("leaderworkerset.x-k8s.io", ("leaderworkersets/scale",), ("get", "patch"), "targets",
         "LeaderWorkerSet targets (add a rule like it for any other CRD target)"),
    Rule("autoscaling", ("horizontalpodautoscalers",), ("list",), "targets",
         "do not fight an HPA that owns a target"),
    Rule("keda.sh", ("scaledobjects",), ("list",), "targets",
         "do not fight a KEDA ScaledObject (optional: 403/404 read as none)"),
    Rule("", ("events",), ("create",), "targets", "an Event per applied change"),
    Rule("", ("pods",), ("patch",), "deletioncost",
         "pod-deletion-cost annotations before a scale-down (only with "
         "kube.deletion_cost.enabled; granted with the targets' rules)"),
    Rule("scaler.io", ("scalepolicies",), ("list", "watch"), "policies",
         "ScalePolicy resources as policies (only with policies.resources; granted with the "
         "targets' rules, where the targets are)"),
    Rule("scaler.io", ("scalepolicies/status",), ("patch",), "policies",
         "the leader writes each ScalePolicy resource's status"),
    Rule("scaler.io", ("gpupools", "gpubudgets"), ("get", "list", "watch"), "fleet",
         "GpuPool and GpuBudget resources (only with policies.resources; cluster-scoped; "
         "get as well, which kubectl and users reading one object need)"),
    Rule("scaler.io", ("gpupools/status", "gpubudgets/status"), ("patch",), "fleet",
         "the leader writes each GpuPool's and GpuBudget's Valid condition"),
    Rule("coordination.k8s.io", ("leases",), ("get", "create", "update"), "lease",
         "leader election on one Lease"),
    Rule("", ("configmaps",), ("get", "create", "update"), "learned",
         "the engine's learned state, kept across restarts in one ConfigMap beside the Lease "
         "(only with kube.learned_state.enabled)"),
    Rule("apps", ("deployments",), ("get", "create", "patch"), "placeholder",
         "the placeholder Deployments of node pools (only with kube.placeholder.enabled)"),
    Rule("cluster.x-k8s.io", ("machinedeployments",), ("get",), "clusterapi",
         "read a pool's MachineDeployment and its autoscaler bounds"),
    Rule("cluster.x-k8s.io", ("machinedeployments/scale",), ("patch",), "clusterapi",
         "set a pool's machine count"),
    Rule("autoscaling.x-k8s.io", ("capacitybuffers",), ("get", "create", "patch"),
         "capacitybuffer", "the CapacityBuffers of node pools (only with "
         "kube.capacitybuffer.enabled)"),
    Rule("", ("podtemplates",), ("get", "create", "patch"), "capacitybuffer",
         "the PodTemplate each CapacityBuffer names (one warm node's shape)"),
)


@dataclass(frozen=True, slots=True)
class Delegation:
    """A binding to a role every cluster has, for the external metrics API. No code uses
    them yet: the aggregated-API authentication (TokenReview, SubjectAccessReview, the
    requestheader CA) that is being added needs exactly these two, so they stay."""

    role_kind: Literal["ClusterRole", "Role"]
    role: str
    namespace: str | None  # of the RoleBinding; None: a ClusterRoleBinding
    suffix: str  # binding name: <name><suffix>
    why: str


DELEGATIONS: tuple[Delegation, ...] = (
    Delegation("ClusterRole", "system:auth-delegator", None, ":system:auth-delegator",
               "create TokenReviews and SubjectAccessReviews for metrics API callers"),
    Delegation("Role", "extension-apiserver-authentication-reader", "kube-system",
               "-auth-reader", "read the ConfigMap kube-system/extension-apiserver-"
               "authentication (requestheader client CA and allowed proxy names)"),
)

# Granted to the HPA controller, not to the scaler: reading the metrics the scaler serves.
HPA_SUBJECT: Obj = {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler",
                    "namespace": "kube-system"}
HPA_READER_RULES: tuple[Obj, ...] = (
    {"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]},)


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """Another kind with a scale subresource the scaler may patch (a CRD)."""

    api_group: str
    resources: tuple[str, ...]  # plurals, without /scale

    @classmethod
    def parse(cls, text: str) -> ScaleTarget:
        """'example.com/llamas' -> ScaleTarget('example.com', ('llamas',))."""
        group, _, resource = text.rpartition("/")
        if not group or not resource:
            raise ValueError(f"scale target {text!r}: expected GROUP/RESOURCE, e.g. "
                             "example.com/llamas")
        return cls(group, (resource,))


@dataclass(frozen=True, slots=True)
class Plan:
    """What to grant and where, resolved from the settings (`plan`)."""

    name: str
    namespace: str  # where the scaler runs: its ServiceAccount
    service_account: str
    target_namespaces: tuple[str, ...]  # empty when cluster-wide
    cluster_wide: bool
    lease_namespace: str | None  # None: no Lease (kube.lease.enabled false)
    learned_namespace: str | None  # None: no learned state kept (kube.learned_state)
    placeholder_namespace: str | None  # None: the placeholder actuator is off
    clusterapi_namespace: str | None  # None: no Cluster API node pools
    capacitybuffer_namespace: str | None  # None: the capacitybuffer actuator is off
    metrics_api: bool  # the APIService is registered: delegations and the HPA's reader
    extra_scale_targets: tuple[ScaleTarget, ...] = ()
    policy_resources: bool = False  # ScalePolicy resources are read (policies.resources)
    deletion_cost: bool = False  # pods are annotated before a scale-down

    @property
    def subject(self) -> Obj:
        return {"kind": "ServiceAccount", "name": self.service_account,
                "namespace": self.namespace}


def plan(settings: kube_settings.KubeSettings, *, name: str, namespace: str,
         service_account: str | None = None, policy_namespaces: Iterable[str] = (),
         clusterapi: bool = False, metrics_api: bool = True,
         extra_scale_targets: Sequence[ScaleTarget] = (), policy_resources: bool = False
         ) -> Plan:
    """The grants the service needs with `settings`. Target namespaces: cluster-wide, else
    `watch_namespaces`, else the policies' namespaces (ValueError when none is known)."""
    targets: tuple[str, ...] = ()
    if not settings.cluster_wide:
        targets = settings.watch_namespaces or tuple(sorted(set(policy_namespaces)))
        if not targets:
            raise ValueError("no namespace to grant targets in: give kube.watch_namespaces "
                             "(--watch-namespace), policies (--policies) or --cluster-wide")
    return Plan(
        name=name, namespace=namespace, service_account=service_account or name,
        target_namespaces=tuple(dict.fromkeys(targets)), cluster_wide=settings.cluster_wide,
        lease_namespace=settings.lease.namespace if settings.lease.enabled else None,
        learned_namespace=(settings.lease.namespace if settings.learned_state.enabled
                           else None),
        placeholder_namespace=(settings.placeholder.namespace
                               if settings.placeholder.enabled else None),
        clusterapi_namespace=settings.clusterapi_namespace if clusterapi else None,
        capacitybuffer_namespace=(settings.capacitybuffer.namespace
                                  if settings.capacitybuffer.enabled else None),
        metrics_api=metrics_api, extra_scale_targets=tuple(extra_scale_targets),
        policy_resources=policy_resources, deletion_cost=settings.deletion_cost.enabled)


def policy_scale_targets(policies: Iterable[model.ScalePolicy], *,
                         plurals: Mapping[str, str] | None = None) -> tuple[ScaleTarget, ...]:
    """The scale subresources of the policies' targets, spec.target and every variant's
    (spec.variants), that `RULES` does not grant already: a variant on a CRD kind
    (example.com Llama) is granted with its policy, as llamas/scale. Sorted, once each."""
    granted = {(rule.api_group, resource) for rule in RULES if rule.scope == "targets"
               for resource in rule.resources}
    wanted: set[tuple[str, str]] = set()
    for policy in policies:
        for target in (policy.spec.target, *(v.target for v in policy.spec.variants)):
            plural = resources.target_plural(target, plurals=plurals)
            if (target.group, f"{plural}/scale") not in granted:
                wanted.add((target.group, plural))
    return tuple(ScaleTarget(group, (plural,)) for group, plural in sorted(wanted))


def _rules(scope: Scope, extra: Sequence[ScaleTarget] = ()) -> list[Obj]:
    rules: list[Obj] = [{"apiGroups": [r.api_group], "resources": list(r.resources),
                         "verbs": list(r.verbs)} for r in RULES if r.scope == scope]
    rules += [{"apiGroups": [t.api_group], "resources": [f"{r}/scale" for r in t.resources],
               "verbs": ["get", "patch"]} for t in extra]
    return rules


def _metadata(name: str, namespace: str | None) -> Obj:
    return {"name": name} if namespace is None else {"name": name, "namespace": namespace}


def _role(name: str, namespace: str | None, rules: list[Obj], subject: Obj) -> list[Obj]:
    """A Role and its RoleBinding in `namespace`, or (None) a ClusterRole and its
    ClusterRoleBinding."""
    kind = "ClusterRole" if namespace is None else "Role"
    return [
        {"apiVersion": API_VERSION, "kind": kind, "metadata": _metadata(name, namespace),
         "rules": rules},
        {"apiVersion": API_VERSION, "kind": f"{kind}Binding",
         "metadata": _metadata(name, namespace),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
         "subjects": [subject]},
    ]


def manifests(grants: Plan) -> list[Obj]:
    """Every object that grants what `grants` says: the ServiceAccount; a ClusterRole for
    nodes; Roles per target namespace (ClusterRole when cluster-wide); the Lease, learned
    state, placeholder, Cluster API and CapacityBuffer Roles; the metrics API's bindings."""
    name, subject = grants.name, grants.subject
    documents: list[Obj] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": _metadata(grants.service_account, grants.namespace)}]
    documents += _role(f"{name}-nodes", None, _rules("cluster"), subject)
    targets = _rules("targets", grants.extra_scale_targets)
    if grants.policy_resources:
        targets += _rules("policies")
        documents += _role(f"{name}-fleet", None, _rules("fleet"), subject)
    if grants.deletion_cost:
        targets += _rules("deletioncost")
    if grants.cluster_wide:
        documents += _role(f"{name}-targets", None, targets, subject)
    for namespace in grants.target_namespaces:
        documents += _role(f"{name}-targets", namespace, targets, subject)
    single: tuple[tuple[Scope, str | None], ...] = (
        ("lease", grants.lease_namespace), ("learned", grants.learned_namespace),
        ("placeholder", grants.placeholder_namespace),
        ("clusterapi", grants.clusterapi_namespace),
        ("capacitybuffer", grants.capacitybuffer_namespace))
    for scope, where in single:
        if where is not None:
            documents += _role(f"{name}-{scope}", where, _rules(scope), subject)
    if grants.metrics_api:
        for delegation in DELEGATIONS:
            kind = "ClusterRoleBinding" if delegation.namespace is None else "RoleBinding"
            documents.append({
                "apiVersion": API_VERSION, "kind": kind,
                "metadata": _metadata(f"{name}{delegation.suffix}", delegation.namespace),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                            "kind": delegation.role_kind, "name": delegation.role},
                "subjects": [subject]})
        documents += _role(f"{name}:external-metrics-reader", None,
                           [dict(rule) for rule in HPA_READER_RULES], HPA_SUBJECT)
    return documents


# -- what a request needs, as the API server's RBAC authorizer sees it ----------------------

@dataclass(frozen=True, slots=True)
class Attributes:
    """namespace None: a cluster-scoped request (nodes, or pods of every namespace)."""

    namespace: str | None
    api_group: str
    resource: str  # with its subresource: deployments/scale
    verb: str


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>[^/]+))?$")


def request_attributes(method: str, path: str, *, watch: bool = False) -> Attributes | None:
    """The attributes of a request; None for paths that are not resources."""
    match = _PATH.match(path)
    if match is None:
        return None
    group = "" if match.group("core") else str(match.group("group"))
    resource = match.group("resource")
    if match.group("sub"):
        resource = f"{resource}/{match.group('sub')}"
    collection = match.group("name") is None
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, "watch" if watch else ("list" if collection else "get"))
    return Attributes(match.group("namespace"), group, resource, verb)


Grant = tuple[str, str, str, str]  # (namespace or "*", api group, resource, verb)


def grants(documents: Iterable[Obj], subject: Obj) -> set[Grant]:
    """What `documents` grant `subject`, as the RBAC authorizer reads them: a ClusterRole
    through a ClusterRoleBinding everywhere ("*"); a Role (or a ClusterRole) through a
    RoleBinding in the binding's namespace only. Roles that are not in `documents` (the
    built-in ones of the delegations) count as granting nothing here."""
    documents = list(documents)
    roles: dict[tuple[str, str | None, str], list[Obj]] = {}
    for obj in documents:
        if obj["kind"] in ("Role", "ClusterRole"):
            meta = obj["metadata"]
            namespace = meta.get("namespace") if obj["kind"] == "Role" else None
            roles[(obj["kind"], namespace, meta["name"])] = obj["rules"]
    out: set[Grant] = set()
    for obj in documents:
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if subject not in obj["subjects"]:
            continue
        ref = obj["roleRef"]
        where = "*" if obj["kind"] == "ClusterRoleBinding" else obj["metadata"]["namespace"]
        role_namespace = where if ref["kind"] == "Role" else None
        for rule in roles.get((ref["kind"], role_namespace, ref["name"]), []):
            out |= {(where, group, resource, verb) for group in rule["apiGroups"]
                    for resource in rule["resources"] for verb in rule["verbs"]}
    return out


def authorizes(grant: Grant, request: Attributes) -> bool:
    """Whether one grant allows the request ("*" wildcards as RBAC reads them)."""
    where, group, resource, verb = grant
    return ((where == "*" or where == request.namespace)
            and group in ("*", request.api_group) and resource in ("*", request.resource)
            and verb in ("*", request.verb))


def allowed(granted: Iterable[Grant], request: Attributes) -> bool:
    return any(authorizes(grant, request) for grant in granted)


def kube_settings_file(path: Path) -> kube_settings.KubeSettings:
    """The `kube` group of a service settings file (the file `scaler run --settings`
    reads; environment variables are not applied). ValueError naming file and field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read settings: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kube") or {}, dict):
        raise ValueError(f"{path}: expected a mapping of settings groups with a kube: mapping")
    try:
        return kube_settings.KubeSettings.model_validate(data.get("kube") or {})
    except pydantic.ValidationError as exc:
        problems = errors.field_problems(exc, unknown_field="unknown setting")
        raise ValueError("\n".join(errors.located(str(path), f"kube.{p.field}", p.message)
                                   for p in problems)) from None
