"""Dispatch modes of the simulated cluster: push (each request queued at one replica) and
queue (a shared work queue the replicas pull from, as JetStream feeds batch inference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import yaml

from scaler import cli
from scaler.core import vocabulary
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed as sim_feed
from scaler.sim import fleet, profiles, traces
from scaler.sim.strategies import scaler as scaler_strategy

from .conftest import REPO
from .test_fleet_variants import H100, L40S, _fleet

# 8B profile: a batch of 256 decodes a token in 8 + 25.6 = 33.6 ms, so a 1,000-token
# answer takes ~34 s, past a 10 s grace period: whatever a removed replica started is cut.
ANSWER = 1_000
GRACE_S = 10.0


def _burst(count: int, *, outputs: npt.ArrayLike = ANSWER, prompt: int = 100) -> traces.Trace:
    """`count` requests arriving at t=0 in index order."""
    return traces.Trace("hand-built", np.zeros(count), np.full(count, prompt, dtype=np.int64),
                        np.broadcast_to(np.asarray(outputs, dtype=np.int64), (count,)).copy())


def _cluster(trace: traces.Trace, profile: profiles.ReplicaProfile, *, replicas: int,
             dispatch: sim_cluster.Dispatch) -> sim_cluster.SimCluster:
    pool = sim_cluster.PoolConfig(gpus_per_node=8, node_boot_s=0.0)
    return sim_cluster.SimCluster(trace=trace, profile=profile, pool=pool,
                                  initial_replicas=replicas, grace_s=GRACE_S,
                                  dispatch=dispatch)


def _step(sim: sim_cluster.SimCluster, *, until: float) -> float:
    now = sim.time_of_step(sim.step)
    while now < until - 1e-9 and sim.step < sim.steps and not (
            now > sim.trace.duration_s and sim.drained):
        sim.advance(now)
        sim.run_step(now)
        now = sim.time_of_step(sim.step)
    return now


def _remove_one_at(sim: sim_cluster.SimCluster, *, at: float) -> tuple[int, set[int]]:
    """Run to `at`, scale 2 -> 1; the removed slot and the requests it had admitted."""
    now = _step(sim, until=at)
    sim.scale_to(1, now=now)
    (gone,) = [p.slot for p in sim.pods if p.phase == "draining"]
    admitted = {int(r) for r in sim.active if sim.replica[r] == gone}
    return gone, admitted


def test_queue_dispatch_cuts_only_what_the_removed_replica_had_started(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # 1,000 answers on 2 replicas, one removed at t=3 s and killed 10 s later. Each
    # replica admits 25 prompts of 100 tokens a 0.1 s step (one step of prefill is 2,500
    # tokens), so by t=3 s each runs a full batch of 256.
    trace = _burst(1_000)
    outcome = {}
    for dispatch in sim_cluster.DISPATCH_MODES:
        sim = _cluster(trace, profile_8b, replicas=2, dispatch=dispatch)
        gone, admitted = _remove_one_at(sim, at=3.0)
        assert len(admitted) == 256
        _step(sim, until=1_000.0)
        assert sim.drained
        cut = set(np.flatnonzero(sim.interrupted).tolist())
        outcome[dispatch] = (cut, admitted, sim)
    cut, admitted, sim = outcome["queue"]
    # Only what it had started is cut; the rest of the queue, 488 requests, is served by
    # the replica that stays.
    assert cut == admitted and sim.interrupted_count == 256
    served = ~sim.interrupted
    assert np.isfinite(sim.done[served]).all() and sim.completed == 1_000 - 256
    kept = next(p.slot for p in sim.pods if p.phase == "ready")
    assert (sim.replica[served] == kept).sum() == 744
    # Push: least-loaded routing queued 500 at each replica at t=0; the removed one is cut
    # with its whole queue, 244 requests that never started.
    push_cut, push_admitted, push_sim = outcome["push"]
    never_started = sorted(push_cut - push_admitted)
    assert push_cut >= push_admitted and len(push_cut) == 500 and len(never_started) == 244
    assert np.isnan(push_sim.first_token[never_started]).all()


def test_the_shared_queue_is_fifo_and_a_head_that_fits_nowhere_waits(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # 600 answers on 2 replicas: they are taken in arrival order, whoever takes them.
    sim = _cluster(_burst(600), profile_8b, replicas=2, dispatch="queue")
    order: list[int] = []
    while not sim.drained:
        taken = set(np.flatnonzero(sim.replica >= 0).tolist())
        _step(sim, until=sim.time_of_step(sim.step) + sim.dt)
        order.extend(sorted(set(np.flatnonzero(sim.replica >= 0).tolist()) - taken))
    assert order == list(range(600))
    # Head-of-line: one replica (KV cache 400,000 tokens), four prompts of 120,000 with
    # answers of 10,000 (130,000 KV tokens each, within maxModelLen 131,072), then a small
    # one. Each long prompt takes ~5 s to prefill (no other prompt is admitted meanwhile:
    # one step of prefill is 2,500 tokens); at t=20 s three hold 390,000 tokens, the fourth
    # needs 130,000 more and waits, and the small fifth (110 tokens), which would fit,
    # waits behind it until the first long answer ends (~80 s at ~8 ms a token).
    inputs = np.asarray([120_000] * 4 + [100])
    answers = np.asarray([10_000] * 4 + [10])
    sim = _cluster(traces.Trace("hand-built", np.zeros(5), inputs, answers), profile_8b,
                   replicas=1, dispatch="queue")
    _step(sim, until=20.0)
    assert (sim.replica[:3] >= 0).all() and list(sim.gateway) == [3, 4]
    _step(sim, until=3_000.0)
    assert sim.drained and sim.first_token[4] > sim.first_token[3] > sim.done[0]


def test_equal_replicas_share_the_queue_and_a_draining_one_takes_nothing(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # 600 answers on 2 replicas. Pulling, each admits what it would admit from its own
    # queue (the same rules: ~25 prompts of 100 tokens a 0.1 s step, one step of prefill
    # being 2,500 tokens), the two in turn.
    sims = {d: _cluster(_burst(600), profile_8b, replicas=2, dispatch=d)
            for d in sim_cluster.DISPATCH_MODES}
    for each in sims.values():
        _step(each, until=0.5)
    sim = sims["queue"]
    assert sim.running == sims["push"].running and sim.running[0] == sim.running[1] > 100
    assert not any(sim.queues) and len(sim.gateway) == 600 - 2 * sim.running[0]
    gone, admitted = _remove_one_at(sim, at=0.5)
    kept = 1 - gone
    before = sim.running[kept]
    _step(sim, until=1.5)
    # The draining replica took nothing more; the other filled its batch.
    assert {int(r) for r in np.flatnonzero(sim.replica == gone)} == admitted
    assert sim.running[gone] == len(admitted) and sim.running[kept] == 256 > before


def test_the_feed_reports_the_shared_queue_as_the_models_and_no_replicas_work(
    profile_8b: profiles.ReplicaProfile, policy_8b: policy_model.ScalePolicy,
) -> None:
    # 600 answers on 2 replicas: after 1 s each runs ~240 (about 25 prompts a step) and
    # the rest waits in the shared queue.
    sim = _cluster(_burst(600), profile_8b, replicas=2, dispatch="queue")
    now = _step(sim, until=1.0)
    strategy = scaler_strategy.ScalerStrategy(policy_8b.model_copy(update={
        "spec": policy_8b.spec.model_copy(update={"tier": vocabulary.Tier.BATCH})}))
    samples = strategy.feed.measure(sim, now=now)
    depth = {s.source: s.value for s in samples if s.signal is vocabulary.Signal.QUEUE_DEPTH}
    running = {s.source: s.value for s in samples if s.signal is vocabulary.Signal.IN_FLIGHT}
    waiting = len(sim.gateway)
    assert waiting > 0 and sim.history.waiting[sim.step - 1] == waiting
    assert depth == {"pod-0": 0.0, "pod-1": 0.0, sim_feed.WORK_QUEUE_SOURCE: waiting}
    assert running == {"pod-0": sim.running[0], "pod-1": sim.running[1]}
    # Delivered to the store, the queue is in the model's queue depth, but the busy
    # replicas (the batch floor) are the two pods: the queue is lost with no removal.
    later = now + strategy.report_delay_s
    strategy.snapshot(sim, now=now)
    snapshot = strategy.snapshot(sim, now=later)
    assert snapshot.queue_depth is not None and snapshot.queue_depth.value == waiting
    # ...known to be shared, as the service's JetStream source's is: new replicas drain it.
    assert snapshot.shared_waiting is not None and snapshot.shared_waiting.value == waiting
    assert set(strategy.work(now=later)) == {"pod-0", "pod-1"}
    assert strategy.cluster_state(sim, now=later).busy_replicas == 2


def _one_model_fleet(folder: Path, **entry: Any) -> Path:
    policy: dict[str, Any] = yaml.safe_load((REPO / "config" / "llama-8b.yaml").read_text())
    policy["spec"]["nodePool"] = {"name": "gpus", "gpusPerNode": 8, "maxNodes": 1,
                                  "actuator": "none"}
    (folder / "policy.yaml").write_text(yaml.safe_dump(policy))
    (folder / "pool.yaml").write_text(yaml.safe_dump({
        "apiVersion": "scaler.io/v1alpha1", "kind": "GpuPool", "metadata": {"name": "gpus"},
        "spec": {"gpusPerNode": 8, "maxNodes": 1, "gpuHourly": 2.5}}))
    (folder / "trace.csv").write_text("timestamp_s,input_tokens,output_tokens\n"
                                      "0.0,100,50\n1.0,100,50\n")
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump({"pools": ["pool.yaml"], "models": [
        {"policy": "policy.yaml", "trace": {"path": "trace.csv"}, **entry}]}))
    return path


def test_the_fleet_file_sets_each_models_dispatch(tmp_path: Path) -> None:
    assert fleet.load_fleet(_one_model_fleet(tmp_path)).members[0].dispatch == "push"
    path = _one_model_fleet(tmp_path, dispatch="queue")
    assert fleet.load_fleet(path).members[0].dispatch == "queue"
    bundled = fleet.load_fleet(REPO / "loadtests" / "fleet" / "fleet.yaml")
    assert {m.key: m.dispatch for m in bundled.members} == {
        "inference/search-chat": "push", "inference/ads-code": "push",
        "batch/summaries": "queue"}


@pytest.mark.parametrize("value", ["pull", 1, None])
def test_a_bad_dispatch_names_the_file_and_the_field(
    tmp_path: Path, value: object, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _one_model_fleet(tmp_path, dispatch=value)
    with pytest.raises(fleet.FleetError) as caught:
        fleet.load_fleet(path)
    message = str(caught.value)
    assert f"{path}: models[0].dispatch" in message and "'push' or 'queue'" in message
    assert cli.main(["simulate", "--fleet", str(path)]) == 2
    assert "models[0].dispatch" in capsys.readouterr().err


def test_an_unknown_dispatch_is_refused_by_the_cluster(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    with pytest.raises(ValueError, match="dispatch must be one of push, queue, not 'pull'"):
        _cluster(_burst(1), profile_8b, replicas=1, dispatch="pull")  # type: ignore[arg-type]


def test_a_model_with_variants_pulls_from_one_queue_per_variant(tmp_path: Path) -> None:
    # The variants test's model (a step to 40 req/s on at most 2 H100 replicas, the rest on
    # L40S) fed from work queues: the router fills each variant's queue by its load, queue
    # included, and every request is answered once.
    path = _fleet(tmp_path, [H100, L40S])
    document = yaml.safe_load(path.read_text())
    document["models"][0]["dispatch"] = "queue"
    path.write_text(yaml.safe_dump(document))
    loaded = fleet.load_fleet(path)
    (member,) = loaded.members
    assert member.dispatch == "queue"
    result = fleet.replay(loaded, strategy="scaler")
    variants = result.fleet["by_variant"]
    summary = result.models[member.key].summary
    assert all(int(v["completed"]) > 0 for v in variants.values())
    assert sum(int(v["completed"]) for v in variants.values()) == summary["completed"]
    assert summary["completed"] == summary["requests"] - summary["rejected"]
    assert summary["interrupted_requests"] == 0
