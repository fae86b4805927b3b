"""`scaler simulate --dispatch push|queue`: every strategy's cluster and the oracle's
searches and replays use the chosen dispatch, the JSON says which, push is the default."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from scaler import cli
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, run, scoring, traces
from scaler.sim.strategies import oracle

from .conftest import REPO

POLICY = REPO / "config" / "llama-8b.yaml"


def _long_then_short() -> traces.Trace:
    """One 60,000-token prompt, then 19 of 100 tokens, all at t=0 (10-token answers).

    8B profile: the long prompt alone takes 60,000 x (8 ms / 8,192 + 1 / 25,000) = 2.46 s
    to prefill, and a replica admits nothing more while its backlog is over one step of
    prefill (2,500 tokens), so a short prompt behind it waits ~2.4 s, over the 2 s TTFT SLO.
    A window of 20 fails at 2 misses (`scoring.misses_failing`); the long one is always one.
    Push routes by count, so with n replicas about 19/n short ones queue behind the long
    one: only 20 replicas (one each) meet the window. Queue: the replica holding the long
    prompt takes nothing, the other takes all 19 at once (1,900 tokens): 2 replicas meet it.
    """
    inputs = np.asarray([60_000] + [100] * 19, dtype=np.int64)
    return traces.Trace("long-then-short", np.zeros(20), inputs, np.full(20, 10, dtype=np.int64))


def _write_csv(trace: traces.Trace, path: Path) -> Path:
    rows = "".join(f"{t},{i},{o}\n" for t, i, o in zip(
        trace.arrival_s.tolist(), trace.input_tokens.tolist(), trace.output_tokens.tolist(),
        strict=True))
    path.write_text("timestamp_s,input_tokens,output_tokens\n" + rows)
    return path


def test_the_oracles_window_search_replays_the_chosen_dispatch(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile,
) -> None:
    trace = _long_then_short()
    requests = np.arange(trace.requests)
    assert run.feasible(trace, profile=profile_8b, metric="ttft", threshold=2.0) == {0}
    needs = {}
    for dispatch in sim_cluster.DISPATCH_MODES:
        problem = run.oracle_problem(trace, policy=policy_8b, profile=profile_8b,
                                     dispatch=dispatch)
        assert problem.dispatch == dispatch
        needs[dispatch] = oracle.window_need(problem, requests=requests, start_s=0.0,
                                             guess=1)
    assert needs == {"push": 20, "queue": 2}


def test_the_cli_flag_reaches_the_oracle_and_the_json_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _write_csv(_long_then_short(), tmp_path / "trace.csv")
    documents = {}
    for flag in ([], ["--dispatch", "push"], ["--dispatch", "queue"]):
        out = tmp_path / f"out{len(documents)}.json"
        assert cli.main(["simulate", "--trace", str(path), "--policy", str(POLICY),
                         "--strategies", "oracle,static-peak,keda", "--json", str(out),
                         *flag]) == 0
        documents[" ".join(flag) or "default"] = json.loads(out.read_text())
        printed = capsys.readouterr().out
        assert f"dispatch {flag[1] if flag else 'push'}" in printed
    default, push, queue = documents.values()
    # Push is the default, byte for byte; the key says so.
    assert default == push and default["dispatch"] == "push" and queue["dispatch"] == "queue"
    # The oracle's plan was searched and replayed on each dispatch's cluster: the start
    # (every strategy's) and the peak are what that dispatch needs, and both meet the window.
    for document, peak in ((push, 20), (queue, 2)):
        planned = document["strategies"]["oracle"]
        assert planned["max_replicas"] == document["strategies"]["static-peak"]["max_replicas"]
        assert planned["max_replicas"] == peak
        assert planned["feasible_windows"] == 1 and planned["p95_windows_met"] == 1.0


@dataclass(slots=True)
class _TwoThenOne:
    """Two replicas until `at`, then one: a scale-down at a known time."""

    at: float
    period_s: float = 1.0
    name: str = "two-then-one"

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        return 2 if now < self.at else 1


def test_a_replica_removed_from_a_work_queue_held_only_what_it_started(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile,
) -> None:
    # A batch burst: 2,000 answers of 1,000 tokens at t=0 on 2 replicas, one removed at
    # t=20 s and killed 10 s later. A full batch of 256 decodes a token in 33.6 ms, so its
    # answers need ~34 s: at the kill the removed replica's 256 are unfinished.
    burst = traces.Trace("batch", np.zeros(2_000), np.full(2_000, 100, dtype=np.int64),
                         np.full(2_000, 1_000, dtype=np.int64))
    pool = run.pool_for(policy_8b, profile_8b)
    cut = {}
    for dispatch in sim_cluster.DISPATCH_MODES:
        sim = run.run_strategy(_TwoThenOne(at=20.0), trace=burst, profile=profile_8b,
                               pool=pool, policy=policy_8b, initial_replicas=2, warmup_s=0.0,
                               grace_s=10.0, dispatch=dispatch)
        assert sim.dispatch == dispatch and sim.drained
        lost = np.flatnonzero(sim.interrupted)
        cut[dispatch] = (lost, sim)
    lost, sim = cut["queue"]
    # Every cut request had been admitted (its prefill scheduled); the queue went on to
    # the replica that stayed.
    assert lost.size == 256 and (sim.replica[lost] >= 0).all()
    assert sim.completed == 2_000 - 256
    # Push: the removed replica was killed with its own queue, requests it never started.
    lost, sim = cut["push"]
    never_started = lost[sim.replica[lost] < 0]
    assert lost.size == 1_000 and never_started.size == 1_000 - 256


def test_feasibility_is_the_same_under_both_dispatches(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # Requests alone on an idle replica (10 s apart, one arriving between two steps): the
    # floor latency `run.feasible` judges by is what either dispatch's cluster gives.
    arrival = np.asarray([0.0, 10.05, 20.0])
    inputs = np.asarray([60_000, 2_000, 100], dtype=np.int64)
    outputs = np.asarray([101, 50, 10], dtype=np.int64)
    trace = traces.Trace("alone", arrival, inputs, outputs)
    floors = scoring.floor_latencies(profile=profile_8b, arrival_s=arrival,
                                     input_tokens=inputs.astype(np.float64),
                                     output_tokens=outputs.astype(np.float64),
                                     metric="ttft", dt=0.1)
    for dispatch in sim_cluster.DISPATCH_MODES:
        sim = sim_cluster.SimCluster(
            trace=trace, profile=profile_8b, initial_replicas=1, dispatch=dispatch,
            pool=sim_cluster.PoolConfig(gpus_per_node=8, node_boot_s=0.0))
        for step in range(sim.steps):
            now = sim.time_of_step(step)
            sim.advance(now)
            sim.run_step(now)
            if sim.drained:
                break
        assert scoring.latencies(sim, "ttft") == pytest.approx(floors, abs=1e-9), dispatch


def test_dispatch_is_set_per_model_in_a_fleet_file_and_bad_values_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet_file = REPO / "loadtests" / "fleet" / "fleet.yaml"
    assert cli.main(["simulate", "--fleet", str(fleet_file), "--dispatch", "queue"]) == 2
    assert "--dispatch go in the fleet file (per model)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        cli.main(["simulate", "--trace", "t.csv", "--policy", str(POLICY),
                  "--dispatch", "pull"])
    assert refused.value.code == 2
    assert "invalid choice: 'pull'" in capsys.readouterr().err
