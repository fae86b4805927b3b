"""Scale-down in the simulator as Kubernetes does it: which replica goes (the ReplicaSet's
order, the idlest first with deletion costs), what is cut at the end of the grace period,
and the batch tier's busy floor reaching the engine (issue 16, item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from scaler import cli
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, run, strategies, traces
from scaler.sim.strategies import scaler as scaler_strategy

from .conftest import REPO

# At batch 1 the 8B profile decodes a token in 8.1 ms: 10,000 tokens take ~81 s, past a
# 30 s grace period; 50 tokens take 0.4 s.
LONG, SHORT = 10_000, 50
EPOCH = 1_700_000_000.0


def _trace(outputs: list[int], *, prompt: int = 100) -> traces.Trace:
    """Requests all arriving at t=0 (least-loaded routing gives request i to replica i)."""
    n = len(outputs)
    return traces.Trace("hand-built", np.zeros(n), np.full(n, prompt, dtype=np.int64),
                        np.asarray(outputs, dtype=np.int64))


def _cluster(trace: traces.Trace, profile: profiles.ReplicaProfile, *, replicas: int,
             grace_s: float = sim_cluster.TERMINATION_GRACE_S) -> sim_cluster.SimCluster:
    pool = sim_cluster.PoolConfig(gpus_per_node=8, node_boot_s=0.0)
    return sim_cluster.SimCluster(trace=trace, profile=profile, pool=pool,
                                  initial_replicas=replicas, grace_s=grace_s)


def _run(sim: sim_cluster.SimCluster, *, start: float, until: float,
         strategy: scaler_strategy.ScalerStrategy | None = None) -> float:
    """Step the cluster over [start, until); the strategy's replicas report as they go."""
    now = start
    while now < until - 1e-9 and sim.step < sim.steps:
        sim.advance(now)
        if strategy is not None:
            strategy.snapshot(sim, now=now)
        sim.run_step(now)
        now = sim.time_of_step(sim.step)
    return now


def _policy(policy: policy_model.ScalePolicy, *, tier: str) -> policy_model.ScalePolicy:
    """The 8B policy with scale-downs at once (no window, no rate limit), no warm floor
    and no node pool, in `tier`."""
    document: dict[str, Any] = yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text())
    spec = document["spec"]
    spec.update(tier=tier, warmFloor={"replicas": 0})
    spec["behavior"] = {"scaleDown": {"stabilizationSeconds": 0, "policies": []}}
    spec.pop("nodePool")
    assert policy.name == document["metadata"]["name"]
    return policy_model.ScalePolicy.model_validate(document)


def _gone(sim: sim_cluster.SimCluster) -> list[int]:
    return [p.slot for p in sim.pods if p.phase in ("draining", "gone")]


def test_the_idlest_replica_goes_first_with_deletion_costs_and_another_without(
    profile_8b: profiles.ReplicaProfile, policy_8b: policy_model.ScalePolicy,
) -> None:
    # Replicas 0 and 1 each run a long generation, replica 2 finished its short one. The
    # strategy is the one `scaler simulate` builds (the registry; --no-deletion-cost is
    # Context.deletion_cost False).
    trace = _trace([LONG, LONG, SHORT])
    outcomes = {}
    for costs in (True, False):
        sim = _cluster(trace, profile_8b, replicas=3)
        strategy = strategies.make("scaler", run.context_for(
            policy=policy_8b, profile=profile_8b, trace=trace, pool=sim.pool,
            deletion_cost=costs))
        assert isinstance(strategy, scaler_strategy.ScalerStrategy)
        now = _run(sim, start=0.0, until=5.0, strategy=strategy)
        strategy.annotate(sim, desired=2, now=now)
        sim.scale_to(2, now=now)
        outcomes[costs] = _gone(sim)
        # With costs the reports reached the pods' annotations (in flight + waiting);
        # without, none is written and every pod keeps Kubernetes' 0.
        assert [p.deletion_cost for p in sim.pods] == ([1, 1, 0] if costs else [0, 0, 0])
    assert outcomes[True] == [2]
    # Without costs every pod ranks the same up to readiness; the ReplicaSet takes the
    # most recently ready, then the newest, and these tie: the first listed, replica 0.
    assert outcomes[False] == [0]


