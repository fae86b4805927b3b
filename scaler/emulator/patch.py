"""The three PATCH flavours of the Kubernetes API: JSON merge, strategic merge, JSON patch."""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PatchError(ValueError):
    """The patch cannot be applied; the server answers 422 Unprocessable Entity."""


class PatchFormatError(PatchError):
    """The patch is not a patch at all (not a list of operations): 400 Bad Request."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# patchMergeKey of the list fields the emulated types use (from the Kubernetes OpenAPI
# `x-kubernetes-patch-merge-key`); lists not named here are replaced, as for CRDs.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "containerStatuses": "name",
}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for built-in types: merge patch, plus lists merged by key.

    Supports the `$patch: replace` / `$patch: delete` directives on maps and list items,
    which is what kubectl and client libraries send for the types emulated here.
    """
    return _strategic(target, patch, field=None)


def _strategic(target: Any, patch: Any, *, field: str | None) -> Any:
    if isinstance(patch, dict):
        directive = patch.get("$patch")
        body = {k: v for k, v in patch.items() if k != "$patch"}
        if directive == "replace":
            return copy.deepcopy(body)
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in body.items():
            if value is None:
                result.pop(key, None)
            elif isinstance(value, dict) and value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = _strategic(result.get(key), value, field=key)
        return result
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(target, list):
        return _merge_list(target, patch, key=MERGE_KEYS[field], field=field)
    return copy.deepcopy(patch)


def _merge_list(target: list[Any], patch: list[Any], *, key: str, field: str) -> list[Any]:
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"list {field!r} items need their merge key {key!r}")
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict)
             and old.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(_strategic({}, item, field=None))
        else:
            result[index] = _strategic(result[index], item, field=None)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path component {part!r} does not exist")
    return node


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {'/'.join(parts)!r} does not exist")


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"cannot remove missing path {'/'.join(parts)!r}")


def _add(doc: Any, parts: list[str], value: Any, *, replace: bool) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"cannot replace missing path {'/'.join(parts)!r}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise PatchError(f"list index {last!r} out of range")
    else:
        raise PatchError(f"cannot add below a scalar at {'/'.join(parts)!r}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy and test, applied in order, all or nothing."""
    if not isinstance(operations, list):
        raise PatchFormatError("json: cannot unmarshal object into Go value of type "
                               "jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchFormatError(f"malformed operation {op!r}")
        parts = _pointer(op["path"])
        kind = op["op"]
        if kind == "add":
            doc = _add(doc, parts, op.get("value"), replace=False)
        elif kind == "replace":
            doc = _add(doc, parts, op.get("value"), replace=True)
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise PatchError(f"test at {op['path']!r} failed")
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value, replace=False)
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc


def apply_patch(target: Any, patch: Any, *, content_type: str) -> Any:
    """Dispatch on the request's Content-Type, as the API server does (415 otherwise)."""
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE_PATCH:
        return merge_patch(target, patch)
    if media == STRATEGIC_MERGE_PATCH:
        return strategic_merge_patch(target, patch)
    if media == JSON_PATCH:
        return json_patch(target, patch)
    raise LookupError(media)
