"""The chart's CRDs as Helm loads them (crds/, installed before the templates): the three
generated ones, valid apiextensions objects, and the RBAC to read them with policy resources."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from scaler.policy import crd

from .test_chart import CHART, KUBE_VERSIONS, render


def chart_crds() -> dict[str, dict[str, object]]:
    chart = helm.Chart.load(str(CHART))
    return {entry["name"]: yaml.safe_load(entry["data"]) for entry in chart.crds}


def test_helm_ships_the_three_generated_crds() -> None:
    assert chart_crds() == {f"crds/{kind.plural}.yaml": crd.definition(kind)
                            for kind in crd.KINDS}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_shipped_crd_matches_the_kubernetes_schema(kube_version: str) -> None:
    for definition in chart_crds().values():
        kubernetes_validate.validate(definition, kube_version, strict=True)


def test_pools_and_budgets_are_read_cluster_wide_only_with_policy_resources() -> None:
    def fleet_role(values: dict[str, object]) -> list[dict[str, object]]:
        return [obj for obj in render(values)["rbac.yaml"]
                if obj["metadata"]["name"] == "scaler-fleet"]

    assert fleet_role({}) == []
    role, binding = fleet_role({"settings": {"policies": {"resources": True}}})
    assert (role["kind"], binding["kind"]) == ("ClusterRole", "ClusterRoleBinding")
    assert role["rules"] == [
        {"apiGroups": ["scaler.io"], "resources": ["gpupools", "gpubudgets"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["scaler.io"], "resources": ["gpupools/status", "gpubudgets/status"],
         "verbs": ["patch"]}]
