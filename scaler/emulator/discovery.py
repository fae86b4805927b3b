"""API discovery documents (/api, /apis, /apis/<group>/<version>) for the emulated types."""

from __future__ import annotations

from scaler.emulator.store import Obj, ResourceType

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def group_versions(types: list[ResourceType]) -> dict[str, list[str]]:
    """group ("" for core) -> its versions, in the order the types name them."""
    out: dict[str, list[str]] = {}
    for rtype in types:
        versions = out.setdefault(rtype.group, [])
        if rtype.version not in versions:
            versions.append(rtype.version)
    return out


def version() -> Obj:
    """/version: the Kubernetes minor version whose semantics the emulator follows."""
    return {"major": "1", "minor": "28", "gitVersion": "v1.28.0-scaler-emulator",
            "platform": "linux/amd64"}


def api_versions() -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def _group(group: str, versions: list[str]) -> Obj:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(types: list[ResourceType]) -> Obj:
    groups = [_group(g, v) for g, v in group_versions(types).items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(group: str, versions: list[str]) -> Obj:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def resource_list(group: str, version: str, types: list[ResourceType],
                  *, create_only: tuple[ResourceType, ...]) -> Obj:
    """The APIResourceList of one group version, subresources included."""
    resources: list[Obj] = []
    for rtype in types:
        if (rtype.group, rtype.version) != (group, version):
            continue
        base = {"singularName": rtype.kind.lower(), "namespaced": rtype.namespaced,
                "kind": rtype.kind}
        verbs = ["create"] if rtype in create_only else _VERBS
        resources.append({"name": rtype.plural, **base, "verbs": verbs})
        if rtype.has_status:
            resources.append({"name": f"{rtype.plural}/status", **base, "singularName": "",
                              "verbs": ["get", "patch", "update"]})
        if rtype.scale_spec:
            resources.append({"name": f"{rtype.plural}/scale", **base, "singularName": "",
                              "group": "autoscaling", "version": "v1", "kind": "Scale",
                              "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}
