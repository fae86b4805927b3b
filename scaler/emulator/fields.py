"""`metadata.managedFields` as the API server keeps it for non-apply writes (operation Update).

Each write records which fields it changed under its field manager (the `fieldManager`
query parameter, else the client's User-Agent up to the first `/`), and takes those fields
away from every other manager. Field sets are FieldsV1: `{"f:spec": {"f:replicas": {}}}`,
list items with a merge key (`patch.MERGE_KEYS`) as `k:{"name":"main"}`, other lists
whole (atomic).
"""

from __future__ import annotations

import json
from typing import Any

from scaler.emulator import patch as patching
from scaler.emulator.apierrors import Obj

Path = tuple[str, ...]

# Metadata the server owns: never part of a manager's field set.
_SYSTEM_METADATA = frozenset({
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds",
})


def _leaves(value: Any, prefix: Path, name: str | None) -> dict[Path, Any]:
    """Every leaf path of `value` with its value; a keyed list item is also a leaf (".")."""
    if isinstance(value, dict) and value:
        out: dict[Path, Any] = {}
        for key, child in value.items():
            out.update(_leaves(child, (*prefix, f"f:{key}"), key))
        return out
    key = patching.MERGE_KEYS.get(name or "")
    if isinstance(value, list) and key and all(isinstance(i, dict) and key in i for i in value):
        out = {}
        for item in value:
            element = (*prefix, "k:" + json.dumps({key: item[key]}, separators=(",", ":")))
            out[(*element, ".")] = None
            out.update(_leaves(item, element, None))
        return out
    return {prefix: value}


def leaves(obj: Obj, *, subresource: str | None) -> dict[Path, Any]:
    """The paths a write to `subresource` ("status", "scale" or None) can own."""
    if subresource == "status":
        return _leaves(obj.get("status"), ("f:status",), "status") if obj.get("status") else {}
    if subresource == "scale":
        replicas = (obj.get("spec") or {}).get("replicas")
        return {("f:spec", "f:replicas"): replicas}
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _SYSTEM_METADATA}
            if not value:
                continue
        out.update(_leaves(value, (f"f:{key}",), key))
    return out


def to_fields_v1(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    return tree


def _from_fields_v1(tree: Obj, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for key, child in tree.items():
        if isinstance(child, dict) and child:
            paths |= _from_fields_v1(child, (*prefix, key))
        else:
            paths.add((*prefix, key))
    return paths


def manager_name(*, field_manager: str | None, user_agent: str) -> str:
    """The manager a request writes as: `fieldManager`, else the User-Agent's product name
    (`kubectl/v1.28.0 (linux/amd64)` -> `kubectl`), as the API server derives it."""
    if field_manager:
        return field_manager
    return user_agent.split("/", 1)[0] or "unknown"


def record(*, old: Obj | None, new: Obj, manager: str, subresource: str | None,
           time: str) -> list[Obj]:
    """The `managedFields` of `new` after `manager` wrote it over `old` (None: a create)."""
    before = leaves(old, subresource=subresource) if old is not None else {}
    after = leaves(new, subresource=subresource)
    changed = {p for p in before.keys() | after.keys() if before.get(p, ()) != after.get(p, ())}
    entries: list[Obj] = []
    mine: set[Path] = set()
    for entry in (old or {}).get("metadata", {}).get("managedFields") or []:
        owned = _from_fields_v1(entry.get("fieldsV1") or {})
        if (entry.get("manager"), entry.get("operation"), entry.get("subresource")) == (
                manager, "Update", subresource):
            mine = owned
            continue
        owned -= changed
        if owned:
            entries.append({**entry, "fieldsV1": to_fields_v1(owned)})
    mine = (mine | changed) & after.keys()
    if mine:
        entry = {"manager": manager, "operation": "Update", "apiVersion": new["apiVersion"],
                 "time": time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(mine)}
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
    # The API server's order: Apply before Update, then oldest first, then by manager.
    return sorted(entries, key=lambda e: (e["operation"] != "Apply", e["time"], e["manager"]))
