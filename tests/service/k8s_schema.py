"""JSON Schemas of the Kubernetes API objects the service returns, for shape checks.

Core objects (Status, APIResourceList, APIGroup, ListMeta, Time, Quantity) come from the
OpenAPI definitions that `kubernetes-validate` ships. The external metrics types are not
in them, so they are written here from the upstream Go types,
k8s.io/metrics/pkg/apis/external_metrics/v1beta1/types.go (ExternalMetricValueList,
ExternalMetricValue: TypeMeta inline, metricName, metricLabels, timestamp, window, value).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

SCHEMA_VERSION = "v1.37.0-local-strict"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
EXTERNAL = "io.k8s.metrics.pkg.apis.external_metrics.v1beta1."

# resource.Quantity's serialised form (apimachinery quantity.go): a signed decimal with an
# optional binary (Ki..Ei), decimal-SI (n, u, m, k, M..E) or exponent suffix.
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
# metav1.Time's JSON form: RFC 3339 in UTC with whole seconds.
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")

_EXTERNAL_DEFS: dict[str, Any] = {
    EXTERNAL + "ExternalMetricValue": {
        "type": "object",
        "additionalProperties": False,
        "required": ["metricName", "metricLabels", "timestamp", "value"],
        "properties": {
            "kind": {"type": "string"},
            "apiVersion": {"type": "string"},
            "metricName": {"type": "string"},
            "metricLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "timestamp": {"$ref": "#/$defs/" + META + "Time"},
            "window": {"type": "integer"},
            "value": {"$ref": "#/$defs/io.k8s.apimachinery.pkg.api.resource.Quantity"},
        },
    },
    EXTERNAL + "ExternalMetricValueList": {
        "type": "object",
        "additionalProperties": False,
        "required": ["items"],
        "properties": {
            "kind": {"type": "string", "enum": ["ExternalMetricValueList"]},
            "apiVersion": {"type": "string", "enum": ["external.metrics.k8s.io/v1beta1"]},
            "metadata": {"$ref": "#/$defs/" + META + "ListMeta"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/" + EXTERNAL
                                                 + "ExternalMetricValue"}},
        },
    },
}


@functools.cache
def _definitions() -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / SCHEMA_VERSION
    defs: dict[str, Any] = json.loads((root / "_definitions.json").read_text())["$defs"]
    return {**defs, **_EXTERNAL_DEFS}


def validate(document: Any, definition: str) -> None:
    """Raise jsonschema.ValidationError unless `document` is a valid `definition`."""
    schema = {"$ref": "#/$defs/" + definition, "$defs": _definitions()}
    jsonschema.Draft202012Validator(schema).validate(document)
    if definition == EXTERNAL + "ExternalMetricValueList":
        for item in document["items"]:
            assert QUANTITY.match(item["value"]), item["value"]
            assert RFC3339.match(item["timestamp"]), item["timestamp"]
