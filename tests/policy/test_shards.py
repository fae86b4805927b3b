"""Sharding: arbitration domains from the files, and rendezvous hashing of them to shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaler import cli
from scaler.policy import fleet, loader, shards

from .test_fleet_files import CONFIG, budget_text, policy_text, pool_text


def load(tmp_path: Path, text: str) -> tuple[list[loader.LoadedPolicy], fleet.Fleet]:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    result = loader.load_paths([path])
    assert not result.errors, result.errors
    return list(result.loaded), fleet.fleet_of(result)


def test_models_sharing_a_pool_or_a_budget_are_one_domain(tmp_path: Path) -> None:
    # The module docstring's example: m1, m2 on a; m3 on b; m4 on no pool; a budget of
    # tenant t over every pool covers m2 and m3, so it joins a and b.
    loaded, pools = load(tmp_path, "---\n".join([
        pool_text("a"), pool_text("b"),
        budget_text("t-all", spec="tenant: t\n  guaranteedGpus: 0\n  maxGpus: 8"),
        policy_text("m1", labels="{tenant: u}", node_pool="{name: a, gpusPerNode: 8}"),
        policy_text("m2", labels="{tenant: t}", node_pool="{name: a, gpusPerNode: 8}"),
        policy_text("m3", labels="{tenant: t}", node_pool="{name: b, gpusPerNode: 8}"),
        policy_text("m4", labels="{tenant: u}", node_pool="null")]))
    named = shards.domains([item.policy for item in loaded], pools)
    assert named == {"pool:a": "pool:a", "pool:b": "pool:a", "budget:t-all": "pool:a",
                     "model:ns/m1": "pool:a", "model:ns/m2": "pool:a",
                     "model:ns/m3": "pool:a", "model:ns/m4": "model:ns/m4"}


def test_a_budget_on_one_pool_does_not_join_pools(tmp_path: Path) -> None:
    loaded, pools = load(tmp_path, "---\n".join([
        pool_text("a"), pool_text("b"),
        budget_text("t-a", spec="tenant: t\n  pool: a\n  guaranteedGpus: 0\n  maxGpus: 8"),
        policy_text("m2", labels="{tenant: t}", node_pool="{name: a, gpusPerNode: 8}"),
        policy_text("m3", labels="{tenant: t}", node_pool="{name: b, gpusPerNode: 8}")]))
    named = shards.domains([item.policy for item in loaded], pools)
    assert named["model:ns/m2"] == named["budget:t-a"] == "pool:a"
    assert named["model:ns/m3"] == "pool:b"


def test_every_model_of_the_shipped_fleet_is_in_exactly_one_share() -> None:
    result = loader.load_paths([CONFIG])
    policies = [item.policy for item in result.loaded]
    pools = fleet.fleet_of(result)
    split = shards.split(policies, pools, shards=3)
    assert sorted(key for part in split for key in part.models) == sorted(
        policy.key for policy in policies)
    for part in split:  # a shard owns a model's pool exactly when it owns the model
        for policy in policies:
            pool = policy.spec.node_pool
            if pool is not None and pool.name in pools.pools:
                assert (policy.key in part.models) == (pool.name in part.pools)
    assert shards.split(policies, pools, shards=1)[0].models == {
        policy.key for policy in policies}


def test_one_more_shard_moves_only_what_the_new_shard_takes() -> None:
    domains = [f"pool:p{index}" for index in range(2000)]
    for count in (1, 2, 5, 8):
        before = {d: shards.owner(d, shards=count) for d in domains}
        after = {d: shards.owner(d, shards=count + 1) for d in domains}
        moved = [d for d in domains if before[d] != after[d]]
        assert all(after[d] == count for d in moved)  # only to the new shard
        # About 1 / (count + 1) of the domains move: within 30 % of that share.
        assert abs(len(moved) / len(domains) - 1 / (count + 1)) < 0.3 / (count + 1)


def test_the_owner_does_not_depend_on_the_process() -> None:
    # Python's str hash is salted per process; the owner must be the same everywhere.
    domains = [f"model:ns/m{index}" for index in range(50)]
    here = [shards.owner(d, shards=7) for d in domains]
    code = ("from scaler.policy import shards; print([shards.owner(f'model:ns/m{i}', "
            "shards=7) for i in range(50)])")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={"PYTHONHASHSEED": seed, "PATH": ""},
                             cwd=Path(__file__).resolve().parents[2])
        assert out.stdout.strip() == str(here)


@pytest.mark.parametrize(("shard", "count"), [(2, 2), (-1, 3), (0, 0)])
def test_a_shard_outside_the_count_is_refused(shard: int, count: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        shards.Assignment(shard=shard, shards=count)


def test_validate_says_what_each_shard_would_do(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["validate", str(CONFIG), "--json", "--shards", "2",
                     "--max-domain-models", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    sharding = report["sharding"]
    keys = sorted(item["policy"] for item in report["valid"])
    assert sorted(k for part in sharding["by_shard"] for k in part["models"]) == keys
    # The shipped fleet's largest domain (two models on h100-pool) is split over 1 model:
    # whichever shard does not arbitrate it sends its model's asks to the one that does.
    largest = sharding["domains"][0]
    assert (largest["domain"], largest["models"], largest["split"]) == (
        "pool:h100-pool", 2, True)
    elsewhere = {k: v for part in sharding["by_shard"]
                 for k, v in part["arbitrated_elsewhere"].items()}
    here = {k for part in sharding["by_shard"] for k in part["arbitrated_here_for_others"]}
    assert set(elsewhere) == here and set(elsewhere.values()) <= {largest["arbiter"]}
    assert cli.main(["validate", str(CONFIG), "--shards", "0"]) == 2
