"""events.k8s.io/v1: the same Events as core/v1, stored once and converted field by field.

The API server keeps one storage for both versions; `note` is core's `message`,
`regarding` is `involvedObject`, `reportingController` is `reportingComponent`, and the
old-style counters live under `deprecated*`. Creating through events.k8s.io applies the
strict rules (DNS-subdomain names, so a `generateName` ending in "." is refused, and
`eventTime`, `reportingController`, `reportingInstance`, `action`, `reason` required).
"""

from __future__ import annotations

from scaler.emulator import validation
from scaler.emulator.apierrors import FieldError, invalid_value, required
from scaler.emulator.store import Obj, ResourceType

EVENTS_V1 = ResourceType("events.k8s.io", "v1", "events", "Event")
CORE_KEY = ("", "events")

# events.k8s.io/v1 field -> core/v1 field; the rest (eventTime, series, action, reason,
# related, type, reportingInstance) have one name in both.
_RENAMED = {
    "regarding": "involvedObject", "note": "message", "reportingController": "reportingComponent",
    "deprecatedSource": "source", "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp", "deprecatedCount": "count",
}
_BACK = {core: v1 for v1, core in _RENAMED.items()}


def to_core(obj: Obj) -> Obj:
    body = {_RENAMED.get(k, k): v for k, v in obj.items()}
    body["apiVersion"], body["kind"] = "v1", "Event"
    return body


def from_core(obj: Obj) -> Obj:
    body = {_BACK.get(k, k): v for k, v in obj.items()}
    body["apiVersion"], body["kind"] = EVENTS_V1.api_version, EVENTS_V1.kind
    body.setdefault("eventTime", None)
    return body


def validate_v1(core: Obj) -> list[FieldError]:
    """The strict rules for an Event created through events.k8s.io/v1 (in core fields)."""
    errors = validation.core_event(core, strict_meta=True)
    if not core.get("eventTime"):
        errors.append(required("eventTime"))
    if core.get("type") not in ("Normal", "Warning"):
        errors.append(invalid_value("type", "", f"has invalid value: {core.get('type', '')}"))
    for field in ("firstTimestamp", "lastTimestamp", "count", "source"):
        if core.get(field):
            errors.append(invalid_value(field, "", "needs to be unset"))
    return errors
