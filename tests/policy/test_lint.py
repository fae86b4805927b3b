"""`scaler validate` warns when the latency SLO lies inside a bucket the guard cannot read."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scaler.policy import lint, model

DOC: dict[str, Any] = {
    "apiVersion": "scaler.io/v1alpha1", "kind": "ScalePolicy",
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {"target": {"name": "m"}, "replicas": {"min": 1, "max": 4},
             "signals": {"concurrency": {"targetPerReplica": 8},
                         "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}}},
}


def with_slo(slo: float, metric: str = "ttft") -> model.ScalePolicy:
    doc = copy.deepcopy(DOC)
    doc["spec"]["signals"]["p95Latency"] = {"metric": metric, "sloSeconds": slo}
    return model.ScalePolicy.model_validate(doc)


@pytest.mark.parametrize(("slo", "metric", "warned"), [
    (2.0, "ttft", "(1, 2.5]"),   # inside vLLM's (1, 2.5] bucket
    (3.0, "ttft", "(2.5, 5]"),
    (2.5, "ttft", None),         # on an edge: read exactly
    (1.0, "ttft", None),
    (2.0, "e2e", None),          # only the TTFT layout is known
])
def test_slo_inside_a_bucket_is_warned(slo: float, metric: str, warned: str | None) -> None:
    found = lint.warnings(with_slo(slo, metric))
    if warned is None:
        assert found == []
    else:
        (text,) = found
        assert warned in text and "sloSeconds" in text and "ns/m" in text


def test_a_spec_target_outside_the_variants_is_warned_as_not_scaled() -> None:
    doc = copy.deepcopy(DOC)
    doc["spec"]["signals"]["p95Latency"] = {"metric": "ttft", "sloSeconds": 2.5}
    assert lint.warnings(model.ScalePolicy.model_validate(doc)) == []
    doc["spec"]["variants"] = [
        {"name": "h100", "target": {"name": "m-h100"}, "nodePool": "h100", "capacity": 8},
        {"name": "l40s", "target": {"name": "m-l40s"}, "nodePool": "l40s", "capacity": 3}]
    (text,) = lint.warnings(model.ScalePolicy.model_validate(doc))
    assert "ns/m" in text and "Deployment m is neither read nor scaled" in text
    doc["spec"]["target"] = {"name": "m-h100"}  # one of the variants: served
    assert lint.warnings(model.ScalePolicy.model_validate(doc)) == []
