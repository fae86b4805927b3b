"""The ScalePolicy, GpuPool and GpuBudget CustomResourceDefinitions, generated from the
pydantic models (DESIGN 4.7), and their resources read as loaded documents."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from scaler.core import vocabulary
from scaler.policy import fleet, loader, model

GROUP = "scaler.io"
VERSION = "v1alpha1"
PLURAL = "scalepolicies"
SINGULAR = "scalepolicy"
SHORT_NAMES = ("sp",)
CRD_NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"
CHART_DIR = Path("charts/scaler/crds")
CHART_FILE = CHART_DIR / f"{PLURAL}.yaml"
"""Where the generated CRD is committed, relative to the repository root (`scripts/gen-crd`)."""

Schema = dict[str, Any]


class ConditionType(enum.StrEnum):
    """The status conditions of a ScalePolicy: the HPA's three, plus two of its own, and
    VariantsScaled for a policy with spec.variants (False: an HPA scales a variant)."""

    ABLE_TO_SCALE = "AbleToScale"
    SCALING_ACTIVE = "ScalingActive"
    SCALING_LIMITED = "ScalingLimited"
    SIGNALS_FRESH = "SignalsFresh"
    POLICY_VALID = "PolicyValid"
    VARIANTS_SCALED = "VariantsScaled"


VALID = "Valid"
"""The one status condition of a GpuPool or GpuBudget: whether its spec is in force."""


# Rules pydantic checks in field validators, as patterns the API server checks itself
# (RE2 accepts both). Keyed by the (camelCase) path of the field in the spec.
Patterns = Mapping[tuple[str, ...], tuple[str, int | None]]
Rules = Mapping[tuple[str, ...], tuple[tuple[str, str], ...]]
_PATTERNS: Patterns = {
    ("target", "name"): (model._DNS1123.pattern, 63),
    ("nodePool", "name"): (model._DNS1123.pattern, 63),
    ("warmFloor", "schedules", "*", "from"): (model._HHMM.pattern, None),
    ("warmFloor", "schedules", "*", "to"): (model._HHMM.pattern, None),
}

# Cross-field rules of the model's validators that CEL can say, with the model's words;
# the rest (time zones, day lists, the budget holding the floor) only the service checks,
# and reports through the PolicyValid condition.
_RULES: Rules = {
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

# The fleet's names and label values, as patterns (pydantic checks the same in validators).
_LABEL_VALUE = (fleet._LABEL_VALUE.pattern, 63)
_POOL_PATTERNS: Patterns = {("reservations", "*", "name"): (model._DNS1123.pattern, 63)}
_BUDGET_PATTERNS: Patterns = {("pool",): (model._DNS1123.pattern, 63),
                              ("tenant",): _LABEL_VALUE, ("costCenter",): _LABEL_VALUE}
# The budget's scalar cross-field rules; the pool's (reservations within its GPUs, NVLink
# domains that divide a node) only the service checks, and reports in the Valid condition.
_BUDGET_RULES: Rules = {(): (
    ("has(self.tenant) != has(self.costCenter)",
     "set exactly one of tenant and costCenter: the policies the budget covers"),
    ("!has(self.guaranteedGpus) || self.guaranteedGpus <= self.maxGpus",
     "guaranteedGpus is above maxGpus"),
)}

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


def _openapi(node: Schema, path: tuple[str, ...], *, patterns: Patterns, rules: Rules
             ) -> Schema:
    """One JSON Schema node (refs inlined) as an OpenAPI v3 structural schema node, with
    the `patterns` and CEL `rules` of its path."""
    options = node.get("anyOf")
    if options is not None:
        # `X | None`: X, nullable (the API server keeps an explicit null, pydantic reads it).
        kept = [each for each in options if each.get("type") != "null"]
        if len(kept) != 1:
            raise ValueError(f"{'.'.join(path)}: a union the API server cannot express")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        single = _openapi({**kept[0], **rest}, path, patterns=patterns, rules=rules)
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
        out["properties"] = {name: _openapi(child, (*path, name), patterns=patterns,
                                            rules=rules)
                             for name, child in node["properties"].items()}
    elif isinstance(node.get("additionalProperties"), dict):
        # A map (labels, nodeSelector, queries): its values' schema, keys free.
        out["additionalProperties"] = _openapi(node["additionalProperties"], (*path, "*"),
                                               patterns=patterns, rules=rules)
    if "items" in node:
        out["items"] = _openapi(node["items"], (*path, "*"), patterns=patterns, rules=rules)
    pattern = patterns.get(path)
    if pattern is not None:
        out["pattern"] = pattern[0]
        if pattern[1] is not None:
            out["maxLength"] = pattern[1]
    if rules.get(path):
        out["x-kubernetes-validations"] = [{"rule": rule, "message": message}
                                           for rule, message in rules[path]]
    return out


@dataclass(frozen=True, slots=True)
class Kind:
    """One custom resource the scaler reads: its names, scope, model and chart file."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    spec: type[pydantic.BaseModel]
    source: str  # the model's module, named in the generated file's header
    description: str
    status: Callable[[], Schema]
    printer_columns: tuple[Schema, ...]
    patterns: Patterns
    rules: Rules

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def chart_file(self) -> Path:
        """Where the generated CRD is committed, relative to the repository root."""
        return CHART_DIR / f"{self.plural}.yaml"

    def collection(self, namespace: str | None = None) -> str:
        """The collection URL: in one namespace, or in all (None); cluster-scoped kinds
        have only the one."""
        root = f"/apis/{API_VERSION}"
        if namespace is None or not self.namespaced:
            return f"{root}/{self.plural}"
        return f"{root}/namespaces/{namespace}/{self.plural}"

    def resource_path(self, namespace: str | None, name: str) -> str:
        """How a resource is named where files are named by path (errors, explain):
        scalepolicies/<namespace>/<name>, gpupools/<name>."""
        return f"{self.plural}/{namespace}/{name}" if self.namespaced else (
            f"{self.plural}/{name}")


