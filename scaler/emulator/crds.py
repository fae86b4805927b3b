"""CustomResourceDefinitions in the emulator: a created CRD serves its resource, whose objects
are pruned and validated against the CRD's structural schema as the apiextensions server does.

Covered: type, required, enum, minimum/maximum (exclusive too), pattern, maxLength,
nullable, maps (additionalProperties) and lists; unknown fields are pruned (the server's
default field validation drops them and warns). Not covered: CEL rules
(`x-kubernetes-validations`), formats, defaults, conversion (one version served).
"""

from __future__ import annotations

import re
from typing import Any

from scaler.emulator import apierrors
from scaler.emulator.apierrors import FieldError, Obj
from scaler.emulator.store import ResourceType, Store, WatchEvent

CRD_TYPE = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                        "CustomResourceDefinition", namespaced=False, has_status=True,
                        generation=True)

_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
          "object": (dict,), "array": (list,)}
# Top-level fields every object has, kept whatever the schema says (metadata is the
# server's own; a CRD schema cannot restrict it beyond name).
_SYSTEM = ("apiVersion", "kind", "metadata")


def _storage_version(crd: Obj) -> Obj:
    versions = (crd.get("spec") or {}).get("versions") or []
    stored = [v for v in versions if v.get("storage")]
    if len(stored) != 1:
        raise ValueError("exactly one version must be the storage version")
    return dict(stored[0])


def resource_type(crd: Obj) -> tuple[ResourceType, Obj]:
    """The resource a CRD serves (its storage version) and that version's schema."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    version = _storage_version(crd)
    rtype = ResourceType(
        str(spec.get("group")), str(version.get("name")), str(names.get("plural")),
        str(names.get("kind")), namespaced=spec.get("scope") == "Namespaced",
        has_status="status" in (version.get("subresources") or {}), builtin=False,
        generation=True, unconditional_update=False)
    schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
    return rtype, schema


def check_definition(crd: Obj) -> list[FieldError]:
    """What ValidateCustomResourceDefinition says first: the name is `<plural>.<group>`,
    and one version is stored."""
    spec = crd.get("spec") or {}
    plural, group = (spec.get("names") or {}).get("plural"), spec.get("group")
    name = (crd.get("metadata") or {}).get("name", "")
    errors = []
    if name != f"{plural}.{group}":
        errors.append(apierrors.invalid_value("metadata.name", name,
                                              "must be spec.names.plural+\".\"+spec.group"))
    try:
        _storage_version(crd)
    except ValueError as error:
        errors.append(apierrors.invalid_value("spec.versions", "", str(error)))
    return errors


def _type_ok(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, (object,)))


def _bounds(value: float, schema: Obj, field: str) -> list[FieldError]:
    errors = []
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        strict = bool(schema.get("exclusiveMinimum"))
        if value < low or (strict and value == low):
            word = "greater than" if strict else "greater than or equal to"
            errors.append(apierrors.invalid_value(field, value, f"{field} in body should be "
                                                  f"{word} {apierrors.go_value(low)}"))
    if high is not None:
        strict = bool(schema.get("exclusiveMaximum"))
        if value > high or (strict and value == high):
            word = "less than" if strict else "less than or equal to"
            errors.append(apierrors.invalid_value(field, value, f"{field} in body should be "
                                                  f"{word} {apierrors.go_value(high)}"))
    return errors


def _string(value: str, schema: Obj, field: str) -> list[FieldError]:
    errors = []
    limit = schema.get("maxLength")
    if limit is not None and len(value) > limit:
        errors.append(FieldError("FieldValueTooLong", field,
                                 f"Too long: may not be more than {limit} bytes"))
    pattern = schema.get("pattern")
    if pattern is not None and re.search(pattern, value) is None:
        errors.append(apierrors.invalid_value(field, value, f"{field} in body should match "
                                              f"'{pattern}'"))
    return errors


def validate(schema: Obj, value: Any, field: str) -> list[FieldError]:
    """Prune `value` in place to what `schema` declares, and say what breaks it."""
    if value is None:
        if schema.get("nullable"):
            return []
        return [apierrors.invalid_value(field, value, f"{field} in body must be of type "
                                        f"{schema.get('type', 'object')}: \"null\"")]
    kind = schema.get("type")
    if kind is not None and not _type_ok(value, kind):
        return [apierrors.invalid_value(field, value, f"{field} in body must be of type "
                                        f"{kind}: \"{type(value).__name__}\"")]
    errors: list[FieldError] = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(apierrors.go_value(each) for each in schema["enum"])
        errors.append(FieldError("FieldValueNotSupported", field,
                                 f"Unsupported value: {apierrors.go_value(value)}: "
                                 f"supported values: {allowed}"))
    if kind in ("integer", "number"):
        errors += _bounds(value, schema, field)
    elif kind == "string":
        errors += _string(value, schema, field)
    elif kind == "object":
        errors += _object(schema, value, field)
    elif kind == "array":
        items = schema.get("items") or {}
        for index, item in enumerate(value):
            errors += validate(items, item, f"{field}[{index}]")
    return errors


def _object(schema: Obj, value: Obj, field: str) -> list[FieldError]:
    errors: list[FieldError] = []
    prefix = f"{field}." if field else ""
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if schema.get("x-kubernetes-preserve-unknown-fields") is True:
        pass
    elif properties is not None:
        for key in [k for k in value if k not in properties and not (
                field == "" and k in _SYSTEM)]:
            del value[key]  # pruned, as the server prunes unknown fields
    elif isinstance(extra, dict):
        for key, item in value.items():
            errors += validate(extra, item, f"{prefix}{key}")
    for name in schema.get("required") or ():
        if name not in value:
            errors.append(apierrors.required(f"{prefix}{name}"))
    for name, child in (properties or {}).items():
        if name in value and not (field == "" and name == "metadata"):
            errors += validate(child, value[name], f"{prefix}{name}")
    return errors


class CustomResources:
    """Listens to the store: a CRD written serves its resource, a CRD deleted stops it (and
    its objects go). `check(key, obj)` validates an object of a served custom resource."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.schemas: dict[tuple[str, str], Obj] = {}
        store.listeners.append(self._on_event)

    def _on_event(self, event: WatchEvent) -> None:
        if event.resource != CRD_TYPE.key:
            return
        rtype, schema = resource_type(event.obj)
        if event.type == "DELETED":
            self.schemas.pop(rtype.key, None)
            self.store.types.pop(rtype.key, None)
            self.store.objects.pop(rtype.key, None)
            return
        self.schemas[rtype.key] = schema
        self.store.types[rtype.key] = rtype
        self.store.objects.setdefault(rtype.key, {})

    def check(self, key: tuple[str, str], obj: Obj, *, status: bool) -> list[FieldError]:
        """Schema errors of a custom resource (pruned in place); [] for other types. A
        `/status` write is checked on `.status` only, a main write on the rest."""
        if key == CRD_TYPE.key and not status:
            return check_definition(obj)
        schema = self.schemas.get(key)
        if schema is None:
            return []
        if status:
            part = (schema.get("properties") or {}).get("status")
            return [] if part is None or "status" not in obj else validate(
                part, obj["status"], "status")
        return validate(schema, obj, "")
