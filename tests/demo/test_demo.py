"""`scaler demo`: the simulated-cluster backend's semantics, and the demo end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaler.actuators import base as actuators
from scaler.demo import clock as demo_clock
from scaler.demo import cluster as demo_cluster
from scaler.engine import types
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.signals import messages
from scaler.signals import samples as signal_samples
from scaler.sim import profiles, traces

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "config" / "llama-8b.yaml"
# 2023-11-14T22:13:20Z, a Tuesday night in Berlin: the 8B policy's business-hours floor
# is off, so only the trace's load drives the service.
START = 1_700_000_000.0
DEMAND_WINNERS = {"concurrency", "queue_depth", "tokens_per_second", "p95_latency", "forecast"}


def llama_8b() -> policy_model.ScalePolicy:
    result = loader.load_paths([POLICY_FILE])
    assert result.ok, result.errors
    return result.policies[0]


def steady_trace(*, rate: float = 10.0, duration_s: float = 600.0) -> traces.Trace:
    """`rate` requests per second of 1,000 prompt and 200 output tokens."""
    arrival = np.arange(0.0, duration_s, 1.0 / rate)
    tokens = np.ones(arrival.size, dtype=np.int64)
    return traces.Trace("steady", arrival, tokens * 1000, tokens * 200, start_s=START)


def simulated(*, initial: int, trace: traces.Trace | None = None
              ) -> demo_cluster.SimulatedModel:
    policy = llama_8b()
    return demo_cluster.SimulatedModel(
        policy=policy, profile=profiles.load_profile("llama-3.1-8b-h100"),
        trace=trace or steady_trace(), initial_replicas=initial,
        subject="scaler.signals.inference.llama-8b")


def decision(*, current: int, desired: int) -> types.Decision:
    return types.Decision(model="inference/llama-8b", at=START, current=current,
                          desired=desired, recommendation=desired, winner="concurrency",
                          signals=())


def parsed(report: demo_cluster.Report, *, now: float) -> tuple[signal_samples.Sample, ...]:
    """A report as the service's NATS source reads it (the DESIGN 4.2 contract)."""
    result = messages.parse(report.body, now=now, route=messages.Route(
        expected="inference/llama-8b", default_namespace="inference",
        models={"inference/llama-8b": 30.0}))
    assert not isinstance(result, messages.Drop), result
    return result


# -- the backend: reader and actuators ---------------------------------------------------


async def test_reader_reports_the_simulated_pods() -> None:
    model = simulated(initial=2)
    backend = demo_cluster.backend({model.key: model})
    state = await backend.reader.read(model.policy)
    # Two ready replicas on one booted 8-GPU node: six more fit without a node boot; a
    # removed one drains for Kubernetes' default grace period.
    assert state == types.ClusterState(current=2, ready=2, starting=(), free_replica_slots=6,
                                       observations=(), grace_period_s=30.0)
    assert backend.leader.is_leader


async def test_scale_up_starts_pods_that_become_ready_after_their_cold_start() -> None:
    model = simulated(initial=2)
    backend = demo_cluster.backend({model.key: model})
    outcome = await backend.actuator.apply(model.policy, decision(current=2, desired=4))
    assert outcome.outcome is actuators.Outcome.APPLIED
    assert (outcome.previous, outcome.desired) == (2, 4)
    created = model.epoch(model.now)
    state = await backend.reader.read(model.policy)
    assert (state.current, state.ready) == (2 + 2, 2)
    assert state.starting == (created, created)
    assert state.free_replica_slots == 4
    # Profile: pull 60 + load 30 + readiness 15 = 105 s on a free GPU.
    model.advance_to(104.0)
    assert (await backend.reader.read(model.policy)).ready == 2
    model.advance_to(106.0)
    state = await backend.reader.read(model.policy)
    assert (state.ready, state.starting) == (4, ())
    assert [round(o.pod_start_s) for o in state.observations] == [105, 105]
    assert [c.desired for c in model.changes] == [4]


async def test_stale_decision_conflicts_and_changes_nothing() -> None:
    model = simulated(initial=2)
    actuator = demo_cluster.backend({model.key: model}).actuator
    # Read at 3 replicas, but the Deployment has 2: the scale subresource would answer 409.
    outcome = await actuator.apply(model.policy, decision(current=3, desired=5))
    assert outcome.outcome is actuators.Outcome.CONFLICT
    assert model.cluster.spec_replicas == 2
    assert model.changes == []