def spec_schema(kind: Kind | None = None) -> Schema:
    """The spec's OpenAPI v3 schema, from the same pydantic model the files validate with."""
    kind = kind or SCALE_POLICY
    source = kind.spec.model_json_schema(by_alias=True, mode="validation")
    defs = source.pop("$defs", {})
    return _openapi(_resolve(source, defs), (), patterns=kind.patterns, rules=kind.rules)


def _condition_schema(types: list[str]) -> Schema:
    text = {"type": "string"}
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "enum": types},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {**text, "description": "One CamelCase word, as the HPA's."},
            "message": {**text, "description": "Why, in a sentence."},
            "lastTransitionTime": {"type": "string", "format": "date-time",
                                   "description": "When status last changed (not reason)."},
        },
    }


def _conditions(types: list[str]) -> Schema:
    return {"type": "array", "items": _condition_schema(types),
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


def _variants_status() -> Schema:
    replicas = {"type": "integer", "format": "int32"}
    return {
        "type": "array", "maxItems": model.MAX_VARIANTS,
        "description": "Per variant (spec.variants), in order: currentReplicas and "
        "desiredReplicas above are then in replicas of the policy's own yardstick.",
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object", "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "target": {"type": "string", "description": "The variant's target's name."},
                "pool": {"type": "string", "description": "Its GpuPool."},
                "desiredReplicas": {**replicas, "description": "Its count in the fleet's "
                                    "last mix (absent before the first)."},
                "currentReplicas": {**replicas, "description": "Its target's spec.replicas."},
                "readyReplicas": {**replicas, "description": "Its replicas passing readiness."},
                "startingReplicas": {**replicas,
                                     "description": "Its replicas existing but not ready."},
                "scaledBy": {"type": "string", "description": "The HPA or ScaledObject that "
                             "scales its target (the scaler does not patch it)."},
                "gpuHours": {"type": "number", "description": "Allocated GPU-hours of its "
                             "replicas (ready and starting, at its gpusPerReplica) since the "
                             "leader started, at the last decision: its "
                             "scaler_variant_gpu_hours_total. A new leader counts from 0."},
                "cost": {"type": "number", "description": "Their cost at its GPU-hour price, "
                         "in the policy's currency: its scaler_variant_cost_total."},
                "idleCost": {"type": "number", "description": "The cost of their idle part: "
                             "its scaler_variant_idle_cost_total."},
            },
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
            "variants": _variants_status(),
            "conditions": {
                **_conditions([each.value for each in ConditionType]),
            },
        },
    }


def fleet_status_schema() -> Schema:
    """The status the leader writes on a GpuPool or GpuBudget
    (`scaler.service.conditions.fleet_status`): the generation read and its Valid condition."""
    full = status_schema()
    return {**full, "properties": {
        "observedGeneration": full["properties"]["observedGeneration"],
        "conditions": _conditions([VALID])}}


