"""The ScalePolicy CustomResourceDefinition, generated from the pydantic model (DESIGN 4.7)."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
import yaml

from scaler.core import vocabulary
from scaler.policy import loader, model

GROUP = "scaler.io"
VERSION = "v1alpha1"
PLURAL = "scalepolicies"
SINGULAR = "scalepolicy"
SHORT_NAMES = ("sp",)
CRD_NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"
CHART_FILE = Path("charts/scaler/crds/scalepolicies.yaml")
"""Where the generated CRD is committed, relative to the repository root (`scripts/gen-crd`)."""

Schema = dict[str, Any]


class ConditionType(enum.StrEnum):
    """The status conditions of a ScalePolicy: the HPA's three, plus two of its own."""

    ABLE_TO_SCALE = "AbleToScale"
    SCALING_ACTIVE = "ScalingActive"
    SCALING_LIMITED = "ScalingLimited"
    SIGNALS_FRESH = "SignalsFresh"
    POLICY_VALID = "PolicyValid"


# Rules pydantic checks in field validators, as patterns the API server checks itself
# (RE2 accepts both). Keyed by the (camelCase) path of the field in the spec.
_PATTERNS: Mapping[tuple[str, ...], tuple[str, int | None]] = {
    ("target", "name"): (model._DNS1123.pattern, 63),
    ("nodePool", "name"): (model._DNS1123.pattern, 63),
    ("warmFloor", "schedules", "*", "from"): (model._HHMM.pattern, None),
    ("warmFloor", "schedules", "*", "to"): (model._HHMM.pattern, None),
}

# Cross-field rules of the model's validators that CEL can say, with the model's words;
# the rest (time zones, day lists, the budget holding the floor) only the service checks,
# and reports through the PolicyValid condition.
_RULES: Mapping[tuple[str, ...], tuple[tuple[str, str], ...]] = {
    ("replicas",): (("!has(self.min) || self.min <= self.max",
                     "min is greater than max"),),
    ("signals",): (("has(self.concurrency) || has(self.queueDepth) || "
                    "has(self.tokensPerSecond)",
                    "at least one demand signal is needed: concurrency, queueDepth or "
                    "tokensPerSecond (p95Latency is a guard and cannot scale on its own)"),),
    ("sources", "prometheus"): (("!has(self.preset) || self.preset != 'custom' || "
                                 "(has(self.queries) && size(self.queries) > 0)",
                                 "preset 'custom' needs at least one entry in queries"),),
    ("sources", "prometheus", "queries"): ((
        "self.all(k, k in [" + ", ".join(f"'{s.value}'" for s in vocabulary.Signal) + "])",
        "keys must be signal names: " + ", ".join(s.value for s in vocabulary.Signal)),),
    ("nodePool",): (("!has(self.actuator) || self.actuator != 'clusterapi' || "
                     "has(self.machineDeployment)",
                     "actuator 'clusterapi' needs machineDeployment"),),
}

# JSON Schema keys with no place in a structural schema (or that would change the object:
# a `default` is applied by the API server; the service applies the model's defaults).
_DROPPED = ("title", "default", "propertyNames", "additionalProperties")


def _resolve(node: Any, defs: Mapping[str, Schema]) -> Any:
    """Inline every `$ref` (a structural schema has none)."""
    if isinstance(node, list):
        return [_resolve(each, defs) for each in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rpartition("/")[2]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _openapi(node: Schema, path: tuple[str, ...]) -> Schema:
    """One JSON Schema node (refs inlined) as an OpenAPI v3 structural schema node."""
    options = node.get("anyOf")
    if options is not None:
        # `X | None`: X, nullable (the API server keeps an explicit null, pydantic reads it).
        kept = [each for each in options if each.get("type") != "null"]
        if len(kept) != 1:
            raise ValueError(f"{'.'.join(path)}: a union the API server cannot express")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        single = _openapi({**kept[0], **rest}, path)
        if len(kept) < len(options):
            single["nullable"] = True
        return single
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED or key in ("properties", "items"):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in node:
        out["properties"] = {name: _openapi(child, (*path, name))
                             for name, child in node["properties"].items()}
    elif isinstance(node.get("additionalProperties"), dict):
        # A map (labels, nodeSelector, queries): its values' schema, keys free.
        out["additionalProperties"] = _openapi(node["additionalProperties"], (*path, "*"))
    if "items" in node:
        out["items"] = _openapi(node["items"], (*path, "*"))
    pattern = _PATTERNS.get(path)
    if pattern is not None:
        out["pattern"] = pattern[0]
        if pattern[1] is not None:
            out["maxLength"] = pattern[1]
    rules = _RULES.get(path)
    if rules:
        out["x-kubernetes-validations"] = [{"rule": rule, "message": message}
                                           for rule, message in rules]
    return out


def spec_schema() -> Schema:
    """The spec's OpenAPI v3 schema, from the same pydantic model the files validate with."""
    source = model.ScalePolicySpec.model_json_schema(by_alias=True, mode="validation")
    defs = source.pop("$defs", {})
    return _openapi(_resolve(source, defs), ())


def _condition_schema() -> Schema:
    text = {"type": "string"}
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "enum": [each.value for each in ConditionType]},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {**text, "description": "One CamelCase word, as the HPA's."},
            "message": {**text, "description": "Why, in a sentence."},
            "lastTransitionTime": {"type": "string", "format": "date-time",
                                   "description": "When status last changed (not reason)."},
        },
    }


