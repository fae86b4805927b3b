"""Validation the kube-apiserver runs before it stores an object: names, Deployments,
Scales, core Events, Leases and ConfigMaps, with the real field paths and texts (422 causes)."""

from __future__ import annotations

import re
from typing import Any

from scaler.actuators import deletion_cost, selectors
from scaler.emulator import apierrors
from scaler.emulator.apierrors import FieldError, Obj, invalid_value, required

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. "
    f"'example.com', regex used for validation is '{_SUBDOMAIN}')")
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    f"regex used for validation is '{_LABEL}')")
# A generateName may end in "-" (the random suffix follows), so "web-" is checked as
# "weba"; a trailing "." is not masked: "web." fails where the name rules apply.
_MICROTIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.(\d+)(Z|[+-]\d{2}:\d{2})$")
MICROTIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"


def name_problems(name: str, *, label: bool, prefix: bool = False) -> list[str]:
    """What is wrong with `name` as an RFC 1123 subdomain (or label), Go's wording."""
    if prefix and name.endswith("-"):
        name = name[:-1] + "a"
    limit, pattern, message = ((63, _LABEL, LABEL_MESSAGE) if label
                               else (253, _SUBDOMAIN, SUBDOMAIN_MESSAGE))
    problems = []
    if len(name) > limit:
        problems.append(f"must be no more than {limit} characters")
    if re.fullmatch(pattern, name) is None:
        problems.append(message)
    return problems


def object_meta(obj: Obj, *, label: bool = False) -> list[FieldError]:
    """metadata.name and metadata.generateName, as ValidateObjectMeta checks them."""
    meta = obj.get("metadata") or {}
    errors = []
    generate = meta.get("generateName")
    if generate:
        errors += [invalid_value("metadata.generateName", generate, p)
                   for p in name_problems(str(generate), label=label, prefix=True)]
    errors += [invalid_value("metadata.name", meta.get("name", ""), p)
               for p in name_problems(str(meta.get("name", "")), label=label)]
    return errors


def replicas(value: Any, field: str) -> list[FieldError]:
    if isinstance(value, bool) or not isinstance(value, int):
        return [invalid_value(field, value, "must be an integer")]
    if value < 0:
        return [invalid_value(field, value, "must be greater than or equal to 0")]
    return []


def deployment(obj: Obj) -> list[FieldError]:
    """apps ValidateDeploymentSpec: replicas >= 0, a non-empty selector, and template
    labels that the selector matches (a missing selector matches nothing, so both fail)."""
    spec = obj.get("spec") or {}
    errors = replicas(spec.get("replicas", 1), "spec.replicas")
    selector_obj = spec.get("selector")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    matches = False
    if selector_obj is None:
        errors.append(required("spec.selector"))
    elif not (selector_obj.get("matchLabels") or selector_obj.get("matchExpressions")):
        errors.append(invalid_value("spec.selector", selector_obj,
                                    "empty selector is invalid for deployment"))
    else:
        try:
            matches = selectors.from_label_selector(selector_obj).matches(labels)
        except (KeyError, TypeError, ValueError) as error:
            errors.append(invalid_value("spec.selector", selector_obj, str(error)))
            matches = True
    if not matches:
        errors.append(invalid_value("spec.template.metadata.labels", labels,
                                    "`selector` does not match template `labels`"))
    if not (template.get("spec") or {}).get("containers"):
        errors.append(required("spec.template.spec.containers"))
    return errors


def pod(obj: Obj) -> list[FieldError]:
    """core ValidatePodSpecificAnnotations, the part clients write: a pod-deletion-cost
    that is not a plain int32 is refused ("must be a 32bit integer", at
    `metadata.annotations[controller.kubernetes.io/pod-deletion-cost]`). The API server
    lets an update keep a value that was already invalid; the emulator never stores one."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(deletion_cost.ANNOTATION)
    if value is None or (isinstance(value, str) and deletion_cost.parse_cost(value) is not None):
        return []
    return [invalid_value(f"metadata.annotations[{deletion_cost.ANNOTATION}]", value,
                          "must be a 32bit integer")]


def core_event(obj: Obj, *, strict_meta: bool) -> list[FieldError]:
    """core ValidateEventCreate: the involved object lives in the Event's namespace (old
    style events, no eventTime), or the new-style fields are set (eventTime given)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    involved = str((obj.get("involvedObject") or {}).get("namespace") or "")
    errors = object_meta(obj) if strict_meta else []
    mismatch = invalid_value("involvedObject.namespace", involved,
                             "does not match event.namespace")
    if not obj.get("eventTime"):
        if (involved and involved != namespace) or (not involved and namespace not in (
                "", "default")):
            errors.append(mismatch)
        return errors
    if not involved and namespace not in ("default", "kube-system"):
        errors.append(mismatch)
    reporter = "reportingController" if strict_meta else "reportingComponent"
    for field, value in ((reporter, obj.get("reportingComponent")),
                         ("reportingInstance", obj.get("reportingInstance")),
                         ("action", obj.get("action")), ("reason", obj.get("reason"))):
        if not value:
            errors.append(required(field))
    return errors


