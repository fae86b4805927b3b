"""Which load each policy replays: the default halved to what its max can carry, a warning
when the user's load exceeds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaler.demo import scenario
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.sim import profiles, strategies, traces

REPO = Path(__file__).resolve().parents[2]
PROFILE = profiles.load_profile("llama-3.1-8b-h100")


def policy_with_max(maximum: int) -> policy_model.ScalePolicy:
    result = loader.load_paths([REPO / "config" / "llama-8b.yaml"])
    policy = result.policies[0]
    spec = policy.spec.model_copy(update={
        "replicas": policy.spec.replicas.model_copy(update={"min": 1, "max": maximum}),
        "warm_floor": policy.spec.warm_floor.model_copy(update={"replicas": 0,
                                                                "schedules": []})})
    return policy.model_copy(update={"spec": spec})


@pytest.fixture
def steady(tmp_path: Path) -> Path:
    """10 requests/s for 600 s of 1,000 prompt and 200 output tokens."""
    path = tmp_path / "steady.csv"
    rows = [f"{i / 10:.1f},1000,200" for i in range(6000)]
    path.write_text("timestamp_s,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def need_at(path: Path, rate: float) -> int:
    trace = traces.load_trace(path, rate_scale=rate)
    return int(strategies.oracle.oracle_need(trace, PROFILE).max())


def test_default_load_is_halved_until_the_max_carries_it(steady: Path) -> None:
    # The limit sits between what x2 and x4 need: the default x8 is halved twice.
    limit = need_at(steady, 2.0)
    assert need_at(steady, 4.0) > limit
    load = scenario.load_for(scenario.DemoOptions(trace=steady, duration_s=600.0),
                             policy=policy_with_max(limit), profile=PROFILE)
    assert load.trace.rate_scale == 2.0
    assert load.peak_need == limit
    assert load.warning is not None and "replaying at rate x2" in load.warning


def test_a_load_the_max_cannot_carry_is_a_warning(steady: Path) -> None:
    limit = need_at(steady, 2.0)
    options = scenario.DemoOptions(trace=steady, duration_s=600.0, rate_scale=8.0)
    load = scenario.load_for(options, policy=policy_with_max(limit), profile=PROFILE)
    assert load.trace.rate_scale == 8.0  # the user's load stands
    assert load.peak_need > limit
    assert load.warning is not None
    assert f"needs {load.peak_need} replicas at peak, more than the {limit}" in load.warning


def test_a_load_within_the_max_has_no_warning(steady: Path) -> None:
    load = scenario.load_for(scenario.DemoOptions(trace=steady, duration_s=600.0),
                             policy=policy_with_max(32), profile=PROFILE)
    assert load.trace.rate_scale == 8.0 and load.warning is None


def test_the_budget_and_the_pool_limit_replicas_too() -> None:
    policy = policy_with_max(32)
    spec = policy.spec
    assert spec.node_pool is not None
    small_pool = spec.model_copy(update={"node_pool": spec.node_pool.model_copy(
        update={"max_nodes": 2, "gpus_per_node": 8})})
    assert scenario.replica_limit(policy.model_copy(update={"spec": small_pool})) == 16
