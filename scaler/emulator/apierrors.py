"""API errors as the kube-apiserver words them: the Status body, its details and causes.

The texts follow k8s.io/apimachinery's `errors.NewNotFound`, `NewConflict`,
`NewAlreadyExists`, `NewInvalid` and `field.Error`, so a client that reads `message`,
`reason`, `details.causes` or `details.kind` sees what a real cluster sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

OPTIMISTIC_LOCK = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


class StoreError(Exception):
    """An API error with its HTTP code, Kubernetes `reason` and Status `details`."""

    def __init__(self, code: int, reason: str, message: str, *,
                 details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        """The metav1.Status body the API server sends with this error."""
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def qualified(name: str, group: str) -> str:
    """A GroupResource or GroupKind as Go prints it: `deployments.apps`, `pods`."""
    return f"{name}.{group}" if group else name


def _details(*, name: str, group: str, kind: str) -> Obj:
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def not_found(*, resource: str, group: str, name: str) -> StoreError:
    return StoreError(404, "NotFound", f'{qualified(resource, group)} "{name}" not found',
                      details=_details(name=name, group=group, kind=resource))


def already_exists(*, resource: str, group: str, name: str) -> StoreError:
    return StoreError(409, "AlreadyExists",
                      f'{qualified(resource, group)} "{name}" already exists',
                      details=_details(name=name, group=group, kind=resource))


def conflict(*, resource: str, group: str, name: str, why: str = OPTIMISTIC_LOCK
             ) -> StoreError:
    return StoreError(409, "Conflict", f'Operation cannot be fulfilled on '
                      f'{qualified(resource, group)} "{name}": {why}',
                      details=_details(name=name, group=group, kind=resource))


def bad_request(message: str) -> StoreError:
    return StoreError(400, "BadRequest", message)


def go_value(value: Any) -> str:
    """A field value as `field.Error` prints it (Go's %#v for the types the API has):
    strings quoted, ints bare, a map of strings as `map[string]string{"a":"b"}`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        pairs = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in sorted(value.items()))
        return "map[string]string{" + pairs + "}"
    if value is None:
        return "null"
    return str(value)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One `field.Error`: `reason` is its type as a Status cause (FieldValueInvalid,
    FieldValueRequired...), `field` the dotted path, `body` what follows the path."""

    reason: str
    field: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    def cause(self) -> Obj:
        return {"reason": self.reason, "message": self.body, "field": self.field}


def invalid_value(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {go_value(value)}: {detail}")


def required(field: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", field,
                      f"Required value: {detail}" if detail else "Required value")


def invalid(*, kind: str, group: str, name: str, errors: list[FieldError]) -> StoreError:
    """422 Unprocessable Entity: `Deployment.apps "web" is invalid: spec.replicas: ...`,
    several errors bracketed and comma-joined as Go's aggregate error prints them."""
    joined = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    details = _details(name=name, group=group, kind=kind)
    details["causes"] = [e.cause() for e in errors]
    return StoreError(422, "Invalid", f'{qualified(kind, group)} "{name}" is invalid: {joined}',
                      details=details)
