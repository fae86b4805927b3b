"""`scaler kube rbac` prints exactly the rules in scaler.actuators.rbac."""

from __future__ import annotations

import argparse

import pytest
import yaml

from scaler.actuators import cli, rbac


def test_kube_rbac_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="scaler")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kube", "rbac", "--namespace", "ops", "--watch-namespace", "a",
                              "--watch-namespace", "b", "--placeholder",
                              "--placeholder-namespace", "headroom"])

    assert args.handler(args) == 0

    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    roles = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
             for d in documents if d["kind"] in ("Role", "ClusterRole")]
    assert roles == [("ClusterRole", "scaler-nodes", None), ("Role", "scaler-targets", "a"),
                     ("Role", "scaler-targets", "b"), ("Role", "scaler-lease", "ops"),
                     ("Role", "scaler-learned", "ops"), ("Role", "scaler-placeholder", "headroom"),
                     ("ClusterRole", "scaler:external-metrics-reader", None)]
    subject = {"kind": "ServiceAccount", "name": "scaler", "namespace": "ops"}
    assert documents[0] == {"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "scaler", "namespace": "ops"}}
    printed = {(g, res, v) for _, g, res, v in rbac.grants(documents, subject)}
    expected = {(r.api_group, res, v) for r in rbac.RULES
                if r.scope not in ("clusterapi", "capacitybuffer", "policies", "fleet")
                for res in r.resources for v in r.verbs}
    assert printed == expected
    lease_role = next(d for d in documents if d["metadata"]["name"] == "scaler-lease")
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"],
                                    "resources": ["leases"],
                                    "verbs": ["get", "create", "update"]}]


def test_kube_rbac_without_target_namespaces_says_what_to_give(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="scaler")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kube", "rbac"])
    assert args.handler(args) == 2
    assert "--watch-namespace" in capsys.readouterr().err
