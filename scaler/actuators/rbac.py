"""The exact RBAC rules the Kubernetes adapters need, as data (docs and tests use it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scope = Literal["cluster", "targets", "lease", "placeholder", "clusterapi"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One RBAC rule. scope: where it is granted: `cluster` (ClusterRole), `targets` (each
    namespace holding scaled targets: ClusterRole, or one RoleBinding per namespace),
    `lease` / `placeholder` / `clusterapi` (a Role in that one namespace)."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    scope: Scope
    why: str


RULES: tuple[Rule, ...] = (
    Rule("", ("pods",), ("list", "watch"), "cluster",
         "pod start timelines; GPUs in use on pool nodes (any namespace)"),
    Rule("", ("nodes",), ("list", "watch"), "cluster",
         "pool capacity: allocatable GPUs, Ready, cordoned"),
    Rule("apps", ("deployments/scale", "statefulsets/scale"), ("get", "patch"), "targets",
         "read and set replicas of targets"),
    Rule("leaderworkerset.x-k8s.io", ("leaderworkersets/scale",), ("get", "patch"), "targets",
         "LeaderWorkerSet targets (add a rule like it for any other CRD target)"),
    Rule("autoscaling", ("horizontalpodautoscalers",), ("list",), "targets",
         "do not fight an HPA that owns a target"),
    Rule("keda.sh", ("scaledobjects",), ("list",), "targets",
         "do not fight a KEDA ScaledObject (optional: 403/404 read as none)"),
    Rule("", ("events",), ("create",), "targets", "an Event per applied change"),
    Rule("coordination.k8s.io", ("leases",), ("get", "create", "update"), "lease",
         "leader election on one Lease"),
    Rule("apps", ("deployments",), ("get", "create", "patch"), "placeholder",
         "the placeholder Deployments of node pools"),
    Rule("cluster.x-k8s.io", ("machinedeployments",), ("get",), "clusterapi",
         "read a pool's MachineDeployment and its autoscaler bounds"),
    Rule("cluster.x-k8s.io", ("machinedeployments/scale",), ("patch",), "clusterapi",
         "set a pool's machine count"),
)

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>[^/]+))?$")


def request_attributes(method: str, path: str, *, watch: bool = False
                       ) -> tuple[str, str, str] | None:
    """(api group, resource[/subresource], verb) of a request, as the API server's RBAC
    authorizer sees it; None for paths that are not resources."""
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
    return group, resource, verb


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(group == r.api_group and resource in r.resources and verb in r.verbs
               for r in RULES)


def manifests(*, name: str = "scaler", lease_namespace: str, placeholder_namespace: str,
              clusterapi_namespace: str) -> list[dict[str, object]]:
    """The ClusterRole (cluster and target rules) and one Role per single-namespace scope."""

    def rules(scopes: set[str]) -> list[dict[str, object]]:
        return [{"apiGroups": [r.api_group], "resources": list(r.resources),
                 "verbs": list(r.verbs)} for r in RULES if r.scope in scopes]

    documents: list[dict[str, object]] = [{
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules({"cluster", "targets"})}]
    for scope, namespace in (("lease", lease_namespace), ("placeholder", placeholder_namespace),
                             ("clusterapi", clusterapi_namespace)):
        documents.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": f"{name}-{scope}", "namespace": namespace},
            "rules": rules({scope})})
    return documents
