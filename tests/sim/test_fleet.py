"""Fleet replay (`scaler simulate --fleet`): shared pools, budgets, the JSON schema, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import yaml

from scaler import cli
from scaler.sim import fleet, report

from .conftest import BUNDLED, REPO
from .factories import step_trace

# A 4-GPU pool (one node) of which 1 GPU is held for training: 3 shared. Two online
# models (tenants a and b) and one batch model whose load wants more than the pool.
POOL = {"apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "small"},
        "spec": {"gpusPerNode": 4, "maxNodes": 1, "gpuHourly": 2.0}}
BUDGETS = [
    {"apiVersion": "scaler.io/v1alpha1", "kind": "GpuBudget", "metadata": {"name": name},
     "spec": {"tenant": name, "pool": "small", "guaranteedGpus": guaranteed,
              "maxGpus": ceiling, "borrow": True}}
    for name, guaranteed, ceiling in (("a", 1, 2), ("b", 1, 2), ("research", 0, 2))]


def _policy(name: str, *, tenant: str, tier: str) -> dict[str, Any]:
    base: dict[str, Any] = yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text())
    base["metadata"] = {"name": name, "namespace": "fleet",
                        "labels": {"tenant": tenant, "cost-center": f"cc-{tenant}"}}
    spec = base["spec"]
    spec["target"]["name"] = name
    spec["warmFloor"] = {"replicas": 1}
    spec["replicas"] = {"min": 1, "max": 4}
    spec["nodePool"] = {"name": "small", "gpusPerNode": 4, "maxNodes": 1, "actuator": "none"}
    spec["tier"] = tier
    return base


def _write_trace(path: Path, *, rate: float, seed: int) -> None:
    """A short step: quiet, then `rate` req/s of short chat requests for a minute and a half."""
    trace = step_trace(segments=[(20.0, rate / 4), (90.0, rate), (20.0, rate / 4)],
                       input_tokens=600, output_tokens=120, seed=seed)
    rows = "\n".join(f"{t:.3f},{i},{o}" for t, i, o in zip(
        trace.arrival_s, trace.input_tokens, trace.output_tokens, strict=True))
    path.write_text("timestamp_s,input_tokens,output_tokens\n" + rows + "\n")


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fleet")
    (folder / "pool.yaml").write_text(yaml.safe_dump(POOL))
    (folder / "budgets.yaml").write_text(yaml.safe_dump_all(BUDGETS))
    policies = [_policy("chat-a", tenant="a", tier="online"),
                _policy("chat-b", tenant="b", tier="online"),
                _policy("offline", tenant="research", tier="batch")]
    (folder / "models.yaml").write_text(yaml.safe_dump_all(policies))
    # Online: ~1 replica each at their peak; batch: about 4 replicas' worth, more than the
    # 3 shared GPUs and more than its budget of 2.
    for name, rate, seed in (("a", 6.0, 1), ("b", 6.0, 2), ("batch", 60.0, 3)):
        _write_trace(folder / f"{name}.csv", rate=rate, seed=seed)
    document = {
        "pools": ["pool.yaml"], "budgets": ["budgets.yaml"],
        "reservations": [{"pool": "small", "name": "training", "gpus": 1}],
        "models": [{"policy": "models.yaml", "name": name, "trace": {"path": f"{trace}.csv"}}
                   for name, trace in (("chat-a", "a"), ("chat-b", "b"),
                                       ("offline", "batch"))],
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(document))
    return folder


@pytest.fixture(scope="module")
def loaded(fleet_dir: Path) -> fleet.Fleet:
    return fleet.load_fleet(fleet_dir / "fleet.yaml")


@pytest.fixture(scope="module")
def scaler_run(loaded: fleet.Fleet) -> fleet.FleetStrategyResult:
    return fleet.replay(loaded, strategy="scaler")


@pytest.fixture(scope="module")
def kpa_run(loaded: fleet.Fleet) -> fleet.FleetStrategyResult:
    return fleet.replay(loaded, strategy="kpa")


def test_the_fleet_file_loads_with_its_reservation_and_pool_prices(loaded: fleet.Fleet
                                                                   ) -> None:
    pool = loaded.pools["small"].spec
    assert (pool.total_gpus, pool.reserved_gpus, pool.shareable_gpus) == (4, 1, 3)
    assert [m.key for m in loaded.members] == ["fleet/chat-a", "fleet/chat-b", "fleet/offline"]
    # Every model is priced at its pool's GPU hour, not its policy's own 2.50.
    assert {m.policy.spec.cost.gpu_hourly for m in loaded.members} == {2.0}
    assert [m.tier.value for m in loaded.members] == ["online", "online", "batch"]


def test_scaler_keeps_every_budget_and_the_reservation(
    loaded: fleet.Fleet, scaler_run: fleet.FleetStrategyResult,
    kpa_run: fleet.FleetStrategyResult,
) -> None:
    summary = scaler_run.fleet
    assert summary["budget_violations"] == 0, summary["violations_by"]
    # The batch model, started at what its load needs (4), is held to its budget of 2
    # GPUs from the first decision on, while KPA keeps asking for more.
    assert scaler_run.models["fleet/offline"].summary["max_replicas"] > 2
    assert max(scaler_run.models["fleet/offline"].series["desired"]) <= 2
    assert max(kpa_run.models["fleet/offline"].series["desired"]) > 2
    # The same count catches a baseline that takes the batch budget's and training's GPUs.
    assert kpa_run.fleet["budget_violations"] > 0
    assert "budget research" in kpa_run.fleet["violations_by"]


def test_a_baseline_is_held_to_the_pools_hard_size(
    loaded: fleet.Fleet, kpa_run: fleet.FleetStrategyResult,
) -> None:
    """KPA asks beyond the pool (its spec.replicas over all models exceed 4 GPUs) and
    its pods beyond the pool stay pending: never more than 4 GPUs held."""
    asked = sum(r.summary["max_replicas"] for r in kpa_run.models.values())
    assert asked > loaded.pools["small"].spec.total_gpus
    assert kpa_run.fleet["peak_gpus"]["small"] <= loaded.pools["small"].spec.total_gpus
    series = kpa_run.pool_series["small"]
    held = np.sum([series[tier] for tier in ("online", "batch", "dev")], axis=0)
    assert held.max() <= 4
    # Pending pods hold no GPU, so are billed nothing: the fleet's GPU-hours fit in the
    # pool's 4 GPUs over the longest trace.
    hours = max(m.trace.duration_s for m in loaded.members) / 3600.0
    assert kpa_run.fleet["gpu_hours"] <= 4 * hours + 1e-6


def test_json_matches_the_schema_and_the_cli_writes_it(fleet_dir: Path, tmp_path: Path
                                                       ) -> None:
    out, page = tmp_path / "fleet.json", tmp_path / "fleet.html"
    code = cli.main(["simulate", "--fleet", str(fleet_dir / "fleet.yaml"), "--strategies",
                     "hpa", "--json", str(out), "--report", str(page)])
    assert code == 0
    document = json.loads(out.read_text())
    jsonschema.validate(document, report.FLEET_SCHEMA)
    for model in document["models"].values():
        jsonschema.validate(model, report.SCHEMA)
        assert set(model["strategies"]) == {"hpa"}
    totals = document["strategies"]["hpa"]["fleet"]
    by_tenant = totals["by_tenant"]
    assert set(by_tenant) == {"a", "b", "research"}
    assert sum(t["gpu_hours"] for t in by_tenant.values()) == pytest.approx(
        totals["gpu_hours"], abs=1e-3)
    assert set(totals["by_cost_center"]) == {"cc-a", "cc-b", "cc-research"}
    assert set(totals["by_tier"]) == {"online", "batch"}
    assert "The pools' GPUs by tier" in page.read_text()
    del document["strategies"]["hpa"]["fleet"]["budget_violations"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, report.FLEET_SCHEMA)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["models"][0]["trace"].update(rateScale=0), "models[0].trace.rateScale"),
    (lambda d: d["models"][1].update(polcy="x.yaml"), "models[1].polcy: unknown field"),
    (lambda d: d["reservations"][0].update(pool="big"), "reservations[0].pool: 'big' is not"),
    (lambda d: d["models"][2]["trace"].update(path="missing.csv"),
     "models[2].trace.path: "),
    (lambda d: d["models"][0].update(name="nobody"), "models[0].policy: "),
    (lambda d: d.update(models=[d["models"][0], d["models"][0]]), "fleet/chat-a named more"),
    (lambda d: d["models"][2].update(terminationGracePeriodSeconds=-1),
     "models[2].terminationGracePeriodSeconds: Input should be greater than or equal to 0"),
    (lambda d: d["models"][2].update(terminationGracePeriodSeconds=86_401),
     "models[2].terminationGracePeriodSeconds: Input should be less than or equal to 86400"),
    # Whole seconds, as the Deployment's field: neither a fraction nor a bool.
    (lambda d: d["models"][0].update(terminationGracePeriodSeconds=1.5),
     "models[0].terminationGracePeriodSeconds: Input should be a valid integer"),
    (lambda d: d["models"][0].update(terminationGracePeriodSeconds=True),
     "models[0].terminationGracePeriodSeconds: Input should be a valid integer"),
])
def test_a_bad_fleet_file_names_the_file_and_the_field(
    fleet_dir: Path, tmp_path: Path, change: object, expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = yaml.safe_load((fleet_dir / "fleet.yaml").read_text())
    change(document)  # type: ignore[operator]
    for name in ("pool.yaml", "budgets.yaml", "models.yaml", "a.csv", "b.csv", "batch.csv"):
        (tmp_path / name).write_text((fleet_dir / name).read_text())
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(fleet.FleetError) as caught:
        fleet.load_fleet(path)
    assert str(path) in str(caught.value) and expected in str(caught.value)
    assert cli.main(["simulate", "--fleet", str(path)]) == 2
    assert expected in capsys.readouterr().err


def test_a_policy_on_no_pool_of_the_fleet_is_named(fleet_dir: Path, tmp_path: Path) -> None:
    for name in ("pool.yaml", "budgets.yaml", "fleet.yaml", "a.csv", "b.csv", "batch.csv"):
        (tmp_path / name).write_text((fleet_dir / name).read_text())
    policies = list(yaml.safe_load_all((fleet_dir / "models.yaml").read_text()))
    policies[1]["spec"]["nodePool"]["name"] = "elsewhere"
    (tmp_path / "models.yaml").write_text(yaml.safe_dump_all(policies))
    with pytest.raises(fleet.FleetError, match=r"models\[1\]\.policy: policy fleet/chat-b "
                       r"spec.nodePool.name 'elsewhere' is not a pool of the fleet"):
        fleet.load_fleet(tmp_path / "fleet.yaml")


def test_servegen_clients_and_azure_functions_split_a_multi_client_trace(tmp_path: Path
                                                                         ) -> None:
    folder = BUNDLED / "servegen_m_large_sample"
    one = fleet.load_source(fleet.TraceSource(path=str(folder), clients=("chunk-0",),
                                              duration=3600.0),
                            base=Path("/"), seed=0, where="f.yaml: models[0].trace")
    both = fleet.load_source(fleet.TraceSource(path=str(folder),
                                               clients=("chunk-0", "chunk-3"),
                                               duration=3600.0),
                             base=Path("/"), seed=0, where="f.yaml: models[0].trace")
    assert 0 < one.requests < both.requests
    assert np.all(np.diff(both.arrival_s) >= 0) and both.arrival_s[-1] < 3600.0
    with pytest.raises(fleet.FleetError, match=r"clients\[0\]: 'chunk-99' is not a client"):
        fleet.load_source(fleet.TraceSource(path=str(folder), clients=("chunk-99",)),
                          base=Path("/"), seed=0, where="f.yaml: models[0].trace")
    functions = tmp_path / "inv.csv"
    functions.write_text("HashFunction,HashApp,HashOwner,minute_1,minute_2,minute_3\n"
                         "aaaaaaaa11,x,y,14,0,3\nbbbbbbbb22,x,y,1,1,1\n")
    trace = fleet.load_source(
        fleet.TraceSource(path="inv.csv", format="azure-functions", functions=("aaaaaaaa",),
                          lengths=str(BUNDLED / "sharegpt_8k_lengths_sample.csv")),
        base=tmp_path, seed=0, where="f.yaml: models[0].trace")
    assert trace.requests == 17
    assert int(np.sum(trace.arrival_s < 60.0)) == 14 and trace.arrival_s.max() < 180.0
    with pytest.raises(fleet.FleetError, match="no function 'cccccccc'"):
        fleet.load_source(fleet.TraceSource(path="inv.csv", format="azure-functions",
                                            functions=("cccccccc",)),
                          base=tmp_path, seed=0, where="f.yaml: models[0].trace")
