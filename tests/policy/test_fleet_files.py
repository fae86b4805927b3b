"""GpuPool and GpuBudget files: they load beside policies, each mistake names file, document
and field, `scaler validate` checks references across files, a reload keeps the last good."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from scaler import cli
from scaler.core import vocabulary
from scaler.policy import cli as policy_cli
from scaler.policy import fleet, loader
from scaler.service import policies
from tests import schema_fields

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"


def pool_text(name: str = "h100", *, spec: str = "gpusPerNode: 8\n  maxNodes: 4") -> str:
    return (f"apiVersion: scaler.io/v1alpha1\nkind: GpuPool\nmetadata: {{name: {name}}}\n"
            f"spec:\n  {spec}\n")


def budget_text(name: str = "search", *,
                spec: str = "tenant: search\n  pool: h100\n  guaranteedGpus: 8\n  maxGpus: 16"
                ) -> str:
    return (f"apiVersion: scaler.io/v1alpha1\nkind: GpuBudget\nmetadata: {{name: {name}}}\n"
            f"spec:\n  {spec}\n")


def policy_text(name: str = "m", *, labels: str = "{tenant: search}", extra: str = "",
                node_pool: str = "{name: h100, gpusPerNode: 8}") -> str:
    return textwrap.dedent(f"""\
        apiVersion: scaler.io/v1alpha1
        kind: ScalePolicy
        metadata: {{name: {name}, namespace: ns, labels: {labels}}}
        spec:
          target: {{name: {name}}}
          replicas: {{min: 1, max: 8}}
          signals:
            concurrency: {{targetPerReplica: 16}}
          nodePool: {node_pool}
        """) + extra


def errors_of(tmp_path: Path, text: str) -> list[tuple[int | None, str, str]]:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    result = loader.load_paths([path])
    assert result.pools == [] and result.budgets == [] and result.loaded == []
    assert {error.path for error in result.errors} == {str(path)}
    return [(error.document, error.field, error.message) for error in result.errors]


# -- the shipped example ------------------------------------------------------------------


def test_the_shipped_pools_are_the_ones_the_shipped_policies_name() -> None:
    result = loader.load_paths([CONFIG])
    assert result.errors == [] and loader.reference_errors(result) == []
    shipped = fleet.fleet_of(result)
    assert len(shipped.pools) >= 2 and len(shipped.budgets) >= 2
    for policy in result.policies:
        pool = shipped.pool_of(policy)
        assert pool is not None, policy.key
        assert pool.spec.resource_name == policy.spec.resources.resource_name
        assert shipped.budgets_of(policy), policy.key
    # A training reservation, and guarantees within what it leaves.
    assert any(pool.spec.reservations for pool in shipped.pools.values())
    owners = {budget.spec.owner[0] for budget in shipped.budgets.values()}
    assert owners == {"tenant", "cost-center"}


def test_a_policy_names_its_tier_tenant_and_cost_centre() -> None:
    (policy,) = loader.load_paths([CONFIG / "llama-70b.yaml"]).policies
    assert policy.spec.tier is vocabulary.Tier.ONLINE  # the default
    assert (policy.tenant, policy.cost_center) == ("search", "ai-platform")
    path_less = loader.parse_documents(
        policy_text(labels="{}", extra="  tier: batch\n"), "p.yaml").policies[0]
    assert path_less.spec.tier is vocabulary.Tier.BATCH
    assert (path_less.tenant, path_less.cost_center) == (None, None)
    wrong = loader.parse_documents(policy_text(extra="  tier: urgent\n"), "p.yaml")
    assert [(e.document, e.field) for e in wrong.errors] == [(0, "spec.tier")]
    assert "'online', 'batch' or 'dev'" in wrong.errors[0].message


def test_defaults_and_derived_numbers() -> None:
    result = loader.parse_documents(
        pool_text(spec="gpusPerNode: 8\n  maxNodes: 4\n  reservations: [{name: training, "
                       "gpus: 8}]") + "---\n" + budget_text(spec="costCenter: ml\n  maxGpus: 4"),
        "f.yaml")
    assert result.errors == []
    pool, budget = result.pools[0].value, result.budgets[0].value
    assert (pool.spec.resource_name, pool.spec.gpu_hourly, pool.spec.topology) == (
        "nvidia.com/gpu", 2.5, None)
    assert (pool.spec.total_gpus, pool.spec.reserved_gpus, pool.spec.shareable_gpus) == (
        32, 8, 24)
    assert (budget.spec.pool, budget.spec.guaranteed_gpus, budget.spec.borrow) == (None, 0, True)
    assert budget.spec.owner == ("cost-center", "ml")
    assert result.budgets[0].where == "f.yaml (document 1)"


# -- each mistake names file, document and field ---------------------------------------------


@pytest.mark.parametrize(("spec", "field", "message"), [
    ("gpusPerNode: 0\n  maxNodes: 4", "spec.gpusPerNode", "greater than or equal to 1"),
    ("gpusPerNode: 8", "spec.maxNodes", "Field required"),
    ("gpusPerNode: 8\n  maxNodes: 4\n  maxNode: 5", "spec.maxNode", "unknown field"),
    ("gpusPerNode: 8\n  maxNodes: 4\n  resourceName: GPU", "spec.resourceName",
     "'GPU' is not an extended resource name"),
    ("gpusPerNode: 8\n  maxNodes: 4\n  topology: {nvlinkDomainGpus: 3}", "spec",
     "topology.nvlinkDomainGpus (3) must divide gpusPerNode (8) or be a multiple of it"),
    ("gpusPerNode: 8\n  maxNodes: 2\n  reservations: [{name: training, gpus: 17}]", "spec",
     "reservations hold 17 GPUs, more than the pool's 16 (gpusPerNode 8 x maxNodes 2)"),
    ("gpusPerNode: 8\n  maxNodes: 2\n  reservations: [{name: t, gpus: 1}, {name: t, gpus: 1}]",
     "spec", "reservations: t named more than once"),
    ("gpusPerNode: 8\n  maxNodes: 2\n  reservations: [{name: T, gpus: 1}]",
     "spec.reservations[0].name", "reservation name 'T' is not a valid Kubernetes name"),
])
def test_a_bad_pool_names_its_field(tmp_path: Path, spec: str, field: str,
                                    message: str) -> None:
    # Document 1: the policy before it loads, the error says which document is wrong.
    path = tmp_path / "f.yaml"
    path.write_text(policy_text() + "---\n" + pool_text(spec=spec))
    result = loader.load_paths([path])
    assert [item.policy.key for item in result.loaded] == ["ns/m"] and result.pools == []
    (error,) = result.errors
    assert (error.path, error.document, error.field) == (str(path), 1, field)
    assert message in error.message


def test_a_wide_nvlink_domain_spans_nodes() -> None:
    # GB200 NVL72: 18 nodes of 4 GPUs in one NVLink domain of 72.
    result = loader.parse_documents(
        pool_text(spec="gpusPerNode: 4\n  maxNodes: 18\n  topology: {nvlinkDomainGpus: 72}"),
        "f.yaml")
    assert result.errors == [] and len(result.pools) == 1


@pytest.mark.parametrize(("spec", "field", "message"), [
    ("maxGpus: 8", "spec", "set exactly one of tenant and costCenter"),
    ("tenant: a\n  costCenter: b\n  maxGpus: 8", "spec", "set exactly one of tenant"),
    ("tenant: a\n  guaranteedGpus: 9\n  maxGpus: 8", "spec",
     "guaranteedGpus (9) is above maxGpus (8)"),
    ("tenant: a\n  guaranteedGpus: 4\n  maxGpus: 8\n  borrow: false", "spec",
     "borrow is off, so the budget can never hold more than guaranteedGpus (4)"),
    ("tenant: a\n  maxGpus: 0", "spec.maxGpus", "greater than or equal to 1"),
    ("tenant: -a\n  maxGpus: 8", "spec.tenant", "'-a' is not a valid label value"),
    ("tenant: a\n  pool: H100\n  maxGpus: 8", "spec.pool", "pool name 'H100' is not a valid"),
    ("tenant: a\n  maxGpus: 8\n  guaranteed: 2", "spec.guaranteed", "unknown field"),
])
def test_a_bad_budget_names_its_field(tmp_path: Path, spec: str, field: str,
                                      message: str) -> None:
    ((document, where, text),) = errors_of(tmp_path, budget_text(spec=spec))
    assert (document, where) == (0, field)
    assert message in text


def test_a_misspelt_kind_of_ours_is_an_error_others_are_skipped(tmp_path: Path) -> None:
    (document, field, message), = errors_of(
        tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n"
        + pool_text().replace("kind: GpuPool", "kind: GPUPool"))
    assert (document, field) == (1, "kind")
    assert message == ("unknown kind 'GPUPool' for scaler.io/v1alpha1: one of ScalePolicy, "
                       "GpuPool, GpuBudget")


def test_a_pool_or_budget_defined_twice_loads_once(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(pool_text() + "---\n" + budget_text())
    (tmp_path / "b.yaml").write_text(pool_text(spec="gpusPerNode: 8\n  maxNodes: 9")
                                     + "---\n" + budget_text())
    result = loader.load_paths([tmp_path])
    assert [item.value.spec.max_nodes for item in result.pools] == [4]
    assert [item.path for item in result.budgets] == [str(tmp_path / "a.yaml")]
    assert [(Path(e.path).name, e.document, e.field, e.reason) for e in result.errors] == [
        ("b.yaml", 0, "metadata.name", "duplicate"), ("b.yaml", 1, "metadata.name", "duplicate")]
    assert f"GpuPool h100 is already defined in {tmp_path / 'a.yaml'} (document 0)" in (
        result.errors[0].message)


def test_a_folder_of_mixed_kinds_loads(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yaml").write_text(policy_text())
    (tmp_path / "pools.yaml").write_text(pool_text() + "---\n" + budget_text()
                                         + "---\n" + policy_text("n"))
    result = loader.load_paths([tmp_path])
    assert result.errors == []
    assert sorted(p.key for p in result.policies) == ["ns/m", "ns/n"]
    shipped = fleet.fleet_of(result)
    assert list(shipped.pools) == ["h100"] and list(shipped.budgets) == ["search"]
    (policy,) = [p for p in result.policies if p.key == "ns/m"]
    assert shipped.pool_of(policy) is shipped.pools["h100"]
    assert shipped.budgets_of(policy) == [shipped.budgets["search"]]


# -- references across files: scaler validate -----------------------------------------------


def validate(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, dict[str, Any]]:
    code = cli.main(["validate", "--json", *map(str, paths)])
    return code, json.loads(capsys.readouterr().out)


def located(report: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(Path(e["path"]).name, e["field"]): e["message"] for e in report["errors"]}


def test_validate_checks_policies_against_their_pools(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(pool_text(spec="gpusPerNode: 4\n  maxNodes: 2\n  resourceName: "
                               "nvidia.com/mig-1g.10gb\n  topology: {nvlinkDomainGpus: 2}"))
    (tmp_path / "a.yaml").write_text(policy_text(
        "a", node_pool="{name: h100, gpusPerNode: 8, maxNodes: 3}",
        extra="  resources: {gpusPerReplica: 4}\n"))
    (tmp_path / "b.yaml").write_text(policy_text("b", node_pool="{name: h200}"))
    code, report = validate(capsys, tmp_path)
    assert code == 1
    where = f"GpuPool h100 in {pools} (document 0)"
    assert located(report) == {
        ("a.yaml", "spec.resources.resourceName"):
            f"nvidia.com/gpu, but {where} offers nvidia.com/mig-1g.10gb",
        ("a.yaml", "spec.nodePool.gpusPerNode"): f"8, but {where} has 4 GPUs per node",
        ("a.yaml", "spec.nodePool.maxNodes"): f"3, above the 2 nodes of {where}",
        ("a.yaml", "spec.resources.gpusPerReplica"):
            f"4 GPUs per replica do not fit in one NVLink domain of 2 GPUs of {where}: a "
            "tensor-parallel replica needs one",
        ("b.yaml", "spec.nodePool.name"):
            f"names GpuPool 'h200', which is not defined (defined: h100 in {pools} "
            "(document 0))",
    }


def test_validate_checks_budgets_against_the_pools(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    # 2 x 8 = 16 GPUs, 4 reserved for training: 12 may be guaranteed.
    pools.write_text(pool_text(spec="gpusPerNode: 8\n  maxNodes: 2\n  reservations: "
                               "[{name: training, gpus: 4}]"))
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("---\n".join([
        budget_text("a", spec="tenant: a\n  pool: h100\n  guaranteedGpus: 8\n  maxGpus: 16"),
        budget_text("b", spec="tenant: b\n  pool: h100\n  guaranteedGpus: 6\n  maxGpus: 16"),
        budget_text("c", spec="tenant: c\n  pool: a100\n  maxGpus: 16"),
        budget_text("d", spec="tenant: a\n  pool: h100\n  maxGpus: 4"),
    ]))
    code, report = validate(capsys, tmp_path)
    assert code == 1
    assert located(report) == {
        ("budgets.yaml", "spec.guaranteedGpus"):
            f"the guarantees on GpuPool h100 in {pools} (document 0) come to 14 GPUs with "
            f"a: 8 in {budgets} (document 0), above its 12 unreserved GPUs (4 reserved)",
        ("budgets.yaml", "spec.pool"):
            f"names GpuPool 'a100', which is not defined (defined: h100 in {pools} "
            "(document 0))",
        ("budgets.yaml", "spec.tenant"):
            f"tenant a on pool h100 is already covered by GpuBudget a in {budgets} "
            "(document 0): merge the two",
    }
    assert [e["document"] for e in report["errors"]] == [3, 2, 1]


def test_guarantees_on_every_pool_count_against_all_pools(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pools.yaml").write_text(pool_text() + "---\n" + pool_text("l40s"))
    everywhere = budget_text(spec="costCenter: ml\n  guaranteedGpus: 64\n  maxGpus: 64")
    (tmp_path / "b.yaml").write_text(everywhere)
    assert validate(capsys, tmp_path)[0] == 0  # 2 pools x 32 GPUs
    (tmp_path / "b.yaml").write_text(everywhere.replace("64", "65"))
    code, report = validate(capsys, tmp_path)
    assert code == 1
    (message,) = located(report).values()
    assert message.startswith("the guarantees on all pools together (defined: h100 in ")
    assert message.endswith("come to 65 GPUs, above its 64 unreserved GPUs (0 reserved)")


def test_without_pool_files_a_node_pool_needs_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text(policy_text(node_pool="{name: anything}"))
    assert validate(capsys, tmp_path) == (0, {
        "valid": [{"policy": "ns/m", "path": str(tmp_path / "m.yaml"), "document": 0}],
        "fleet": [], "errors": [], "warnings": []})


def test_a_file_of_pools_alone_validates(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(pool_text() + "---\n" + budget_text())
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"ok    GpuPool h100  ({path}, document 0)" in out
    assert out.endswith("0 valid, 0 error(s); 1 GpuPool(s), 1 GpuBudget(s)\n")


# -- schema and reference ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [fleet.POOL_KIND, fleet.BUDGET_KIND])
def test_schema_of_a_kind_is_described_and_matches_the_readme(
        kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema", "--kind", kind]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == policy_cli.schema_document(kind) and printed["title"] == kind
    assert [f.path for f in schema_fields.fields(printed)
            if not f.description or len(f.description) < 12] == []
    rows = schema_fields.table_rows((REPO / "README.md").read_text(), section=f"### {kind}")
    assert schema_fields.check_table(rows, printed) == []


# -- the service's reload keeps the last good pools and budgets -------------------------------


async def test_a_reload_keeps_the_last_good_pools_and_budgets(tmp_path: Path) -> None:
    applied: list[policies.PolicySet] = []

    async def apply(policy_set: policies.PolicySet) -> None:
        applied.append(policy_set)

    (tmp_path / "m.yaml").write_text(policy_text())
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(pool_text() + "---\n" + budget_text())
    watcher = policies.PolicyWatcher([tmp_path], poll_seconds=60, apply=apply)
    first = await watcher.load_now()
    assert first.errors == () and sorted(first.policies) == ["ns/m"]
    assert first.fleet.pools["h100"].spec.max_nodes == 4
    assert list(first.fleet.budgets) == ["search"]

    # A typo in the new version: the pool and the budget in force stay.
    fleet_file.write_text(pool_text(spec="gpusPerNode: 8\n  maxNodes: -1") + "---\n"
                          + budget_text().replace("maxGpus", "maxGpu"))
    assert await watcher.changed()
    broken = await watcher.load_now()
    assert [(e.document, e.field) for e in broken.errors] == [
        (0, "spec.maxNodes"), (1, "spec.maxGpus"), (1, "spec.maxGpu")]
    assert broken.fleet == first.fleet and applied[-1] is broken

    # A valid new version replaces them; a clean file without the budget removes it.
    fleet_file.write_text(pool_text(spec="gpusPerNode: 8\n  maxNodes: 6"))
    fixed = await watcher.load_now()
    assert fixed.errors == () and fixed.fleet.pools["h100"].spec.max_nodes == 6
    assert fixed.fleet.budgets == {}
