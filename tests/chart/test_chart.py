"""The Helm chart, rendered with the real Helm SDK and validated against Kubernetes schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from scaler.actuators import rbac
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
        {"apiGroup": "example.com", "resources": ["llamas"]}]},
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


def _grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(namespace or '*', group, resource, verb) for every rule of every Role/ClusterRole."""
    out = set()
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        scope = obj["metadata"].get("namespace", "RELEASE") if obj["kind"] == "Role" else "*"
        for rule in obj["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((scope, group, resource, verb))
    return out


def test_rbac_is_exactly_what_the_code_uses() -> None:
    """The chart grants what scaler.actuators.rbac documents (whose own test records every
    request the adapters make), plus the aggregated API server's usual grants."""
    rendered = render(FULL)
    chart = _grants(rendered["rbac.yaml"])
    code = _grants(rbac.manifests(name="scaler", lease_namespace="RELEASE",
                                  placeholder_namespace="RELEASE",
                                  clusterapi_namespace="default"))
    extras = {("*", "external.metrics.k8s.io", "*", "get"),
              ("*", "external.metrics.k8s.io", "*", "list"),
              ("*", "example.com", "llamas/scale", "get"),
              ("*", "example.com", "llamas/scale", "patch")}
    assert chart - extras == code
    assert extras <= chart
    assert not any(verb == "*" for *_, verb in chart)


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


def test_rendered_settings_load_into_the_service_settings(tmp_path: Path) -> None:
    """The shipped values.yaml must parse into the code's Settings (Knative's config/testdata
    idea): a renamed or mistyped key fails here, not in a cluster."""
    from scaler.service import settings as service_settings

    for values in ({}, FULL, {"settings": {"kube": {"dry_run": True}}}):
        rendered = render(values)
        text = next(o for o in rendered["configmap.yaml"]
                    if o["metadata"]["name"].endswith("-settings"))["data"]["settings.yaml"]
        path = tmp_path / "settings.yaml"
        path.write_text(text)
        loaded = service_settings.load_settings(path, environ={})
        assert loaded.kube.lease.namespace == "scaler-system"
        assert loaded.kube.lease.name == "scaler-leader"
        assert loaded.kube.placeholder.priority_class == "scaler-placeholder"
        assert [str(p) for p in loaded.policies.paths] == ["/etc/scaler/policies"]
    assert loaded.kube.dry_run is True
    defaults = service_settings.Settings()
    chart = service_settings.load_settings(path, environ={})
    # Where the chart does not say otherwise, the code's defaults stand.
    assert chart.engine == defaults.engine and chart.audit == defaults.audit
