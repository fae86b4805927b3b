"""The Helm chart, rendered with the real Helm SDK and validated against Kubernetes schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from scaler.policy import loader

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "scaler"
KUBE_VERSIONS = ["1.30.0", "1.37.0"]


def render(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(values or {}, name="scaler", namespace="scaler-system",
                            is_install=True)
    out: dict[str, list[dict[str, Any]]] = {}
    for path, text in rendered.items():
        if path.endswith(".txt"):
            continue
        out[Path(path).name] = [d for d in yaml.safe_load_all(text) if d]
    return out


def all_objects(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [obj for objs in rendered.values() for obj in objs]


def example_policies() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((REPO / "config").glob("*.yaml"))}


FULL = {
    "policies": example_policies(),
    "rbac": {"clusterApi": True, "extraScaleTargets": [
        {"apiGroup": "leaderworkerset.x-k8s.io", "resources": ["leaderworkersets"]}]},
    "externalMetricsApi": {"tlsSecret": "scaler-tls", "caBundle": "Q0E="},
}


def test_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", [{}, FULL], ids=["defaults", "full"])
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_matches_the_kubernetes_schema(values: dict[str, Any],
                                                      kube_version: str) -> None:
    objects = all_objects(render(values))
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "ClusterRole", "Role", "Service",
            "APIService", "PriorityClass", "PodDisruptionBudget"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_policies_in_the_configmap_load_without_errors(tmp_path: Path) -> None:
    rendered = render(FULL)
    (policies,) = [o for o in rendered["configmap.yaml"] if o["metadata"]["name"].endswith(
        "-policies")]
    for name, text in policies["data"].items():
        (tmp_path / name).write_text(text)
    result = loader.load_paths([tmp_path])
    assert result.errors == []
    assert len(result.policies) == len(example_policies())


def test_rbac_is_no_wider_than_needed() -> None:
    rendered = render(FULL)
    rules = [r for o in rendered["rbac.yaml"] if o["kind"] in ("ClusterRole", "Role")
             for r in o.get("rules", [])]
    for rule in rules:
        assert "*" not in rule["verbs"]
        if "external.metrics.k8s.io" not in rule["apiGroups"]:
            assert "*" not in rule["resources"]
        # Targets are only ever patched through their scale subresource, cluster-wide.
        if {"patch", "update"} & set(rule["verbs"]) and rule["apiGroups"] != [
                "coordination.k8s.io"]:
            assert all(r.endswith("/scale") or r == "events" for r in rule["resources"]) or (
                rule["resources"] == ["deployments"])
    cluster_role = next(o for o in rendered["rbac.yaml"] if o["kind"] == "ClusterRole")
    deployment_writes = [r for r in cluster_role["rules"]
                         if "deployments" in r["resources"] and set(r["verbs"]) - {
                             "get", "list", "watch"}]
    assert deployment_writes == [], "only the namespaced Role may write Deployments"
    scale = {res for r in cluster_role["rules"] for res in r["resources"] if "/scale" in res}
    assert scale == {"deployments/scale", "statefulsets/scale", "leaderworkersets/scale",
                     "machinedeployments/scale"}


def test_tls_secret_is_mounted_and_named_in_settings() -> None:
    rendered = render(FULL)
    (deployment,) = rendered["deployment.yaml"]
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "scaler-tls"}} in pod["volumes"]
    settings = yaml.safe_load(next(
        o for o in rendered["configmap.yaml"] if o["metadata"]["name"].endswith("-settings")
    )["data"]["settings.yaml"])
    assert settings["metrics_api"]["cert_file"] == "/etc/scaler/tls/tls.crt"
    (api_service,) = rendered["apiservice.yaml"]
    assert api_service["spec"]["caBundle"] == "Q0E=" and "insecureSkipTLSVerify" not in (
        api_service["spec"])


def test_registration_can_be_left_to_another_provider() -> None:
    rendered = render({"externalMetricsApi": {"register": False}})
    assert rendered.get("apiservice.yaml", []) == []
    names = [o["metadata"]["name"] for o in rendered["rbac.yaml"]]
    assert not any("auth-delegator" in n for n in names)
