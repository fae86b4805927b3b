"""Baselines reproduce their published algorithms; the scaler adapter feeds the real engine."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed, profiles, run
from scaler.sim.strategies import hpa, keda, kpa, oracle
from scaler.sim.strategies import scaler as scaler_strategy

from .factories import step_trace, synthetic_trace


def _with_bounds(policy: policy_model.ScalePolicy, *, low: int, high: int
                 ) -> policy_model.ScalePolicy:
    spec = policy.spec.model_copy(update={
        "replicas": policy_model.Replicas(min=low, max=high),
        "warm_floor": policy_model.WarmFloor(),
    })
    return policy.model_copy(update={"spec": spec})


# ----- HPA -------------------------------------------------------------------------------

@pytest.mark.parametrize(("now", "proposal", "expected"), [
    (0, 10, 10),
    (15, 4, 10),
    (150, 4, 10),
    (285, 4, 10),     # the t=0 recommendation of 10 is still inside the 300 s window
    (300, 4, 4),      # ... and falls out of it exactly at 300 s
])
def test_hpa_down_stabilization_window_is_300_s(
    policy_8b: policy_model.ScalePolicy, now: float, proposal: int, expected: int
) -> None:
    controller = hpa.HpaController(_with_bounds(policy_8b, low=1, high=32))
    current = 10
    for at, value in [(0.0, 10), (15.0, 4), (150.0, 4), (285.0, 4), (300.0, 4)]:
        got = controller.normalize(current=current, proposal=value, now=at)
        if at == now:
            assert (value, got) == (proposal, expected)
            return
        current = got


def test_hpa_scale_up_rate_is_max_of_4_pods_and_100_percent_per_15_s(
    policy_8b: policy_model.ScalePolicy,
) -> None:
    controller = hpa.HpaController(_with_bounds(policy_8b, low=1, high=32))
    # From 2 asking 20: max(2 + 4, 2 x 2) = 6; 15 s later from 6: max(10, 12) = 12; then 20.
    assert controller.normalize(current=2, proposal=20, now=0.0) == 6
    assert controller.normalize(current=6, proposal=20, now=15.0) == 12
    assert controller.normalize(current=12, proposal=20, now=30.0) == 20


@pytest.mark.parametrize(("values_sum", "with_metrics", "missing", "current", "expected"), [
    (4 * 1.0, 4, 0, 4, 6),       # 4 pods at 100 % of a 70 % target: ceil(5.71) = 6
    (4 * 0.75, 4, 0, 4, 4),      # 75 % vs 70 %: ratio 1.07 within the 10 % tolerance
    (4 * 0.35, 4, 0, 4, 2),      # half the target: ceil(2) = 2
    (2 * 1.0, 2, 2, 4, 4),       # up with 2 starting pods counted as 0: ratio 0.71 flips
    (3 * 1.0, 3, 1, 4, 4),       # up: (3 x 1.0 + 0) / 4 / 0.7 = 1.07, within tolerance
    (2 * 0.2, 2, 2, 4, 3),       # down: missing pods at target: (0.4 + 1.4) / 4 / 0.7 -> 3
    (0.0, 0, 3, 3, 3),           # no metrics at all: no change
])
def test_hpa_plain_metric_replica_calculator(
    values_sum: float, with_metrics: int, missing: int, current: int, expected: int
) -> None:
    got = hpa.plain_metric_replicas(
        current=current, values_sum=values_sum, with_metrics=with_metrics, missing=missing,
        target=0.7, tolerance=0.1)
    assert got == expected


@pytest.mark.parametrize(("values_sum", "with_metrics", "unready", "expected"), [
    (4 * 1.0, 4, 2, 6),      # up: 2 Pending pods as 0: 4 / 6 / 0.7 = 0.95: stays at 6
    (4 * 1.0, 4, 1, 6),      # up: 4 / 5 / 0.7 = 1.14 -> ceil(5.7) = 6
    (4 * 0.35, 4, 2, 2),     # down: Pending pods ignored: ceil(0.5 x 4) = 2
])
def test_hpa_pending_pods_count_only_on_scale_up(
    values_sum: float, with_metrics: int, unready: int, expected: int
) -> None:
    assert hpa.plain_metric_replicas(
        current=with_metrics + unready, values_sum=values_sum, with_metrics=with_metrics,
        missing=0, unready=unready, target=0.7, tolerance=0.1) == expected


def test_hpa_in_the_simulator_waits_300_s_before_scaling_down(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile
) -> None:
    # 40 req/s for 300 s, then 2 req/s: GPU utilisation falls at 300 s, the HPA sees it
    # 30-60 s later, and the first scale-down comes one 300 s window after that.
    policy = _with_bounds(policy_8b, low=1, high=32)
    trace = step_trace(segments=[(300, 40.0), (700, 2.0)], input_tokens=1000,
                       output_tokens=200)
    strategy = hpa.Hpa(policy)
    pool = run.pool_for(policy, profile_8b)
    sim = run.run_strategy(strategy, trace=trace, profile=profile_8b, pool=pool, policy=policy,
                           initial_replicas=4)
    spec = sim.history.spec[: sim.step]
    peak_at = int(np.argmax(spec))
    after = np.flatnonzero(spec[peak_at:] < spec[peak_at]) + peak_at
    assert spec.max() > 4                      # it scaled up under load
    first_down_s = sim.time_of_step(int(after[0]))
    assert 300 + 30 + 300 <= first_down_s <= 300 + 60 + 300 + 15 + 1


# ----- KEDA ------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "metric", "expected"), [
    (2, 23.0, 5),     # ceil(23 / 5)
    (2, 10.5, 2),     # 10.5 / (5 x 2) = 1.05: within tolerance
    (4, 0.0, 0),      # empty queue: zero, which the HPA then clamps to its minimum
    (0, 7.0, 2),
])
def test_keda_external_average_value(status: int, metric: float, expected: int) -> None:
    assert keda.external_per_pod_replicas(status=status, metric=metric, target=5.0,
                                                tolerance=0.1) == expected


def test_keda_drops_to_min_once_the_queue_empties(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile
) -> None:
    # The queue-length trigger's flaw: with enough capacity the waiting queue is 0, so
    # KEDA asks for 0 -> min replicas after the 300 s window, whatever the load.
    policy = _with_bounds(policy_8b, low=1, high=32)
    trace = synthetic_trace(rate=20.0, duration_s=500, input_tokens=1000, output_tokens=200)
    strategy = keda.Keda(policy)
    sim = run.run_strategy(strategy, trace=trace, profile=profile_8b,
                           pool=run.pool_for(policy, profile_8b), policy=policy,
                           initial_replicas=4)
    spec = sim.history.spec[: sim.step]
    assert int(spec[sim.index(250)]) == 4
    assert int(spec[sim.index(305)]) == 1
    # ... and then the queue on one replica brings it back up (by 315 s, next poll).
    assert int(spec[sim.index(330)]) > 4


# ----- Knative KPA -----------------------------------------------------------------------

def test_kpa_panics_at_200_percent_and_never_scales_down_while_panicking(
    policy_8b: policy_model.ScalePolicy,
) -> None:
    autoscaler = kpa.Kpa(_with_bounds(policy_8b, low=1, high=100))
    # 2 ready pods, target 70 per pod. Panic-window concurrency 210 -> 3 pods = 150 %:
    # no panic, the stable window (100 -> 2 pods) decides.
    assert autoscaler.scale(stable=100.0, panic=210.0, ready=2, now=0.0) == 2
    assert not autoscaler.panicking
    # 280 -> 4 pods = 200 % of ready: panic, take the panic window's 4.
    assert autoscaler.scale(stable=100.0, panic=280.0, ready=2, now=2.0) == 4
    assert autoscaler.panicking
    # Still within 60 s of the last over-threshold tick: no scale-down in panic.
    assert autoscaler.scale(stable=100.0, panic=70.0, ready=4, now=30.0) == 4
    assert autoscaler.scale(stable=100.0, panic=70.0, ready=4, now=62.0) == 4
    # 60 s after the panic was last extended (t=2): leave panic, back to the stable 2.
    assert autoscaler.scale(stable=100.0, panic=70.0, ready=4, now=62.5) == 2
    assert not autoscaler.panicking


def test_kpa_stable_window_and_rate_limits(policy_8b: policy_model.ScalePolicy) -> None:
    autoscaler = kpa.Kpa(_with_bounds(policy_8b, low=1, high=100))
    assert autoscaler.scale(stable=700.0, panic=700.0, ready=10, now=0.0) == 10
    # Max scale-down rate 2: from 10 ready at most to 5, even at zero concurrency.
    assert autoscaler.scale(stable=0.0, panic=0.0, ready=10, now=2.0) == 5
    assert autoscaler.stable_s == 60 and autoscaler.panic_s == 6 and autoscaler.target_per_pod == 70


def test_kpa_scales_to_zero_only_after_the_grace_period(
    policy_8b: policy_model.ScalePolicy,
) -> None:
    autoscaler = kpa.Kpa(_with_bounds(policy_8b, low=0, high=10))
    assert autoscaler.scale(stable=0.0, panic=0.0, ready=1, now=0.0) == 1
    assert autoscaler.scale(stable=0.0, panic=0.0, ready=1, now=28.0) == 1
    assert autoscaler.scale(stable=0.0, panic=0.0, ready=1, now=30.0) == 0
    assert autoscaler.scale(stable=5.0, panic=5.0, ready=0, now=32.0) == 1


# ----- oracle and the real engine ----------------------------------------------------------

def test_oracle_need_follows_the_profile(profile_8b: profiles.ReplicaProfile) -> None:
    trace = step_trace(segments=[(120, 10.0), (120, 40.0)], input_tokens=1000,
                       output_tokens=200)
    need = oracle.oracle_need(trace, profile_8b)
    # 10 req/s / (15.1 x 0.85) -> 1; 40 req/s -> ceil(3.1) = 4 (Poisson noise per 10 s
    # bucket can push a bucket higher, never lower than the mean-rate need).
    assert need[0] == 1
    assert 4 <= need[2] <= 5


def _chat_cluster_and_scaler(policy: policy_model.ScalePolicy, profile: profiles.ReplicaProfile
                             ) -> tuple[sim_cluster.SimCluster, scaler_strategy.ScalerStrategy]:
    """Two replicas serving 20 req/s of 1,000-token prompts and 200-token answers, and the
    scaler strategy that watches them."""
    trace = synthetic_trace(rate=20.0, duration_s=60, input_tokens=1000, output_tokens=200)
    sim = sim_cluster.SimCluster(trace=trace, profile=profile,
                                 pool=run.pool_for(policy, profile), initial_replicas=2)
    return sim, scaler_strategy.ScalerStrategy(policy, start_epoch_s=1_700_000_000.0)


def test_scaler_strategy_feeds_the_engine_through_the_signal_store(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile
) -> None:
    sim, strategy = _chat_cluster_and_scaler(policy_8b, profile_8b)
    seen: dict[float, tuple[int, int]] = {}
    for step in range(int(30 / sim.dt) + 1):
        now = sim.time_of_step(step)
        sim.advance(now)
        if step % 10 == 0:
            # What the replicas hold when they publish at `now` (before this step's work).
            seen[round(now)] = (sum(len(sim.queues[s]) for s in sim.serving_slots),
                                sum(sim.running[s] for s in sim.serving_slots))
            snap = strategy.snapshot(sim, now=now)
        sim.run_step(now)
    # At t=30 the engine sees what the two pods published at t=29, summed, 1 s old.
    assert snap.queue_depth is not None and snap.in_flight is not None
    assert (snap.queue_depth.value, snap.in_flight.value) == seen[29]
    assert snap.in_flight.age_s == pytest.approx(1.0)
    assert snap.in_flight.sources == 2
    # Tokens/s: the pods' counters over 10 s, summed: 20 req/s x 200 tokens = 4,000.
    assert snap.tokens_per_second is not None
    assert snap.tokens_per_second.value == pytest.approx(4000, rel=0.15)
    # Prompt tokens/s: 20 req/s x 1,000 prompt tokens = 20,000, prefilled as they come.
    assert snap.prompt_tokens_per_second is not None
    assert snap.prompt_tokens_per_second.value == pytest.approx(20000, rel=0.15)
    # p95 TTFT from merged vLLM-bucket histograms, within the bucket of the true value.
    assert snap.p95_latency is not None
    first = sim.first_token - sim.arrival
    window = (sim.first_token > 29.0 - 30.0) & (sim.first_token <= 29.0)
    true_p95 = float(np.percentile(first[window], 95))
    bounds = [0.0, *feed.VLLM_LATENCY_BUCKETS]
    upper = next(b for b in bounds if b >= true_p95)
    lower = max(b for b in bounds if b < upper)
    assert lower <= snap.p95_latency.value <= upper
    state = strategy.cluster_state(sim, now=30.0)
    assert (state.current, state.ready, state.starting) == (2, 2, ())
    sim.scale_to(3, now=30.0)
    state = strategy.cluster_state(sim, now=30.0)
    assert (state.current, state.ready, len(state.starting)) == (3, 2, 1)
    assert state.starting[0] == pytest.approx(1_700_000_030.0)
    assert state.free_replica_slots == 5
    desired = strategy.decide(sim, now=30.0)
    assert 1 <= desired <= policy_8b.spec.replicas.max


def test_a_restarted_scaler_strategy_has_an_empty_store_and_the_state_it_is_given(
    policy_8b: policy_model.ScalePolicy, profile_8b: profiles.ReplicaProfile
) -> None:
    # bench/restart.py's restart: a new process knows no sample until replicas report.
    sim, strategy = _chat_cluster_and_scaler(policy_8b, profile_8b)
    for step in range(int(5 / sim.dt) + 1):
        now = sim.time_of_step(step)
        sim.advance(now)
        strategy.decide(sim, now=now)
        sim.run_step(now)
    assert strategy.feed.snapshot(now=5.0, stale_after_s=30.0).in_flight is not None
    resumed = engine_types.Learned(served_share=0.9, served_samples=3).state()
    strategy.restart(resumed)
    assert strategy.state is resumed
    assert strategy.feed.snapshot(now=5.0, stale_after_s=30.0).in_flight is None
