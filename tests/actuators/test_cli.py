"""`scaler kube rbac` prints exactly the rules in scaler.actuators.rbac."""

from __future__ import annotations

import argparse

import pytest
import yaml

from scaler.actuators import cli, rbac


def test_kube_rbac_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="scaler")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kube", "rbac", "--lease-namespace", "ops",
                              "--placeholder-namespace", "headroom"])

    assert args.handler(args) == 0

    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"].get("namespace")) for d in documents] == [
        ("ClusterRole", None), ("Role", "ops"), ("Role", "headroom"), ("Role", "default")]
    printed = {(g, res, v) for d in documents for rule in d["rules"]
               for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]}
    expected = {(r.api_group, res, v) for r in rbac.RULES for res in r.resources for v in r.verbs}
    assert printed == expected
    lease_role = documents[1]["rules"]
    assert lease_role == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "verbs": ["get", "create", "update"]}]