def status_schema() -> Schema:
    """The status the leader writes (`scaler.service.conditions`)."""
    return {
        "type": "object",
        "description": "Written by the scaler's leader only, at most every few seconds.",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64",
                                   "description": "The generation of the spec in force."},
            "currentReplicas": {"type": "integer", "format": "int32",
                                "description": "The target's replicas, as last read."},
            "desiredReplicas": {"type": "integer", "format": "int32",
                                "description": "Replicas last decided."},
            "lastScaleTime": {"type": "string", "format": "date-time",
                              "description": "When the scaler last changed the replicas."},
            "winner": {
                "type": "object", "description": "The signal that set the count, if any.",
                "properties": {"signal": {"type": "string"}, "value": {"type": "number"}},
            },
            "conditions": {
                "type": "array", "items": _condition_schema(),
                "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            },
        },
    }


PRINTER_COLUMNS: tuple[Schema, ...] = (
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.replicas.min"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.replicas.max"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.currentReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Winner", "type": "string", "jsonPath": ".status.winner.signal"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def definition() -> Schema:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of ScalePolicy."""
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {**spec_schema(), "description": "How the model scales (DESIGN 4.1)."},
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "scaler"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": SINGULAR, "kind": model.KIND,
                      "listKind": f"{model.KIND}List", "shortNames": list(SHORT_NAMES)},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": list(PRINTER_COLUMNS),
            }],
        },
    }


HEADER = ("# Generated by scripts/gen-crd from scaler/policy/model.py: do not edit by hand.\n"
          "# tests/policy/test_crd.py checks that this file equals the generated one.\n")


def render() -> str:
    """The CRD as the YAML file the chart ships."""
    return HEADER + yaml.safe_dump(definition(), sort_keys=False, width=100)


def structural_problems(node: Any, path: str = "") -> list[str]:
    """Why a schema is not structural, by the apiextensions rules we rely on: every node
    has a type, no $ref/anyOf/oneOf/allOf types, properties and additionalProperties not
    both, no metadata constraints beyond the type. Empty: structural."""
    problems: list[str] = []
    if not isinstance(node, dict):
        return [f"{path or '/'}: not a schema"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "type" not in node and not preserve and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path or '/'}: no type")
    for key in ("$ref", "anyOf", "oneOf", "allOf", "not", "const", "propertyNames"):
        if key in node:
            problems.append(f"{path or '/'}: {key} is not allowed")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path or '/'}: properties and additionalProperties together")
    for name, child in (node.get("properties") or {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        problems += structural_problems(node["items"], f"{path}[]")
    return problems


# -- resources to policies -------------------------------------------------------------------


def resource_path(namespace: str, name: str) -> str:
    """How a ScalePolicy resource is named where files are named by path (errors, explain)."""
    return f"{PLURAL}/{namespace}/{name}"


def parse_resource(obj: Mapping[str, Any]) -> loader.LoadResult:
    """A ScalePolicy resource as the API returns it -> a loaded policy or its errors.

    Only name, namespace and labels are read from metadata (the server's own fields,
    uid, managedFields, ..., are not the policy's); errors name the resource and the field.
    """
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    path = resource_path(namespace, name)
    # A list's items carry no apiVersion or kind (the list does): the collection says it.
    document = {"apiVersion": obj.get("apiVersion") or API_VERSION,
                "kind": obj.get("kind") or model.KIND,
                "metadata": {"name": name, "namespace": namespace,
                             "labels": dict(meta.get("labels") or {})},
                "spec": obj.get("spec")}
    result = loader.LoadResult()
    try:
        policy = model.ScalePolicy.model_validate(document)
    except pydantic.ValidationError as exc:
        result.errors.extend(loader.validation_errors(exc, path, 0))
        return result
    result.loaded.append(loader.LoadedPolicy(policy=policy, path=path, document=0))
    return result


def manifest(policy: model.ScalePolicy) -> dict[str, Any]:
    """A policy as a resource body to create (what `kubectl apply` would send)."""
    body = json.loads(policy.model_dump_json(by_alias=True, exclude_unset=True))
    return {"apiVersion": API_VERSION, "kind": model.KIND, "metadata": body["metadata"],
            "spec": body["spec"]}


def write(root: Path) -> Path:
    """Write the chart's CRD file under `root` (the repository); returns its path."""
    target = root / CHART_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    return target