def test_the_removal_order_ranks_unscheduled_then_not_ready_then_cost(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    sim = _cluster(_trace([SHORT]), profile_8b, replicas=2)
    for pod, cost in zip(sim.pods, (5, 3), strict=True):
        pod.deletion_cost = cost
    sim.scale_to(4, now=0.0)  # two more pods, both starting on the booted node
    sim.pods[3].scheduled_at = 60.0  # as if bound to a node that boots at t=60
    assert [p.slot for p in sim.removal_order(now=0.0)] == [3, 2, 1, 0]


def test_interrupted_requests_are_counted_and_judged_misses(
    profile_8b: profiles.ReplicaProfile, policy_8b: policy_model.ScalePolicy,
) -> None:
    # Replica 0 (the first the ReplicaSet takes here) holds a 10,000-token answer when
    # it is removed at t=5; 30 s later it is killed and the answer is cut.
    trace = _trace([LONG, SHORT, SHORT])
    metric, threshold = run.slo_of(policy_8b)
    sim = _cluster(trace, profile_8b, replicas=3)
    now = _run(sim, start=0.0, until=5.0)
    sim.scale_to(2, now=now)
    assert _gone(sim) == [0] and sim.pods[0].phase == "draining"
    now = _run(sim, start=now, until=34.0)
    assert sim.interrupted_count == 0  # within the grace period it still serves
    _run(sim, start=now, until=36.0)
    assert sim.pods[0].phase == "gone" and sim.pods[0].gone_at == pytest.approx(35.0)
    assert sim.interrupted.tolist() == [True, False, False]
    summary = run.summarize(sim, policy=policy_8b, metric=metric, threshold=threshold)
    assert (summary["interrupted_requests"], summary["unfinished"], summary["completed"]) == (
        1, 1, 2)
    # Its first token came at once, yet a cut answer is no answer: a miss.
    assert np.isfinite(sim.first_token[0])
    assert summary["slo_attainment"] == pytest.approx(2 / 3, abs=1e-6)
    assert sim.drained  # nothing left to wait for: the run may end


def test_a_grace_period_long_enough_drains_and_zero_cuts_queued_work_too(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    drained = _cluster(_trace([LONG]), profile_8b, replicas=1, grace_s=600.0)
    now = _run(drained, start=0.0, until=5.0)
    drained.scale_to(0, now=now)
    _run(drained, start=now, until=120.0)
    assert drained.interrupted_count == 0 and drained.completed == 1
    # A 30,000-token prompt fills the step's prefill (2,500 tokens): the second request
    # waits in the replica's queue, and an abort at SIGTERM (grace 0) loses both.
    cut = _cluster(_trace([LONG, SHORT], prompt=30_000), profile_8b, replicas=1, grace_s=0.0)
    now = _run(cut, start=0.0, until=0.2)
    assert len(cut.queues[0]) == 1 and cut.running[0] == 1
    cut.scale_to(0, now=now)
    assert cut.interrupted_count == 2 and cut.pods[0].phase == "gone"


@pytest.mark.parametrize(("tier", "kept"), [("batch", 2), ("online", 1)])
def test_a_batch_replica_with_work_is_kept_an_online_one_is_not(
    profile_8b: profiles.ReplicaProfile, policy_8b: policy_model.ScalePolicy,
    tier: str, kept: int,
) -> None:
    # Demand for one replica (2 running, 96 per replica), two replicas report work: the
    # batch tier keeps both (UNFINISHED_WORK), and the idle third is the one that goes.
    policy = _policy(policy_8b, tier=tier)
    sim = _cluster(_trace([LONG, LONG, SHORT]), profile_8b, replicas=3)
    strategy = scaler_strategy.ScalerStrategy(policy, start_epoch_s=EPOCH)
    # The replicas report for 3 s before the first evaluation (the service's store holds
    # their reports when a decision comes; the requests arrive at t=0).
    now = _run(sim, start=0.0, until=3.0, strategy=strategy)
    while now < 40.0:
        sim.scale_to(strategy.decide(sim, now=now), now=now)
        now = _run(sim, start=now, until=now + strategy.period_s, strategy=strategy)
    state = strategy.cluster_state(sim, now=now)
    assert state.busy_replicas == (2 if tier == "batch" else None)
    assert sim.spec_replicas == kept
    assert sim.pods[2].phase == "gone"
    if tier == "batch":
        assert [p.phase for p in sim.pods[:2]] == ["ready", "ready"]
        assert sim.interrupted_count == 0
    else:  # removed at t=3, killed at t=33 with its answer a third done
        assert [p.phase for p in sim.pods[:2]] == ["gone", "ready"]
        assert sim.interrupted.tolist() == [True, False, False]


# ----- the grace period and deletion costs, end to end ------------------------------------

# Three replicas carry 60 req/s of 300-token answers for 150 s (the first minute needs all
# three, policy max 3); 15 s after the load ends, with every replica idle, two answers of
# 20,000 tokens (162 s each at batch 1) go to the first two replicas (least-loaded, ties
# by order). 60 s after the load ended the engine scales down to one replica, each long
# answer then ~40 s in, ~120 s short of its end.
STEADY_S, STEADY_RATE, LONG_AT, LATE_LONG = 150.0, 60.0, 165.0, 20_000


def _steady_then_two_long(folder: Path) -> tuple[Path, Path]:
    """The trace above as a CSV and an online 8B policy whose scale-down waits 60 s (no
    rate limit, no warm floor, no node pool), 1 to 3 replicas."""
    rng = np.random.default_rng(0)
    steady = np.sort(rng.uniform(0.0, STEADY_S, int(STEADY_RATE * STEADY_S)))
    rows = [f"{t:.3f},100,300" for t in steady] + [f"{LONG_AT},100,{LATE_LONG}"] * 2
    trace = folder / "trace.csv"
    trace.write_text("timestamp_s,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    document: dict[str, Any] = yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text())
    spec = document["spec"]
    spec.update(tier="online", warmFloor={"replicas": 0}, replicas={"min": 1, "max": 3},
                behavior={"scaleDown": {"stabilizationSeconds": 60, "policies": []}})
    spec.pop("nodePool")
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    return trace, policy


def test_simulate_flags_set_the_grace_period_and_turn_deletion_costs_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    trace, policy = _steady_then_two_long(tmp_path)

    def cut(*flags: str) -> int:
        out = tmp_path / "out.json"
        assert cli.main(["simulate", "--trace", str(trace), "--policy", str(policy),
                         "--strategies", "scaler", "--json", str(out), *flags]) == 0
        summary = json.loads(out.read_text())["strategies"]["scaler"]
        assert summary["scale_events"] >= 1  # it did scale down
        return int(summary["interrupted_requests"])

    # With costs the idle third replica goes first and one long answer is cut 30 s after
    # its replica's removal; without, the ReplicaSet's own order (the most recently
    # ready, then the newest: here the first listed) removes both replicas holding one.
    assert cut() == 1
    assert cut("--no-deletion-cost") == 2
    # 600 s is longer than what is left of either answer: removed replicas drain them.
    assert cut("--termination-grace-period", "600") == 0
    capsys.readouterr()
    for bad in ("-1", str(sim_cluster.MAX_GRACE_S + 1)):
        assert cli.main(["simulate", "--trace", str(trace), "--policy", str(policy),
                         "--termination-grace-period", bad]) == 2
        assert f"--termination-grace-period must be 0 to 86400 seconds, not {bad}" in (
            capsys.readouterr().err)


def test_the_fleet_file_sets_each_models_grace_period_and_the_flag_turns_costs_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # The scenario above as a one-model fleet on an 8-GPU pool: with its defaults the
    # replay cuts what `scaler simulate` cuts (1 with costs), so each figure below shows
    # its setting at work.
    trace, policy = _steady_then_two_long(tmp_path)
    document = yaml.safe_load(policy.read_text())
    document["spec"]["nodePool"] = {"name": "gpus", "gpusPerNode": 8, "maxNodes": 1,
                                    "actuator": "none"}
    policy.write_text(yaml.safe_dump(document))
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({
        "apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "gpus"},
        "spec": {"gpusPerNode": 8, "maxNodes": 1, "gpuHourly": 2.5}}))
    path, out = tmp_path / "fleet.yaml", tmp_path / "out.json"

    def cut(grace: int | None, *flags: str) -> int:
        entry: dict[str, Any] = {"policy": policy.name, "trace": {"path": trace.name}}
        if grace is not None:
            entry["terminationGracePeriodSeconds"] = grace
        path.write_text(yaml.safe_dump({"pools": ["pool.yaml"], "models": [entry]}))
        assert cli.main(["simulate", "--fleet", str(path), "--strategies", "scaler",
                         "--json", str(out), *flags]) == 0
        return int(json.loads(out.read_text())["strategies"]["scaler"]["fleet"][
            "interrupted_requests"])

    assert cut(None, "--no-deletion-cost") == 2
    assert cut(600) == 0
    capsys.readouterr()
    assert cli.main(["simulate", "--fleet", str(path),
                     "--termination-grace-period", "600"]) == 2
    assert "--termination-grace-period go in the fleet file" in capsys.readouterr().err
