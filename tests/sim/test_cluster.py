"""The simulated cluster against its profile: saturation, Little's law, cold starts, draining."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, traces

from .factories import step_trace, synthetic_trace


def _drive(sim: sim_cluster.SimCluster, *, until: float | None = None,
           actions: dict[float, int] | None = None) -> None:
    """Step the cluster with fixed scale actions {time: replicas} (no strategy)."""
    actions = dict(actions or {})
    end = sim.steps if until is None else min(sim.steps, int(until / sim.dt))
    for step in range(end):
        now = step * sim.dt
        sim.advance(now)
        for at in [t for t in actions if t <= now + 1e-9]:
            sim.scale_to(actions.pop(at), now=now)
        sim.run_step(now)
        if now > sim.trace.duration_s and sim.completed == sim.trace.requests:
            break


def _pool(profile: profiles.ReplicaProfile, **kwargs: float) -> sim_cluster.PoolConfig:
    return sim_cluster.PoolConfig(
        gpus_per_node=int(kwargs.get("gpus_per_node", profile.node.gpus_per_node)),
        node_boot_s=profile.cold_start.node_boot_seconds,
        max_nodes=None,
    )


@pytest.mark.parametrize(("input_tokens", "output_tokens"), [(1000, 200), (2048, 28), (300, 600)])
def test_saturation_throughput_matches_the_profile(
    profile_8b: profiles.ReplicaProfile, input_tokens: int, output_tokens: int
) -> None:
    # One replica, offered twice what it can do: completions per second in steady state
    # are the profile's saturation rate (1,000 in / 200 out: 15.1 req/s).
    capacity = profile_8b.saturation_rate(input_tokens=input_tokens,
                                          output_tokens=output_tokens)
    trace = synthetic_trace(rate=2 * capacity, duration_s=240, input_tokens=input_tokens,
                            output_tokens=output_tokens)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=1)
    _drive(sim, until=240)
    done = sim.done[np.isfinite(sim.done)]
    measured = np.count_nonzero((done >= 120) & (done < 240)) / 120.0
    assert measured == pytest.approx(capacity, rel=0.05)


def test_littles_law_holds(profile_8b: profiles.ReplicaProfile) -> None:
    # Two replicas at about 60 % load: time-average requests in the system L equals the
    # arrival rate lambda times the mean time in system W, over the whole run.
    trace = synthetic_trace(rate=16.0, duration_s=600, input_tokens=1000, output_tokens=200,
                            seed=5)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=2)
    _drive(sim)
    assert sim.completed == trace.requests
    h = sim.history
    horizon = sim.step * sim.dt
    in_system = float((h.waiting[: sim.step] + h.running[: sim.step]).sum()) * sim.dt / horizon
    rate = trace.requests / horizon
    time_in_system = float(np.mean(sim.done - sim.arrival))
    assert in_system == pytest.approx(rate * time_in_system, rel=0.05)
    # And a sanity anchor: at 60 % load TTFT stays well under a second.
    assert float(np.nanpercentile(sim.first_token - sim.arrival, 95)) < 1.0


def test_scale_up_on_a_free_gpu_takes_the_pod_start(profile_8b: profiles.ReplicaProfile) -> None:
    # A step from 4 to 20 req/s at t=100; scaling to 2 at t=100 on a node with a free
    # GPU: the new replica serves its first request at 100 + pull 60 + load 30 +
    # readiness 15 = 205 s, not before.
    trace = step_trace(segments=[(100, 4.0), (300, 20.0)], input_tokens=1000, output_tokens=200)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=1)
    _drive(sim, until=400, actions={100.0: 2})
    second = sim.replica == 1
    first_served = float(np.nanmin(sim.first_token[second]))
    pod_start = profile_8b.cold_start.pod_start_seconds
    assert pod_start == 105
    assert 100 + pod_start <= first_served < 100 + pod_start + 1.0
    assert sim.observations[-1].node_boot_s == 0
    assert sim.observations[-1].ready_at - sim.observations[-1].created_at == pod_start


def test_scale_up_without_a_free_gpu_waits_for_a_node(profile_8b: profiles.ReplicaProfile) -> None:
    # One GPU per node: the second replica needs a node boot first (300 s), so it is
    # ready at 100 + 300 + 105 = 505 s; the queue builds in the meantime.
    trace = step_trace(segments=[(100, 4.0), (500, 20.0)], input_tokens=1000, output_tokens=200)
    pool = sim_cluster.PoolConfig(gpus_per_node=1, node_boot_s=300.0)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=pool, initial_replicas=1)
    _drive(sim, until=600, actions={100.0: 2})
    first_served = float(np.nanmin(sim.first_token[sim.replica == 1]))
    assert 505 <= first_served < 506
    assert sim.observations[-1].node_boot_s == 300
    assert int(sim.history.nodes[int(200 / sim.dt)]) == 2
    # Overloaded until then (20 req/s against 15 req/s of capacity): TTFT grew.
    late = (sim.arrival > 400) & (sim.arrival < 500)
    assert float(np.nanmedian(sim.first_token[late] - sim.arrival[late])) > 10.0


def test_node_pool_max_size_bounds_nodes(profile_8b: profiles.ReplicaProfile) -> None:
    trace = synthetic_trace(rate=2.0, duration_s=400, input_tokens=100, output_tokens=10)
    pool = sim_cluster.PoolConfig(gpus_per_node=2, node_boot_s=60.0, max_nodes=2)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=pool, initial_replicas=1)
    _drive(sim, actions={10.0: 6})
    assert int(sim.history.nodes.max()) == 2
    assert int(sim.history.ready.max()) == 4
    # Node 2 is ready at 70 s and its pods at 175 s; the last two pods never get a node.
    assert int(sim.history.starting[int(150 / sim.dt)]) == 4
    assert int(sim.history.starting[int(300 / sim.dt)]) == 2


def test_scale_down_drains_in_flight_requests_and_bills_until_gone(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # Long outputs so requests are in flight at the scale-down at t=60: none is lost,
    # and the removed replica's GPU is billed until its last request finishes.
    trace = synthetic_trace(rate=3.0, duration_s=120, input_tokens=200, output_tokens=2000,
                            seed=2)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=2)
    _drive(sim, actions={60.0: 1})
    assert sim.completed == trace.requests
    removed = [p for p in sim.pods if p.phase == "gone"]
    assert len(removed) == 1
    gone_at = removed[0].gone_at
    assert gone_at is not None and gone_at > 60.0
    last_on_removed = float(np.nanmax(sim.done[sim.replica == removed[0].slot]))
    assert gone_at == pytest.approx(last_on_removed, abs=2 * sim.dt)
    # No request was routed to it after the scale-down.
    routed_after = (sim.replica == removed[0].slot) & (sim.arrival > 60.0 + sim.dt)
    assert not routed_after.any()
    horizon = sim.step * sim.dt
    assert sim.gpu_seconds(until=horizon) == pytest.approx(gone_at + horizon, rel=0.01)


def test_router_balances_least_loaded(profile_8b: profiles.ReplicaProfile) -> None:
    trace = synthetic_trace(rate=20.0, duration_s=120, input_tokens=500, output_tokens=100)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=4)
    _drive(sim)
    counts = np.bincount(sim.replica[sim.replica >= 0], minlength=4)
    assert counts.min() > 0.8 * counts.mean()


def test_runs_are_deterministic(profile_8b: profiles.ReplicaProfile) -> None:
    trace = traces.scale_rate(
        synthetic_trace(rate=5.0, duration_s=120, input_tokens=800, output_tokens=50), 2.0,
        seed=4)
    outcomes = []
    for _ in range(2):
        sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                     initial_replicas=1)
        _drive(sim, actions={30.0: 3})
        outcomes.append((sim.first_token.copy(), sim.done.copy()))
    assert np.array_equal(outcomes[0][0], outcomes[1][0], equal_nan=True)
    assert np.array_equal(outcomes[0][1], outcomes[1][1], equal_nan=True)


def test_kv_cache_bounds_the_batch(profile_8b: profiles.ReplicaProfile) -> None:
    # 8,000-token prompts + 2,000 out: 400,000 / 10,000 = 40 requests fit, not 256.
    trace = synthetic_trace(rate=40.0, duration_s=30, input_tokens=8000, output_tokens=2000)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=1)
    _drive(sim, until=60)
    assert int(sim.history.running[: sim.step].max()) == 40


def test_warm_up_traffic_is_served_but_neither_scored_nor_billed(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # 120 s of warm-up send the trace's requests of its first 120 s before t=0 (its
    # request at 0 once, at t=0): at t=0 the replicas are as busy as in steady state;
    # requests before 0 are extra, GPU-hours start at 0.
    trace = synthetic_trace(rate=10.0, duration_s=300, input_tokens=1000, output_tokens=200)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=2, warmup_s=120.0)
    warm = int(np.count_nonzero((trace.arrival_s > 0.0) & (trace.arrival_s < 120.0)))
    assert sim.first == warm and sim.t0 == -120.0
    for step in range(sim.steps):
        now = sim.time_of_step(step)
        sim.advance(now)
        sim.run_step(now)
        if now > trace.duration_s and sim.completed == sim.arrival.size:
            break
    assert sim.completed == trace.requests + warm
    i0 = sim.index(0.0)
    assert int(sim.history.running[i0]) > 0               # busy at t=0, not empty
    assert sim.gpu_seconds(until=300.0) == pytest.approx(2 * 300.0)


def test_the_warm_up_meets_t0_at_the_rate_the_load_starts_at(
    profile_8b: profiles.ReplicaProfile,
) -> None:
    # A climb from 2 to 20 req/s over its first 4 minutes. Replayed forwards, its first
    # 120 s would end the warm-up at about 11 req/s and fall back to 2 at t=0, a fall the
    # load never had. At those seconds' times played backwards, each span before t=0
    # carries as many requests as the same span after it: the rate runs into t=0 as it
    # runs out of it. The requests are sent in their order, so the last before t=0 are
    # those of about 120 s, not the first ones again.
    trace = step_trace(segments=[(30.0, 2.0 + 18.0 * k / 8) for k in range(8)],
                       input_tokens=600, output_tokens=200, seed=3)
    sent, repeats = traces.warmup(trace.arrival_s, 120.0)
    assert np.all(np.diff(sent) >= 0) and 0.0 < sent.min() and sent.max() < 120.0
    opening = trace.arrival_s[(trace.arrival_s > 0.0) & (trace.arrival_s < 120.0)]
    assert np.allclose(sent, np.sort(120.0 - opening))
    assert np.array_equal(repeats, np.arange(1, opening.size + 1))
    sim = sim_cluster.SimCluster(trace=trace, profile=profile_8b, pool=_pool(profile_8b),
                                 initial_replicas=2, warmup_s=120.0)
    assert np.allclose(np.sort(-sim.arrival[:sim.first]), opening)
    assert (np.count_nonzero((sim.arrival > -30.0) & (sim.arrival <= 0.0))
            < np.count_nonzero((sim.arrival > -120.0) & (sim.arrival <= -90.0)))
    # No warm-up, nothing sent.
    assert traces.warmup(trace.arrival_s, 0.0)[0].size == 0