def lease(obj: Obj) -> list[FieldError]:
    """coordination ValidateLeaseSpec: a positive duration, non-negative transitions."""
    spec = obj.get("spec") or {}
    errors = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and isinstance(duration, int) and duration <= 0:
        errors.append(invalid_value("spec.leaseDurationSeconds", duration,
                                    "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if transitions is not None and isinstance(transitions, int) and transitions < 0:
        errors.append(invalid_value("spec.leaseTransitions", transitions,
                                    "must be greater than or equal to 0"))
    return errors


_CONFIG_KEY = "[-._a-zA-Z0-9]+"
CONFIG_KEY_MESSAGE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    f"'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '{_CONFIG_KEY}')")
MAX_CONFIG_MAP_BYTES = 1024 * 1024  # core.MaxSecretSize: data and binaryData values


def config_map_key_problems(key: str) -> list[str]:
    """IsConfigMapKey's answers."""
    problems = []
    if len(key) > 253:
        problems.append("must be no more than 253 characters")
    if re.fullmatch(_CONFIG_KEY, key) is None:
        problems.append(CONFIG_KEY_MESSAGE)
    if key == ".":
        problems.append("must not be '.'")
    elif key == "..":
        problems.append("must not be '..'")
    elif key.startswith(".."):
        problems.append("must not start with '..'")
    return problems


def config_map(obj: Obj) -> list[FieldError]:
    """ValidateConfigMap: every key a config key, no key in both data and binaryData, and
    at most 1 MiB of values in all (the error names the whole object: `[]`)."""
    data = obj.get("data") or {}
    binary = obj.get("binaryData") or {}
    errors = []
    total = 0
    for bag, values in (("data", data), ("binaryData", binary)):
        for key, value in values.items():
            errors += [invalid_value(f"{bag}[{key}]", key, p)
                       for p in config_map_key_problems(str(key))]
            total += len(str(value).encode()) if bag == "data" else len(str(value)) * 3 // 4
    for key in set(data) & set(binary):
        errors.append(invalid_value(f"data[{key}]", key, "duplicate of key present in "
                                    "binaryData"))
    if total > MAX_CONFIG_MAP_BYTES:
        errors.append(FieldError("FieldValueTooLong", "[]", "Too long: may not be more than "
                                 f"{MAX_CONFIG_MAP_BYTES} bytes"))
    return errors


def micro_times(obj: Obj, *, kind: str, version: str, fields: tuple[str, ...]) -> None:
    """A MicroTime must carry exactly six fractional digits (Go parses it with
    `2006-01-02T15:04:05.000000Z07:00`); anything else fails decoding: 400."""
    spec = obj.get("spec") or {}
    for field in fields:
        value = spec.get(field)
        if value is None:
            continue
        text = str(value)
        found = _MICROTIME.match(text)
        if found is None or len(found.group(1)) != 6:
            rest = text[19:] if len(text) > 19 else text
            raise apierrors.bad_request(
                f'{kind} in version "{version}" cannot be handled as a {kind}: parsing time '
                f'"{text}" as "{MICROTIME_LAYOUT}": cannot parse "{rest}" as ".000000"')


def for_type(key: tuple[str, str], obj: Obj) -> list[FieldError]:
    """The type's own rules plus the name rules (core Events are checked apart)."""
    if key == ("", "events"):
        return core_event(obj, strict_meta=False)
    errors = object_meta(obj, label=key == ("", "namespaces"))
    if key == ("apps", "deployments"):
        errors += deployment(obj)
    elif key == ("coordination.k8s.io", "leases"):
        errors += lease(obj)
    elif key == ("", "pods"):
        errors += pod(obj)
    elif key == ("", "configmaps"):
        errors += config_map(obj)
    return errors