PRINTER_COLUMNS: tuple[Schema, ...] = (
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.replicas.min"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.replicas.max"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.currentReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Winner", "type": "string", "jsonPath": ".status.winner.signal"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


_AGE: Schema = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_VALID_COLUMN: Schema = {"name": "Valid", "type": "string",
                         "jsonPath": f'.status.conditions[?(@.type=="{VALID}")].status'}

SCALE_POLICY = Kind(
    kind=model.KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
    namespaced=True, spec=model.ScalePolicySpec, source="scaler/policy/model.py",
    description="How the model scales (DESIGN 4.1).", status=status_schema,
    printer_columns=PRINTER_COLUMNS, patterns=_PATTERNS, rules=_RULES)
# Cluster-scoped, as StorageClass and PriorityClass are: a pool is the cluster's hardware,
# and a budget's tenant spans namespaces (docs/kubernetes.md, "Pools and budgets").
GPU_POOL = Kind(
    kind=fleet.POOL_KIND, plural="gpupools", singular="gpupool", short_names=("gp",),
    namespaced=False, spec=fleet.GpuPoolSpec, source="scaler/policy/fleet.py",
    description="The pool's GPUs, price, nodes and reservations (DESIGN 4.6).",
    status=fleet_status_schema, patterns=_POOL_PATTERNS, rules={},
    printer_columns=(
        {"name": "Resource", "type": "string", "jsonPath": ".spec.resourceName"},
        {"name": "GPUs/Node", "type": "integer", "jsonPath": ".spec.gpusPerNode"},
        {"name": "Max Nodes", "type": "integer", "jsonPath": ".spec.maxNodes"},
        _VALID_COLUMN, _AGE))
GPU_BUDGET = Kind(
    kind=fleet.BUDGET_KIND, plural="gpubudgets", singular="gpubudget", short_names=("gb",),
    namespaced=False, spec=fleet.GpuBudgetSpec, source="scaler/policy/fleet.py",
    description="Who it covers, where, and how many GPUs (DESIGN 4.6).",
    status=fleet_status_schema, patterns=_BUDGET_PATTERNS, rules=_BUDGET_RULES,
    printer_columns=(
        {"name": "Tenant", "type": "string", "jsonPath": ".spec.tenant"},
        {"name": "Cost Center", "type": "string", "jsonPath": ".spec.costCenter"},
        {"name": "Pool", "type": "string", "jsonPath": ".spec.pool"},
        {"name": "Guaranteed", "type": "integer", "jsonPath": ".spec.guaranteedGpus"},
        {"name": "Max", "type": "integer", "jsonPath": ".spec.maxGpus"},
        _VALID_COLUMN, _AGE))
KINDS = (SCALE_POLICY, GPU_POOL, GPU_BUDGET)
FLEET_KINDS = (GPU_POOL, GPU_BUDGET)


def definition(kind: Kind | None = None) -> Schema:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of `kind` (ScalePolicy)."""
    kind = kind or SCALE_POLICY
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {**spec_schema(kind), "description": kind.description},
            "status": kind.status(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": {"app.kubernetes.io/name": "scaler"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "names": {"plural": kind.plural, "singular": kind.singular, "kind": kind.kind,
                      "listKind": f"{kind.kind}List", "shortNames": list(kind.short_names)},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": list(kind.printer_columns),
            }],
        },
    }


def render(kind: Kind | None = None) -> str:
    """The CRD as the YAML file the chart ships."""
    kind = kind or SCALE_POLICY
    header = (f"# Generated by scripts/gen-crd from {kind.source}: do not edit by hand.\n"
              "# tests/policy/test_crd.py checks that this file equals the generated one.\n")
    return header + yaml.safe_dump(definition(kind), sort_keys=False, width=100)


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


# -- resources to documents -----------------------------------------------------------------


def resource_path(namespace: str, name: str) -> str:
    """How a ScalePolicy resource is named where files are named by path (errors, explain)."""
    return SCALE_POLICY.resource_path(namespace, name)


def parse_resource(obj: Mapping[str, Any], kind: Kind | None = None) -> loader.LoadResult:
    """A resource of `kind` (ScalePolicy) as the API returns it -> the loaded document or
    its errors.

    Only name, namespace and labels are read from metadata (the server's own fields,
    uid, managedFields, ..., are not the document's); errors name the resource and the field.
    """
    kind = kind or SCALE_POLICY
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    metadata: dict[str, Any] = {"name": name, "labels": dict(meta.get("labels") or {})}
    namespace = None
    if kind.namespaced:
        namespace = metadata["namespace"] = str(meta.get("namespace") or "default")
    path = kind.resource_path(namespace, name)
    # A list's items carry no apiVersion or kind (the list does): the collection says it.
    document = {"apiVersion": obj.get("apiVersion") or API_VERSION,
                "kind": obj.get("kind") or kind.kind, "metadata": metadata,
                "spec": obj.get("spec")}
    result = loader.LoadResult()
    try:
        if kind is GPU_POOL:
            pool = fleet.GpuPool.model_validate(document)
            result.pools.append(loader.Loaded(value=pool, path=path, document=0))
        elif kind is GPU_BUDGET:
            budget = fleet.GpuBudget.model_validate(document)
            result.budgets.append(loader.Loaded(value=budget, path=path, document=0))
        else:
            policy = model.ScalePolicy.model_validate(document)
            result.loaded.append(loader.LoadedPolicy(policy=policy, path=path, document=0))
    except pydantic.ValidationError as exc:
        result.errors.extend(loader.validation_errors(exc, path, 0))
    return result


def manifest(item: model.ScalePolicy | fleet.GpuPool | fleet.GpuBudget) -> dict[str, Any]:
    """A policy, pool or budget as a resource body to create (what `kubectl apply` sends)."""
    body = json.loads(item.model_dump_json(by_alias=True, exclude_unset=True))
    return {"apiVersion": API_VERSION, "kind": item.kind, "metadata": body["metadata"],
            "spec": body["spec"]}


def write(root: Path) -> list[Path]:
    """Write the chart's CRD files under `root` (the repository); returns their paths."""
    written = []
    for kind in KINDS:
        target = root / kind.chart_file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(kind), encoding="utf-8")
        written.append(target)
    return written
