"""ScalePolicy files: shipped examples load; each class of mistake names file and field."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from scaler.policy import cli as policy_cli
from scaler.policy import loader

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"

VALID = textwrap.dedent("""\
    apiVersion: scaler.io/v1alpha1
    kind: ScalePolicy
    metadata: {name: m, namespace: ns}
    spec:
      target: {name: m}
      replicas: {min: 1, max: 8}
      signals:
        concurrency: {targetPerReplica: 16}
""")


def test_every_shipped_example_loads() -> None:
    files = sorted(CONFIG.glob("*.yaml"))
    assert len(files) >= 3
    result = loader.load_paths([CONFIG])
    assert result.errors == []
    assert {p.spec.resources.resource_name for p in result.policies} >= {
        "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}
    tp8 = [p for p in result.policies if p.spec.resources.gpus_per_replica == 8]
    assert tp8 and tp8[0].spec.node_pool is not None
    assert any(p.spec.warm_floor.schedules for p in result.policies)


def test_shipped_examples_validate_against_the_published_schema() -> None:
    for path in sorted(CONFIG.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            jsonschema.validate(document, policy_cli.schema_document(document["kind"]))


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors_for(tmp_path: Path, text: str) -> list[loader.PolicyError]:
    result = loader.load_paths([write(tmp_path, text)])
    assert result.policies == []
    return result.errors


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("replicas: {min: 1, max: 8}", "replicas: {min: 9, max: 8}", "spec.replicas",
         "min (9) is greater than max (8)"),
        ("replicas: {min: 1, max: 8}", "replicas: {min: 1, max: 8}\n  warmFloor: {replicas: 9}",
         "spec", "warmFloor (9) is above replicas.max (8)"),
        ("targetPerReplica: 16", "targetPerReplica: -1",
         "spec.signals.concurrency.targetPerReplica", "greater than 0"),
        ("targetPerReplica: 16", "targetPerReplica: lots",
         "spec.signals.concurrency.targetPerReplica", "valid number"),
        ("concurrency: {targetPerReplica: 16}", "concurency: {targetPerReplica: 16}",
         "spec.signals.concurency", "unknown field"),
        ("target: {name: m}", "target: {name: My_Model}", "spec.target.name",
         "not a valid Kubernetes name"),
        ("concurrency: {targetPerReplica: 16}", "p95Latency: {sloSeconds: 2}", "spec.signals",
         "at least one demand signal"),
        ("concurrency: {targetPerReplica: 16}",
         "concurrency: {targetPerReplica: 16}\n    kvCache: {targetUtilization: 1.5}",
         "spec.signals.kvCache.targetUtilization", "less than or equal to 1"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  warmFloor: {schedules: [{days: Mon-Fri, from: '08:00', "
         "to: '20:00', timeZone: Mars/Olympus, replicas: 2}]}",
         "spec.warmFloor.schedules[0].timeZone", "unknown time zone"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  warmFloor: {schedules: [{days: Mon-Fri, from: '8am', "
         "to: '20:00', replicas: 2}]}",
         "spec.warmFloor.schedules[0].from", "not HH:MM"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  warmFloor: {schedules: [{days: Mon-Fry, from: '08:00', "
         "to: '20:00', replicas: 2}]}",
         "spec.warmFloor.schedules[0].days", "unknown day range"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  resources: {gpusPerReplica: 8}\n"
         "  nodePool: {name: p, gpusPerNode: 4}",
         "spec", "gpusPerReplica (8) is more than nodePool.gpusPerNode (4)"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 2, max: 8}\n  resources: {gpusPerReplica: 4}\n  budget: {maxGpus: 4}",
         "spec", "cannot hold the floor"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  behavior: {scaleUp: {stabilizationSeconds: 0, "
         "policies: [{type: Pods, value: 0, periodSeconds: 60}]}}",
         "spec.behavior.scaleUp.policies[0].value", "greater than 0"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  resources: {resourceName: gpu}",
         "spec.resources.resourceName", "not an extended resource name"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  nodePool: {name: p, actuator: clusterapi}",
         "spec.nodePool", "needs machineDeployment"),
        ("replicas: {min: 1, max: 8}",
         "replicas: {min: 1, max: 8}\n  sources: {sharedQueueSources: [gateway, '']}",
         "spec.sources.sharedQueueSources[1]", "at least 1 character"),
        ("apiVersion: scaler.io/v1alpha1", "apiVersion: scaler.io/v2", "apiVersion",
         "scaler.io/v1alpha1"),
    ],
)
def test_each_mistake_names_its_field(tmp_path: Path, old: str, new: str, field: str,
                                      message: str) -> None:
    assert old in VALID
    errors = errors_for(tmp_path, VALID.replace(old, new))
    assert errors, "the broken file was accepted"
    assert any(e.field == field and message in e.message for e in errors), errors
    assert all(e.path.endswith("p.yaml") and e.document == 0 for e in errors)


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    (error,) = errors_for(tmp_path, VALID + "  bad: [unclosed\n")
    assert "invalid YAML" in error.message and "line" in error.message


def test_one_bad_document_does_not_hide_the_good_ones(tmp_path: Path) -> None:
    bad = VALID.replace("name: m, namespace", "name: n, namespace").replace(
        "max: 8", "max: zero")
    result = loader.load_paths([write(tmp_path, VALID + "---\n" + bad)])
    assert [p.key for p in result.policies] == ["ns/m"]
    assert [(e.document, e.field) for e in result.errors] == [(1, "spec.replicas.max")]


def test_duplicate_names_and_targets_across_files(tmp_path: Path) -> None:
    write(tmp_path, VALID, "a.yaml")
    write(tmp_path, VALID, "b.yaml")
    other = VALID.replace("name: m, namespace", "name: other, namespace")
    write(tmp_path, other, "c.yaml")
    result = loader.load_paths([tmp_path])
    assert [p.key for p in result.policies] == ["ns/m"]
    messages = {(Path(e.path).name, e.field): e.message for e in result.errors}
    assert "already defined in" in messages[("b.yaml", "metadata.name")]
    assert "already scaled by policy ns/m" in messages[("c.yaml", "spec.target")]


def test_configmap_layout_is_read_once(tmp_path: Path) -> None:
    """A mounted ConfigMap: real files under ..data, symlinks at the top."""
    data = tmp_path / "..2026_11_29_00_00_00.1"
    data.mkdir()
    (data / "m.yaml").write_text(VALID)
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "m.yaml").symlink_to("..data/m.yaml")
    result = loader.load_paths([tmp_path])
    assert [p.key for p in result.policies] == ["ns/m"] and result.errors == []


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scaler", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60, check=False)


def test_validate_command(tmp_path: Path) -> None:
    ok = run_cli("validate", str(CONFIG))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shipped = sum(p.read_text().count("\nkind: ScalePolicy\n") for p in CONFIG.glob("*.yaml"))
    assert f"{shipped} valid, 0 error(s)" in ok.stdout
    bad = write(tmp_path, VALID.replace("max: 8", "max: 0"))
    failed = run_cli("validate", str(bad))
    assert failed.returncode == 1
    assert f"{bad} (document 0): spec.replicas.max:" in failed.stdout
    as_json = run_cli("validate", "--json", str(bad), str(tmp_path / "missing.yaml"))
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1
    assert {e["field"] for e in report["errors"]} == {"spec.replicas.max", ""}


def test_schema_command_prints_a_json_schema() -> None:
    out = run_cli("schema")
    schema = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "warmFloor" in schema["$defs"]["ScalePolicySpec"]["properties"]