async def test_same_replicas_is_unchanged() -> None:
    model = simulated(initial=3)
    actuator = demo_cluster.backend({model.key: model}).actuator
    outcome = await actuator.apply(model.policy, decision(current=3, desired=3))
    assert outcome.outcome is actuators.Outcome.UNCHANGED
    assert model.cluster.scale_events == 0


async def test_scale_down_drains_a_ready_pod_which_then_stops_reporting() -> None:
    model = simulated(initial=3)
    backend = demo_cluster.backend({model.key: model})
    model.advance_to(5.0)
    before = {json.loads(r.body)["source"] for r in model.report(model.now)}
    assert len(before) == 3
    outcome = await backend.actuator.apply(model.policy, decision(current=3, desired=2))
    assert outcome.outcome is actuators.Outcome.APPLIED
    state = await backend.reader.read(model.policy)
    assert (state.current, state.ready, state.starting) == (2, 2, ())
    # The drained pod stops reporting once its requests are done and it is gone.
    model.advance_to(60.0)
    after = {json.loads(r.body)["source"] for r in model.report(model.now)}
    assert len(after) == 2 and after < before
    assert sum(1 for p in model.cluster.pods if p.phase == "gone") == 1


async def test_unknown_model_is_an_error() -> None:
    model = simulated(initial=1)
    other = llama_8b().model_copy(update={"metadata": policy_model.Metadata(
        name="other", namespace="inference")})
    with pytest.raises(LookupError, match="inference/other"):
        await demo_cluster.backend({model.key: model}).reader.read(other)


async def test_placeholder_actuator_holds_whole_nodes() -> None:
    model = simulated(initial=2)
    pool = model.policy.spec.node_pool
    assert pool is not None
    plan = types.NodePlan(pool=pool.name, resource_name="nvidia.com/gpu", gpus_per_node=8,
                          nodes_for_replicas=1, headroom_nodes=1, nodes_wanted=2,
                          placeholder_pods=1, placeholder_gpus=8)
    actuator = demo_cluster.backend({model.key: model}).pool_actuators["placeholder"]
    assert (await actuator.apply(pool, plan)).outcome is actuators.Outcome.APPLIED
    holders = [model.cluster.pods[s] for s in model.cluster.live_slots
               if model.cluster.pods[s].placeholder]
    assert [p.gpus for p in holders] == [8]
    assert model.cluster.live_node_count == 2  # the placeholder made a node boot
    assert (await actuator.apply(pool, plan)).outcome is actuators.Outcome.UNCHANGED


# -- what the simulated replicas publish -------------------------------------------------


def test_each_ready_replica_reports_one_contract_message_per_second() -> None:
    model = simulated(initial=2)
    reports = model.advance_to(30.0)
    # t = 0, 1, ..., 30: 31 report rounds of 2 replicas; no gateway while replicas serve.
    assert len(reports) == 31 * 2
    assert {r.subject for r in reports} == {"scaler.signals.inference.llama-8b"}
    last = [json.loads(r.body) for r in reports[-2:]]
    assert {body["source"] for body in last} == {"llama-8b-0", "llama-8b-1"}
    samples = parsed(reports[-1], now=model.epoch(30.0))
    signals = {s.signal for s in samples}
    assert {"queue_depth", "in_flight", "tokens_per_second", "p95_latency"} <= signals
    # Only contract fields (the gateway's arrival rate stays in the simulator).
    assert all(set(body) <= set(messages.SignalMessage.model_fields) for body in last)
    assert all(s.ts == pytest.approx(model.epoch(30.0)) for s in samples)
    # 10 req/s shared by two replicas: each runs requests and generates tokens.
    by_signal = {s.signal: s for s in samples}
    assert (by_signal["in_flight"].value or 0) > 0
    assert (by_signal["tokens_per_second"].value or 0) > 0
    assert by_signal["p95_latency"].metric == "ttft"
    histogram = by_signal["p95_latency"].histogram
    assert histogram is not None and histogram.total > 0


