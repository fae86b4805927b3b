"""bench/fleet_scale.py --shards: the shares partition the fleet, and each is measured."""

from __future__ import annotations

import gc
import importlib.util
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from scaler.policy import shards

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet_scale.py"


@pytest.fixture(scope="module")
def fleet_scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fleet_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    """The bench tunes the collector as `scaler run` does: put it back."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    if tracemalloc.is_tracing():
        tracemalloc.stop()


def test_pool_budgets_split_by_pool(fleet_scale: ModuleType) -> None:
    workload = fleet_scale.Workload(40, 10, 20, "pool")
    policies, fleet = workload.whole()
    assert all(b.spec.pool is not None for b in fleet.budgets.values())
    shares = shards.split(policies, fleet, shards=3)
    keys = [p.key for p in policies]
    # Every model in exactly one shard; pools and budgets too.
    assert sorted(k for s in shares for k in s.models) == sorted(keys)
    assert sorted(n for s in shares for n in s.pools) == sorted(fleet.pools)
    assert sorted(n for s in shares for n in s.budgets) == sorted(fleet.budgets)
    for share in shares:
        part, part_fleet = fleet_scale.of_share(policies, fleet, share)
        assert {p.key for p in part} == share.models
        assert {p.spec.node_pool.name for p in part} <= set(part_fleet.pools)

    result = fleet_scale.sharded(workload, shards=3, cycles=2)

    assert result["domains"] == 10  # the pools
    assert result["largest_domain_models"] == 4
    assert result["shard_models"] == [len(s.models) for s in shares]
    assert sum(result["shard_models"]) == 40
    per_shard = result["per_shard"]
    assert [f["shard"] for f in per_shard] == [0, 1, 2]
    measured = [f for f in per_shard if f["models"]]
    assert measured
    for figures, share in zip(per_shard, shares, strict=True):
        assert figures["models"] == len(share.models)
        if share.models:
            assert figures["reactor_cycle_cpu_s"] >= 0
            assert figures["engine_cycle_cpu_s"] >= 0
            assert figures["reactor_evaluations_per_model"] >= 1
            assert figures["pools"] == len(share.pools)
        else:
            assert "reactor_cycle_cpu_s" not in figures
    assert result["max_over_shards"]["reactor_cycle_cpu_s"] == max(
        f["reactor_cycle_cpu_s"] for f in measured)


def test_one_domain_is_not_split(fleet_scale: ModuleType) -> None:
    """Budgets over every pool and tenants on every pool (21 tenants, 10 pools): one
    domain, so one shard gets every model."""
    workload = fleet_scale.Workload(42, 10, 21)
    policies, fleet = workload.whole()
    shares = shards.split(policies, fleet, shards=3)
    assert sorted(len(s.models) for s in shares) == [0, 0, 42]


def test_one_domain_split_by_model_is_arbitrated_by_its_shard(fleet_scale: ModuleType
                                                               ) -> None:
    """The same single domain over 10 models a domain: the other shards evaluate the
    models, the domain's shard arbitrates all their asks (`Part.foreign`) and evaluates
    none, and is measured for that."""
    workload = fleet_scale.Workload(42, 10, 21)
    result = fleet_scale.sharded(workload, shards=3, cycles=2, max_domain_models=10)
    assert result["domains"] == 1 and sum(result["shard_models"]) == 42
    arbiter = next(f for f in result["per_shard"] if f["pools"])
    others = [f for f in result["per_shard"] if f is not arbiter]
    assert (arbiter["models"], arbiter["foreign"]) == (0, 42)
    assert all(f["models"] > 0 and f["remote"] == f["models"] for f in others)
    assert arbiter["reactor_cycle_cpu_s"] >= 0 and arbiter["engine_per_model_us"] is None
    # Every other shard's model of the domain was granted there.
    assert arbiter["foreign_granted"] == arbiter["foreign"]
