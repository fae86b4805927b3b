"""The chart's supported Kubernetes range: rendered with Helm's capabilities at the oldest
and the newest version and validated against that version's schema; the HPAs that
docs/kubernetes.md gives per version are valid exactly where it says."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from helm_python import _native

from . import test_chart, test_monitoring

CHART_YAML = yaml.safe_load((test_chart.CHART / "Chart.yaml").read_text())
DOCS = (test_chart.REPO / "docs" / "kubernetes.md").read_text()
OLDEST = "1.27.0"
NEWEST = "1.37.0"
EVERYTHING = {**test_chart.FULL, **test_monitoring.ALL_ON}


def render_at(kube_version: str, values: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Render as `helm template --kube-version` does. The SDK's Chart.render has no such
    keyword yet, but its native render takes the option (as Chart.render builds it)."""
    chart = helm.Chart.load(str(test_chart.CHART))
    options = {"name": "scaler", "namespace": test_chart.NAMESPACE, "is_install": True,
               "kube_version": f"v{kube_version}"}
    manifests = json.loads(_native.call_string(
        "helm_render", chart._raw(), json.dumps(values), json.dumps(options)))
    return {Path(path).name: [d for d in yaml.safe_load_all(text) if d]
            for path, text in manifests.items() if not path.endswith(".txt")}


def test_the_declared_range_starts_at_the_oldest_tested_version() -> None:
    # Helm's constraint ">=1.27.0-0": the "-0" admits pre-release builds such as the
    # "v1.27.3-eks-a5565ad" that managed control planes report.
    assert CHART_YAML["kubeVersion"] == f">={OLDEST}-0"
    minor = ".".join(OLDEST.split(".")[:2]), ".".join(NEWEST.split(".")[:2])
    assert f"Kubernetes {minor[0]}-{minor[1]}" in DOCS
    assert f"**{minor[0]} to {minor[1]}**" in DOCS


@pytest.mark.parametrize("kube_version", [OLDEST, NEWEST])
def test_renders_and_validates_at_both_ends(kube_version: str) -> None:
    lint = helm.lint(str(test_chart.CHART), EVERYTHING, strict=True,
                     kube_version=f"v{kube_version}")
    assert lint["errors"] == [] and [m for m in lint["messages"] if m["severity"] >= 2] == []
    objects = test_chart.all_objects(render_at(kube_version, EVERYTHING))
    assert {"Deployment", "APIService", "ServiceMonitor", "PrometheusRule"} <= {
        o["kind"] for o in objects}
    for obj in objects:
        if obj["apiVersion"] != test_chart.CERT_MANAGER:
            test_monitoring.validate(obj, kube_version)


def documented_hpas() -> list[tuple[str, str | None, dict[str, Any]]]:
    """(first, last or None, HPA) for each `# For Kubernetes A-B` / `A and later` block."""
    found = []
    for first, last, body in re.findall(
            r"```yaml\n# For Kubernetes (\d+\.\d+)(?:-(\d+\.\d+)| and later)\n(.*?)```", DOCS,
            flags=re.S):
        found.append((first, last or None, yaml.safe_load(body)))
    return found


def test_the_documented_hpas_are_valid_where_the_docs_say() -> None:
    hpas = documented_hpas()
    assert [(first, last) for first, last, _ in hpas] == [("1.27", "1.32"), ("1.37", None)]
    for first, last, hpa in hpas:
        for version in (first, last or NEWEST):
            kubernetes_validate.validate(hpa, f"{version}.0" if version.count(".") == 1
                                         else version, strict=True)
        metric = hpa["spec"]["metrics"][0]["external"]
        assert metric["metric"]["name"] == "scaler_desired_replicas"
        assert metric["target"] == {"type": "AverageValue", "averageValue": "1"}
    _, _, newest = hpas[-1]
    assert {newest["spec"]["behavior"][d]["tolerance"] for d in ("scaleUp", "scaleDown")} == {
        "0"}
    # Before 1.33 the field does not exist: the strict schema refuses it.
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(newest, "1.32.0", strict=True)