def test_gateway_reports_the_held_queue_when_no_replica_is_ready() -> None:
    model = simulated(initial=0)
    reports = model.advance_to(3.0)
    bodies = [json.loads(r.body) for r in reports]
    assert {body["source"] for body in bodies} == {"gateway"}
    assert bodies[-1]["queue_depth"] > bodies[0]["queue_depth"] > 0
    samples = parsed(reports[-1], now=model.epoch(3.0))
    assert [(s.signal, s.source) for s in samples] == [("queue_depth", "nats/gateway")]


def test_cluster_starts_busy_even_on_a_slice_shorter_than_the_warm_up() -> None:
    # 30 s of 10 req/s replayed before t=0 (not 120 s ending in 90 s of silence).
    model = simulated(initial=2, trace=steady_trace(duration_s=30.0))
    waiting, running = model.in_system()
    assert model.now == pytest.approx(0.0)
    assert waiting + running > 0


def test_virtual_clock_runs_at_speed_and_never_backwards() -> None:
    loop_time = [100.0]
    clock = demo_clock.VirtualClock(loop_time=lambda: loop_time[0], start_epoch=START, speed=60.0)
    loop_time[0] = 101.0
    assert clock() == START  # frozen until begin()
    clock.begin()
    loop_time[0] = 102.5
    assert clock.elapsed() == pytest.approx(90.0)
    clock.hold_back(limit=30.0)  # the simulation is 60 s behind: pause the clock
    assert clock() == pytest.approx(START + 90.0)
    loop_time[0] = 103.0  # 30 + 60 x 0.5 = 60 < 90: still paused
    assert clock.elapsed() == pytest.approx(90.0)
    loop_time[0] = 104.0  # 30 + 60 x 1.5 = 120
    assert clock.elapsed() == pytest.approx(120.0)
    assert clock.held_back_s == pytest.approx(60.0)


# -- end to end, as a user runs it ---------------------------------------------------------


def _nats_servers_on(port: int) -> list[str]:
    """Command lines of live nats-server processes listening on `port`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # the process ended while we looked
        words = [a.decode(errors="replace") for a in argv if a]
        if words and words[0].endswith("nats-server") and str(port) in words:
            found.append(" ".join(words))
    return found


def _demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "scaler", "demo", "--no-ui", *args]


def test_demo_scales_the_simulated_cluster_and_cleans_up(tmp_path: Path) -> None:
    report, summary = tmp_path / "demo.html", tmp_path / "demo.json"
    done = subprocess.run(
        _demo_command("--speed", "120", "--duration", "240", "--report", str(report),
                      "--json", str(summary)),
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(summary.read_text())
    run = document["models"]["inference/llama-8b"]
    # Conv x8 needs more than the first minute's replicas: the service, fed only by the
    # replicas' NATS reports, scaled the simulated Deployment up on a demand signal.
    assert run["max_replicas"] > run["initial_replicas"]
    ups = [c for c in run["changes"] if c["to"] > c["from"]]
    assert ups and {c["winner"] for c in ups} <= DEMAND_WINNERS
    assert run["evaluations"] > 0 and run["reports_published"] > 0
    assert document["messages_published"] == run["reports_published"]
    assert not document["interrupted"] and document["failed"] is None
    scores = run["simulation"]["strategies"]
    assert scores["scaler"]["max_replicas"] == run["max_replicas"]
    assert scores["scaler"]["completed"] == scores["scaler"]["requests"] > 0
    assert "oracle" in scores
    assert report.read_text().startswith("<!doctype html>")
    assert "Scaling up from" in done.stdout
    port = int(document["nats_url"].rsplit(":", 1)[1])
    assert _nats_servers_on(port) == []


def test_ctrl_c_stops_the_demo_cleanly(tmp_path: Path) -> None:
    summary = tmp_path / "demo.json"
    process = subprocess.Popen(
        _demo_command("--speed", "20", "--duration", "1200", "--json", str(summary)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        # The first status line means the replay runs: interrupt it there.
        for line in process.stdout:
            if line.startswith("[+"):
                break
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr[-3000:]
    document = json.loads(summary.read_text())
    assert document["interrupted"] is True
    assert document["replayed_s"] < 1200
    assert "no simulation report for a partial run" in stdout
    port = int(document["nats_url"].rsplit(":", 1)[1])
    assert _nats_servers_on(port) == []
