"""Scripted signal timelines -> expected replicas (in the style of Knative's autoscaler_test)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scaler.core import histogram as histograms
from scaler.engine import decide as engine_decide
from scaler.engine import types
from tests.engine.helpers import (
    BASE,
    MONDAY_0600_UTC,
    SLOW_START,
    Sim,
    policy,
    sawtooth_running,
    snap,
    value,
)

BEHAVIOR = BASE["spec"]["behavior"]


def test_concurrency_counts_running_and_waiting() -> None:
    sim = Sim(policy())
    # (25 running + 10 waiting) / 10 per replica = 3.5 -> 4
    assert sim.step(0, snap(running=25, waiting=10)) == 4
    assert sim.last is not None and sim.last.winner == "concurrency"


def test_float_noise_does_not_add_a_replica() -> None:
    sim = Sim(policy())
    assert sim.step(0, snap(running=0.1 + 0.2, waiting=29.7)) == 3


def test_spike_with_zero_up_window() -> None:
    sim = Sim(policy())
    # (t, running, expected replicas): a 0 s up window meets the spike at once. 9.5
    # replicas on 8 buy 9, the count whose 10 % tolerance holds them; 10 on 9 buy 10.
    timeline = [(0, 10, 1), (15, 80, 8), (30, 80, 8), (45, 95, 9), (60, 100, 10)]
    got = [(t, running, sim.step(t, snap(running=running, waiting=0)))
           for t, running, _ in timeline]
    assert got == timeline


def test_drop_is_held_for_the_down_window() -> None:
    sim = Sim(policy())
    assert sim.step(0, snap(running=80, waiting=0)) == 8
    timeline = [(30, 8), (100, 8), (299, 8), (301, 2), (400, 2)]
    for t, expected in timeline:
        assert sim.step(t, snap(running=20, waiting=0)) == expected, t
    assert sim.last is not None


def test_down_window_names_its_clamp() -> None:
    sim = Sim(policy())
    sim.step(0, snap(running=80, waiting=0))
    sim.step(60, snap(running=20, waiting=0))
    assert sim.last is not None
    assert [c.name for c in sim.last.clamps] == ["stabilization_down"]
    assert sim.last.recommendation == 2 and sim.last.desired == 8


def test_stale_signal_holds_even_after_the_down_window() -> None:
    sim = Sim(policy())
    assert sim.step(0, snap(running=80)) == 8
    for t in (60, 400, 1000):
        # The in-flight count is 45 s old (stale after 30 s): demand unknown, hold.
        assert sim.step(t, snap(running=5, age=45)) == 8
    assert sim.last is not None and sim.last.held
    assert sim.last.signals[0].fresh is False


def test_missing_signal_holds() -> None:
    sim = Sim(policy(), current=6)
    assert sim.step(0, snap()) == 6
    assert sim.step(1000, snap()) == 6
    assert sim.last is not None and sim.last.winner is None


def test_fresh_queue_scales_up_while_concurrency_is_stale() -> None:
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=2)
    stale_running = value(1, age=90)
    snapshot = types.SignalSnapshot(in_flight=stale_running, queue_depth=value(20))
    assert sim.step(0, snapshot) == 10   # 20 waiting / 2 per replica
    assert sim.last is not None and sim.last.winner == "queue_depth"


def test_empty_queue_never_pushes_down_on_its_own() -> None:
    p = policy(signals={"queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=5)
    for t in (0, 400, 800):
        assert sim.step(t, snap(waiting=0)) == 5


def test_starting_replicas_are_not_double_counted() -> None:
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 4},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}})
    sim = Sim(p, current=1, ready_after=60)
    # 10 running, 30 waiting: 4 replicas by concurrency, 30 / 4 -> 8 by queue pressure.
    assert sim.step(0, snap(running=10, waiting=30, p95=6.0)) == 8
    # While 7 replicas start, latency stays high and the queue stays long: the guard
    # scales from the 1 ready replica (1 x 3 = 3), the queue still asks for 8, so the
    # replicas already starting cover it and nothing more is added.
    for t in (10, 20, 40, 59):
        assert sim.step(t, snap(running=10, waiting=30, p95=6.0)) == 8
    assert sim.last is not None
    cluster = sim.cluster(MONDAY_0600_UTC + 59)
    assert cluster.ready == 1 and len(cluster.starting) == 7


def test_latency_guard_pushes_up_in_proportion_and_never_down() -> None:
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}})
    sim = Sim(p, current=4)
    # concurrency says 2; p95 3 s against 2 s with 4 ready -> 6
    assert sim.step(0, snap(running=20, p95=3.0)) == 6
    assert sim.last is not None and sim.last.winner == "p95_latency"
    # Within the SLO the guard has no opinion: concurrency's 2 wins after the window.
    assert sim.step(400, snap(running=20, p95=0.5)) == 2


GUARD = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}})


def latency(p95: float, *, le: tuple[float, ...] = (), counts: tuple[float, ...] = ()
            ) -> types.SignalValue:
    """A p95 value, with the merged histogram it was read from when `le` is given."""
    merged = histograms.Histogram(le=le, counts=counts) if le else None
    return types.SignalValue(value=p95, age_s=0.0, fresh=True, histogram=merged)


@pytest.mark.parametrize(
    ("case", "waiting", "p95", "expected"),
    [
        # 4 ready, concurrency says 2 (20 running / 10): only the guard can push.
        ("p95 3 s > SLO 2 s while requests wait: ready x 1.5", 10.0, latency(3.0), 6),
        ("the push is at most 2 x ready, however far past the SLO", 10.0, latency(75.0), 8),
        ("nothing waits: the latencies are of a backlog already served", 0.0,
         latency(75.0), 4),
        ("3 waiting on 4 ready replicas start at once: no push", 3.0, latency(75.0), 4),
        ("no queue signal: the guard cannot tell the present, it acts", None,
         latency(3.0), 6),
        # vLLM's buckets around a 2 s SLO are (1, 2.5]: 90 % under 1 s, 97 % under 2.5 s.
        # Interpolation reads p95 = 2.07 s; the buckets cannot confirm a violation.
        ("a bucket straddling the SLO cannot tell: no push", 10.0,
         latency(2.07, le=(0.5, 1.0, 2.5, 5.0), counts=(50, 90, 97, 100)), 4),
        # 80 % under 2.5 s: even the optimistic bound is below 95 %, a certain violation.
        ("a certain violation from the bucket edges pushes", 10.0,
         latency(4.0, le=(0.5, 1.0, 2.5, 5.0), counts=(50, 70, 80, 100)), 8),
    ],
)
def test_latency_guard_reads_the_present_and_knows_its_buckets(
    case: str, waiting: float | None, p95: types.SignalValue, expected: int
) -> None:
    sim = Sim(GUARD, current=4)
    snapshot = types.SignalSnapshot(in_flight=value(20), p95_latency=p95,
                                    queue_depth=None if waiting is None else value(waiting))
    assert sim.step(0, snapshot) == expected, case


MEMORY_GUARD = policy(signals={"concurrency": {"targetPerReplica": 10},
                               "kvCache": {"targetUtilization": 0.8},
                               "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}})


@pytest.mark.parametrize(
    ("case", "finishing", "kv_used", "expected"),
    [
        # 3 waiting on 4 ready is within what they admit at once when a batch slot or
        # KV-cache room is free; where long answers hold the memory, one enters only when
        # another ends, and the queue's wait is waiting / finishing (Little's law).
        # Concurrency reads 2.3 replicas ((20 + 3) / 10), the cache 4 x used / 0.8, and
        # the push (4 x 2 for p95 9 s) is at most 1.5 x the larger.
        ("1 answer a second ends: the 3 wait 3 s, over the SLO now: 1.5 x 4.25 -> 7",
         1.0, 0.85, 7),
        ("10 answers a second end: 0.3 s, the p95 read is past: no push", 10.0, 0.85, 4),
        ("no completion rate: the queue's wait is unknown, no push", None, 0.85, 4),
        ("a lower cache reading bounds it lower: 1.5 x 3.5 -> 6", 1.0, 0.7, 6),
    ],
)
def test_latency_guard_reads_the_wait_of_a_short_queue(
    case: str, finishing: float | None, kv_used: float, expected: int
) -> None:
    sim = Sim(MEMORY_GUARD, current=4)
    snapshot = types.SignalSnapshot(
        in_flight=value(20), p95_latency=latency(9.0), queue_depth=value(3.0),
        completion_rate=None if finishing is None else value(finishing),
        kv_cache_usage=value(kv_used))
    assert sim.step(0, snapshot) == expected, case
    assert sim.last is not None
    guard = next(s for s in sim.last.signals if s.name == "p95_latency")
    assert ("at the rate answers end" in guard.detail) == (expected > 4), case


def test_latency_guard_does_not_push_a_short_queue_with_nothing_to_bound_it() -> None:
    # Queue pressure and the latency rule only: the short queue waits 3 s, but no capacity
    # signal reads a need to bound the push by, so none (an overloaded queue, beyond 8
    # per ready replica, still pushes: 4 x 2).
    sim = Sim(policy(signals={"queueDepth": {"targetWaitingPerReplica": 8},
                              "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}}),
              current=4)
    snapshot = types.SignalSnapshot(p95_latency=latency(9.0), queue_depth=value(3.0),
                                    completion_rate=value(1.0))
    assert sim.step(0, snapshot) == 4
    assert sim.last is not None
    guard = next(s for s in sim.last.signals if s.name == "p95_latency")
    assert "no capacity signal" in guard.detail
    assert sim.step(5, dataclasses.replace(snapshot, queue_depth=value(40.0))) == 8


def test_rate_limit_pods_per_period() -> None:
    p = policy(behavior={
        "scaleUp": {"stabilizationSeconds": 0,
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 60}]},
        "scaleDown": {"stabilizationSeconds": 0, "policies": []},
    })
    sim = Sim(p, current=1)
    assert sim.step(0, snap(running=200)) == 5
    assert sim.step(30, snap(running=200)) == 5    # 4 added within the last 60 s
    assert sim.step(61, snap(running=200)) == 9
    assert sim.last is not None and sim.last.clamps[0].name == "rate_limit_up"


def test_rate_limit_percent_down() -> None:
    p = policy(behavior={
        "scaleUp": {"stabilizationSeconds": 0, "policies": []},
        "scaleDown": {"stabilizationSeconds": 0,
                      "policies": [{"type": "Percent", "value": 20, "periodSeconds": 60}]},
    })
    sim = Sim(p, current=10)
    assert sim.step(0, snap(running=10)) == 8      # 10 x 0.8
    assert sim.step(30, snap(running=10)) == 8     # period started at 10: floor 8
    assert sim.step(61, snap(running=10)) == 6     # 8 x 0.8 = 6.4 -> 6 (truncated)


def test_scale_to_zero_and_activation_from_first_queued_request() -> None:
    p = policy(replicas={"min": 0, "max": 10})
    sim = Sim(p, current=1)
    assert sim.step(0, snap(running=0, waiting=0)) == 1
    assert sim.step(301, snap(running=0, waiting=0)) == 0
    # No replica: nothing reports in-flight; the gateway's queue alone activates.
    assert sim.step(400, snap(waiting=None)) == 0
    assert sim.step(410, snap(waiting=1)) == 1
    assert sim.last is not None and sim.last.winner == "concurrency"


def test_missing_series_is_not_zero_demand_at_zero() -> None:
    p = policy(replicas={"min": 0, "max": 10})
    sim = Sim(p, current=0)
    assert sim.step(0, snap()) == 0
    assert sim.last is not None and sim.last.held


def test_schedule_floor_switches_on_at_0800_berlin() -> None:
    p = policy(warmFloor={"replicas": 1, "schedules": [
        {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timeZone": "Europe/Berlin",
         "replicas": 4}]})
    sim = Sim(p, current=1)
    # MONDAY_0600_UTC is 07:00 in Berlin (CET, UTC+1).
    assert sim.step(3599, snap(running=0)) == 1      # 07:59:59 Berlin
    assert sim.step(3600, snap(running=0)) == 4      # 08:00 Berlin
    assert sim.last is not None and sim.last.clamps[-1].name == "warm_floor"
    # 20:00 Berlin: the floor ends; after the down window, back to 1.
    assert sim.step(3600 + 12 * 3600 + 301, snap(running=0)) == 1


def test_schedule_floor_not_on_saturday() -> None:
    p = policy(warmFloor={"replicas": 1, "schedules": [
        {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timeZone": "Europe/Berlin",
         "replicas": 4}]})
    saturday_noon_utc = MONDAY_0600_UTC + 5 * 86400 + 6 * 3600
    assert p.spec.warm_floor.at(saturday_noon_utc) == 1
    assert p.spec.warm_floor.at(saturday_noon_utc - 86400) == 4


def test_max_and_budget_cap() -> None:
    p = policy(resources={"gpusPerReplica": 2}, budget={"maxGpus": 8})
    sim = Sim(p, current=1)
    assert sim.step(0, snap(running=500)) == 4
    assert sim.last is not None and sim.last.clamps[-1].name == "budget"
    external = Sim(policy(), current=1)
    assert external.step(0, snap(running=500), budget_gpus=6) == 6
    assert external.step(10, snap(running=500)) == 20   # replicas.max


def test_ramp_is_met_before_it_arrives_with_look_ahead() -> None:
    """Demand grows 0.05 replicas/s; a replica needs 60 s to start.

    Without look-ahead the count only follows demand, so each new replica is ready a
    minute after it was needed; with it, the count leads demand by about 60 s x 0.05 = 3.
    """
    def run(forecast_enabled: bool) -> list[tuple[float, int]]:
        # No tolerance band here: this test measures the look-ahead alone.
        p = policy(forecast={"enabled": forecast_enabled, "windowSeconds": 120},
                   replicas={"min": 1, "max": 40},
                   behavior={**BEHAVIOR, "tolerance": 0.0})
        sim = Sim(p, current=1, ready_after=60)
        out = []
        for t in range(0, 600, 5):
            running = 10 * 0.05 * t           # demand in replicas x 10 per replica
            out.append((t, sim.step(t, snap(running=running))))
        return out

    with_look_ahead = dict(run(True))
    without = dict(run(False))
    for t in range(200, 540, 5):
        needed_when_ready = math.ceil(0.05 * (t + 60))
        assert with_look_ahead[t] >= needed_when_ready, t
        assert without[t] < needed_when_ready, t


def test_look_ahead_reports_its_forecast() -> None:
    p = policy(forecast={"enabled": True, "windowSeconds": 120})
    sim = Sim(p, current=1)
    for t in range(0, 121, 10):
        sim.step(t, snap(running=t))            # +0.1 replicas/s
    assert sim.last is not None and sim.last.forecast is not None
    fc = sim.last.forecast
    assert fc.slope_per_s == pytest.approx(0.1, rel=1e-6)
    assert fc.time_to_ready_s == 60
    assert fc.demand_at_ready == pytest.approx(12 + 6, rel=1e-6)
    # 18 on 16 replicas buys 17, which holds 18 within its 10 % tolerance.
    assert sim.last.desired == 17 and sim.last.winner == "forecast"


def test_node_boot_lengthens_time_to_ready_when_no_gpu_is_free() -> None:
    p = policy(coldStart={"nodeBootSeconds": 300, "imagePullSeconds": 30,
                          "modelLoadSeconds": 20, "readinessSeconds": 10, "learn": False})
    sim = Sim(p, current=1)
    sim.step(0, snap(running=30), free_replica_slots=0)
    assert sim.last is not None and sim.last.forecast is not None
    assert sim.last.forecast.needs_node and sim.last.forecast.time_to_ready_s == 360
    sim.step(5, snap(running=30), free_replica_slots=8)
    assert sim.last.forecast is not None
    assert not sim.last.forecast.needs_node and sim.last.forecast.time_to_ready_s == 60


def test_cold_start_is_learned_from_observed_pod_timelines() -> None:
    p = policy(coldStart={"nodeBootSeconds": 0, "imagePullSeconds": 30,
                          "modelLoadSeconds": 20, "readinessSeconds": 10, "learn": True})
    start = MONDAY_0600_UTC
    # Five starts of 200 s, then five of 100 s (say the image is now cached).
    observations = tuple(
        types.ColdStartObservation(created_at=start + 1000 * i,
                                   ready_at=start + 1000 * i + seconds)
        for i, seconds in enumerate([200] * 5 + [100] * 5)
    )
    decision, state = engine_decide.decide(
        p, snapshot=snap(running=10), cluster=types.ClusterState(
            current=1, ready=1, observations=observations),
        state=types.EngineState(), now=start + 10_000)
    assert decision.forecast is not None
    # The first observation replaces the 60 s default; then each moves it 30 % of the way:
    # 100 + (200 - 100) x 0.7^5.
    assert decision.forecast.time_to_ready_s == pytest.approx(100 + 100 * 0.7**5)
    # Observations already learned are not counted again.
    again, _ = engine_decide.decide(
        p, snapshot=snap(running=10), cluster=types.ClusterState(
            current=1, ready=1, observations=observations),
        state=state, now=start + 10_001)
    assert again.forecast is not None
    assert again.forecast.time_to_ready_s == decision.forecast.time_to_ready_s


def test_decision_carries_every_reason() -> None:
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "tokensPerSecond": {"capacityPerReplica": 1000,
                                            "targetUtilization": 0.5},
                        "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}},
               replicas={"min": 1, "max": 5})
    sim = Sim(p, current=1)
    sim.step(0, snap(running=30, tps=4000, p95=1.0))
    d = sim.last
    assert d is not None
    by_name = {s.name: s for s in d.signals}
    assert by_name["concurrency"].recommendation == 3
    assert by_name["tokens_per_second"].recommendation == 8
    assert by_name["p95_latency"].recommendation is None
    assert d.winner == "tokens_per_second" and d.recommendation == 8
    assert [(c.name, c.before, c.after) for c in d.clamps] == [("max", 8, 5)]
    assert d.desired == 5
    assert "scale up 1->5 (tokens_per_second)" in d.summary


def test_prompt_tokens_count_as_replica_time() -> None:
    p = policy(signals={"tokensPerSecond": {"capacityPerReplica": 2400,
                                            "promptCapacityPerReplica": 25000,
                                            "targetUtilization": 0.8}})
    sim = Sim(p, current=1)
    snapshot = types.SignalSnapshot(
        tokens_per_second=value(2000),
        prompt_tokens_per_second=value(60000))
    # (2000 / 2400 + 60000 / 25000) / 0.8 = 4.04 -> 5; generated tokens alone say 2. The
    # rise from 1 buys 4, which holds 4.04 within its 10 % tolerance.
    assert sim.step(0, snapshot) == 4
    assert sim.last is not None and sim.last.signals[0].recommendation == 5


KV_POLICY = {"tokensPerSecond": {"capacityPerReplica": 6000, "targetUtilization": 0.8},
             "kvCache": {"targetUtilization": 0.8}}


def test_a_filling_kv_cache_sizes_by_memory_not_compute() -> None:
    # Long prompts with long answers: 5 replicas decode 14,400 tok/s, 3 replicas of
    # compute at 0.8, but their caches are 90 % full: 5 x 0.9 / 0.8 = 5.6 -> 6.
    sim = Sim(policy(signals=KV_POLICY), current=5)
    snapshot = types.SignalSnapshot(tokens_per_second=value(14_400), kv_cache_usage=value(0.9))
    assert sim.step(0, snapshot) == 6
    assert sim.last is not None and sim.last.winner == "kv_cache"
    kv = next(s for s in sim.last.signals if s.name == "kv_cache")
    assert kv.recommendation == 6 and "90% of the KV cache" in kv.detail
    # The same work on empty caches: compute decides, and the cache has no say.
    sim = Sim(policy(signals=KV_POLICY), current=5)
    assert sim.step(0, types.SignalSnapshot(tokens_per_second=value(14_400),
                                            kv_cache_usage=value(0.3))) == 5
    # No ready replica, no cache to read: no opinion (it cannot scale from zero).
    sim = Sim(policy(signals=KV_POLICY), current=0)
    sim.step(0, types.SignalSnapshot(tokens_per_second=value(0), kv_cache_usage=value(0.9)))
    assert sim.last is not None
    kv = next(s for s in sim.last.signals if s.name == "kv_cache")
    assert kv.recommendation is None


def test_a_replica_just_ready_is_not_read_into_the_old_caches_mean() -> None:
    # 2 replicas at 95 % of their caches and a third just ready, not yet reporting: the
    # mean is still the two old ones', 2 x 0.95 / 0.8 = 2.4 replicas of memory, not
    # 3 x 0.95 / 0.8 = 3.6 (which bought a fourth the moment the third arrived).
    sim = Sim(policy(signals=KV_POLICY), current=3)
    full = types.SignalSnapshot(tokens_per_second=value(9_000), kv_cache_usage=value(0.95))
    now = MONDAY_0600_UTC + 600
    just_ready = (types.ColdStartObservation(created_at=now - 110, ready_at=now - 2),)
    assert sim.step(600, full, observations=just_ready) == 3
    kv = next(s for s in sim.last.signals if s.name == "kv_cache") if sim.last else None
    assert kv is not None and kv.recommendation == 3
    assert "2 ready x 95%" in kv.detail and "1 more ready for less than 15 s" in kv.detail
    # Once it has been ready for the report interval, the mean is all three's again.
    settled = (types.ColdStartObservation(created_at=now - 130, ready_at=now - 20),)
    assert sim.step(620, full, observations=settled) == 4
    # Every ready replica new (the first ones after zero): the mean is theirs.
    sim = Sim(policy(signals=KV_POLICY), current=2)
    fresh = tuple(types.ColdStartObservation(created_at=now - 100, ready_at=now - 1)
                  for _ in range(2))
    assert sim.step(600, full, observations=fresh) == 3


def test_a_full_kv_cache_on_a_backlog_is_held_to_the_load() -> None:
    # Every replica that works a backlog off fills its cache, so the cache reads ready /
    # target whatever the load: 6 ready at 100 % read 7.5, then 8 ready read 10, and so
    # on. Held to load + draining like the other backlog readings, it buys nothing more.
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2},
                        "kvCache": {"targetUtilization": 0.8}})
    sim = Sim(p, current=1)
    _overload_then_drain(sim)
    assert sim.current == 6
    _work_the_backlog_off(sim, kv_cache_usage=value(1.0))
    assert sim.last is not None
    kv = next(s for s in sim.last.signals if s.name == "kv_cache")
    assert kv.recommendation is not None and kv.recommendation <= 6
    assert "held to load" in kv.detail


def test_configured_prompt_tokens_missing_holds() -> None:
    p = policy(signals={"tokensPerSecond": {"capacityPerReplica": 2400,
                                            "promptCapacityPerReplica": 25000}})
    sim = Sim(p, current=6)
    generated_only = types.SignalSnapshot(tokens_per_second=value(100))
    for t in (0, 400, 800):
        assert sim.step(t, generated_only) == 6
    assert sim.last is not None and sim.last.held
    assert "prompt tokens/s missing" in sim.last.signals[0].detail


def test_noisy_demand_gets_no_look_ahead_but_a_ramp_does() -> None:
    """Fluctuating demand has a slope within its error: no look-ahead is added."""
    p = policy(forecast={"enabled": True, "windowSeconds": 120}, replicas={"min": 1, "max": 40})
    noisy = Sim(p, current=10)
    for t in range(0, 300, 2):
        wobble = 20 if (t // 2) % 3 == 0 else -10     # +-2 replicas, no trend
        noisy.step(t, snap(running=100 + wobble))
        assert noisy.last is not None and noisy.last.forecast is not None
        if t >= 60:
            assert noisy.last.forecast.slope_per_s == 0.0, t


def test_a_rise_buys_the_count_whose_tolerance_holds_the_reading() -> None:
    # 9.5 replicas of demand on 8: 9 hold it within 10 %, so 9 are bought, not the
    # ceiling 10 that the down window would then hold for 300 s.
    sim = Sim(policy(), current=8)
    assert sim.step(0, snap(running=95)) == 9
    assert sim.last is not None
    assert "concurrency at 9.50 replicas is within 10% of 9: 9 bought, not 10" \
        in sim.last.notes
    assert {sim.step(t, snap(running=95)) for t in range(5, 400, 5)} == {9}
    # Beyond 9's tolerance (9.95 > 9.9) the ceiling is bought. A rise of one replica is
    # the ceiling anyway (its reading is beyond the current count's tolerance), and
    # within that tolerance nothing moves.
    assert Sim(policy(), current=8).step(0, snap(running=99.5)) == 10
    assert Sim(policy(), current=9).step(0, snap(running=99.5)) == 10
    assert Sim(policy(), current=9).step(0, snap(running=95.5)) == 9
    # The KV cache asking for the ceiling keeps it: memory's margin is not compute's.
    # 10 ready at 99 % of their caches read 10 x 0.99 / 0.8 = 12.4 replicas: 13.
    kv = Sim(policy(signals=KV_POLICY), current=10)
    reading = types.SignalSnapshot(tokens_per_second=value(11.5 * 4800),
                                   kv_cache_usage=value(0.99))
    assert kv.step(0, reading) == 13


def test_look_ahead_is_not_extrapolated_past_its_history() -> None:
    """A rising edge seen for 70 s is projected at most 70 s ahead, even with a 360 s start."""
    p = policy(forecast={"enabled": True, "windowSeconds": 120}, replicas={"min": 1, "max": 200},
               coldStart={"nodeBootSeconds": 300, "imagePullSeconds": 30,
                          "modelLoadSeconds": 20, "readinessSeconds": 10, "learn": False})
    sim = Sim(p, current=1)
    for t in range(0, 71, 5):
        sim.step(t, snap(running=10 * 0.1 * t), free_replica_slots=0)   # +0.1 replicas/s
    fc = sim.last.forecast if sim.last else None
    assert fc is not None and fc.time_to_ready_s == 360
    assert fc.demand_at_ready == pytest.approx(7 + 0.1 * 70)


def test_tolerance_band_stops_boundary_flapping() -> None:
    """Demand hovering around 5 to 5.4 replicas at 5 replicas: within 10 %, nothing moves."""
    p = policy(behavior={**BEHAVIOR, "scaleDown": {"stabilizationSeconds": 0, "policies": []}})
    sim = Sim(p, current=5)
    for t, running in [(0, 52), (10, 48), (20, 54), (30, 47), (40, 51)]:
        assert sim.step(t, snap(running=running)) == 5, t
    assert sim.last is not None and "within 10% of 5" in sim.last.notes[0]
    # Beyond the band it moves: 5.6 replicas of demand -> 6; 4.4 -> 5 ... 3.9 -> 4.
    assert sim.step(50, snap(running=56)) == 6
    assert sim.step(60, snap(running=39)) == 4
    # Without the band the same wobble moves the count every time.
    loose = Sim(policy(behavior={**BEHAVIOR, "tolerance": 0.0,
                                 "scaleDown": {"stabilizationSeconds": 0, "policies": []}}),
                current=5)
    assert [loose.step(t, snap(running=r)) for t, r in [(0, 52), (10, 48), (20, 54)]] == [
        6, 5, 6]


def test_tolerance_is_judged_on_the_largest_reading_of_the_count() -> None:
    # Tokens/s reads 2.02 replicas (within 10 % of 2), the KV cache 2 x 0.9 / 0.8 = 2.25
    # (beyond it): both round to 3. Which one is named must not decide: memory wants 3.
    sim = Sim(policy(signals=KV_POLICY), current=2)
    snapshot = types.SignalSnapshot(tokens_per_second=value(9_700), kv_cache_usage=value(0.9))
    assert sim.step(0, snapshot) == 3
    assert sim.last is not None and sim.last.winner == "kv_cache"
    # Both within the band: nothing moves.
    sim = Sim(policy(signals=KV_POLICY), current=2)
    assert sim.step(0, types.SignalSnapshot(tokens_per_second=value(9_700),
                                            kv_cache_usage=value(0.85))) == 2
    # The look-ahead too: concurrency climbs to 9.5 replicas on 9 (within the band) and
    # reads 9.95 one pod start ahead (beyond it); both round to 10.
    ramp = Sim(policy(forecast={"enabled": True, "windowSeconds": 120}), current=9)
    counts = [ramp.step(t, snap(running=10 * (8.6 + 0.0075 * t))) for t in range(0, 121, 2)]
    assert counts[-1] == 10 and counts[:50] == [9] * 50
    up = next(t for t, c in zip(range(0, 121, 2), counts, strict=True) if c == 10)
    assert 110 < up < 120  # when the look-ahead passes 9.9, while the signal reads 9.4


TOKENS = {"tokensPerSecond": {"capacityPerReplica": 6000, "targetUtilization": 0.8}}
PER_REPLICA_TPS = 6000 * 0.8  # tokens/s of one replica of demand


def _wobble(sim: Sim, *, until: int, readings: tuple[float, ...] = (2.15, 1.95, 2.05, 1.9)
            ) -> list[int]:
    """Tokens/s reading `readings` replicas of demand in turn, one every 5 s."""
    return [sim.step(t, snap(tps=readings[(t // 5) % len(readings)] * PER_REPLICA_TPS))
            for t in range(0, until, 5)]


def test_the_down_window_holds_the_count_the_tolerance_keeps() -> None:
    # A 1,500-token answer load reads 1.9 to 2.15 replicas on 3. Its readings past 2.0
    # round up to 3, yet 2 replicas hold every one of them within the 10 % tolerance: the
    # down window remembers 2, so the third goes after the 300 s window and 2 stay.
    sim = Sim(policy(signals=TOKENS), current=3)
    counts = _wobble(sim, until=700)
    assert counts[:60] == [3] * 60  # the window seeded with the 3 at the first decision
    assert counts[60:] == [2] * (len(counts) - 60)
    early = Sim(policy(signals=TOKENS), current=3)
    _wobble(early, until=45)  # the last reading 2.15, on 3
    assert early.last is not None and early.last.recommendation == 3
    assert "tokens_per_second at 2.15 replicas would not raise 2: the down window holds 2" \
        in early.last.notes
    # Readings 2 would not hold keep 3: 2.3 is beyond 2's tolerance, and with no queue
    # reading strain is unknown, so the utilisation margin does not hold it either.
    wider = Sim(policy(signals=TOKENS), current=3)
    assert set(_wobble(wider, until=700, readings=(2.3, 1.95, 2.3, 1.9))) == {3}
    # A down window shorter than a pod start (60 s here) keeps what a rise bought: the
    # third replica bought for 2.3 would otherwise go, for readings of 2.15 that 2 hold,
    # after 30 s, before it is ready.
    short = {**BEHAVIOR, "scaleDown": {"stabilizationSeconds": 30, "policies": []}}
    quick = Sim(policy(signals=TOKENS, behavior=short), current=1)
    assert quick.step(0, snap(tps=2.3 * PER_REPLICA_TPS)) == 3
    assert {quick.step(t, snap(tps=2.15 * PER_REPLICA_TPS)) for t in range(5, 200, 5)} == {3}


def test_no_release_while_demand_climbs() -> None:
    # A square wave whose off phase ends as the down window does: 2 replicas for a load of
    # 1.4, nothing for 300 s, then the load climbs back. The window would release the
    # second replica at the first reading of the load's return.
    sim = Sim(policy(signals=TOKENS), current=2)
    for t in range(0, 101, 5):
        assert sim.step(t, snap(tps=1.4 * PER_REPLICA_TPS)) == 2
    for t in range(105, 400, 5):
        assert sim.step(t, snap(tps=0.0)) == 2
    climb = [sim.step(t, snap(tps=share * 1.4 * PER_REPLICA_TPS))
             for t, share in zip(range(400, 440, 5), (0.04, 0.2, 0.45, 0.7, 0.9, 1, 1, 1),
                                 strict=True)]
    assert climb == [2] * 8
    # Flat again: the load needs the 2 (1.4 replicas), and they are held as its own.
    assert sim.step(500, snap(tps=1.4 * PER_REPLICA_TPS)) == 2
    # A load that stays away is released: no climb, the window has passed.
    away = Sim(policy(signals=TOKENS), current=2)
    for t in range(0, 101, 5):
        away.step(t, snap(tps=1.4 * PER_REPLICA_TPS))
    assert [away.step(t, snap(tps=0.0)) for t in range(105, 420, 5)][-1] == 1


TOKENS_AND_QUEUE = {"tokensPerSecond": {"capacityPerReplica": 6000,
                                        "promptCapacityPerReplica": 25000},
                    "queueDepth": {"targetWaitingPerReplica": 8}}


def load(*, rate: float, waiting: float, prompt: float, generated: float | None = None
         ) -> types.SignalSnapshot:
    return types.SignalSnapshot(
        arrival_rate=value(rate), queue_depth=value(waiting),
        tokens_per_second=value(rate * 200 if generated is None else generated),
        prompt_tokens_per_second=value(prompt))


def test_load_per_request_is_learned_unsaturated_and_used_saturated() -> None:
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    sim = Sim(p, current=2)
    # 5 req/s of 2,000-token prompts: (1,000 / 6,000 + 10,000 / 25,000) / 0.8 = 0.71
    # replicas, i.e. 0.142 replicas per req/s.
    for t in range(0, 60, 2):
        sim.step(t, load(rate=5, waiting=0, prompt=10_000))
    learned = sim.state.replicas_per_request_rate
    assert learned == pytest.approx(0.7083 / 5, rel=1e-3)
    # Saturated: 40 req/s arrive, but 2 replicas serve only 40,000 prompt and 2,000
    # generated tokens/s and 600 wait. Throughput says (0.33 + 1.6) / 0.8 = 2.4 -> 3
    # replicas; the arrival rate says 40 x 0.142 = 5.7 -> 6.
    sim.step(60, load(rate=40, waiting=600, prompt=40_000, generated=2000))
    assert sim.state.replicas_per_request_rate == learned     # not learned from overload
    assert sim.last is not None
    by_name = {s.name: s.recommendation for s in sim.last.signals}
    assert by_name["tokens_per_second"] == 3 and by_name["arrival_rate"] == 6


def test_backlog_boots_no_node_that_would_arrive_after_it_drained() -> None:
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40},
               coldStart={"nodeBootSeconds": 300, "imagePullSeconds": 30,
                          "modelLoadSeconds": 20, "readinessSeconds": 10, "learn": False})
    state = types.EngineState(replicas_per_request_rate=0.127, last_desired=8)
    now = MONDAY_0600_UTC
    # 1 ready, 7 starting, no free GPU; 3,000 waiting at 40 req/s: the 8 replicas on hand
    # carry 40 x 0.127 = 5.1 and drain the rest in 2 x 3,000 / ((8 / 0.8 - 5.1) / 0.127)
    # = 156 s, before a node (300 + 60 s) could help. The queue alone would ask for 375.
    cluster = types.ClusterState(current=8, ready=1, starting=(now - 30,) * 7,
                                 free_replica_slots=0)
    decision, _ = engine_decide.decide(
        p, snapshot=load(rate=40, waiting=3000, prompt=50_000), cluster=cluster,
        state=state, now=now)
    assert decision.desired == 8
    assert [c.name for c in decision.clamps][:1] == ["backlog"]
    assert decision.forecast is not None and decision.forecast.replicas_at_node_ready <= 8
    # A step the replicas on hand cannot carry (400 req/s -> 51 replicas) is not held.
    big, _ = engine_decide.decide(
        p, snapshot=load(rate=400, waiting=3000, prompt=50_000), cluster=cluster,
        state=state, now=now)
    assert big.desired > 8 and "backlog" not in [c.name for c in big.clamps]
    # The spare drains at full speed: at 55 req/s the 8 on hand carry 6.99 replicas of
    # load at the 0.8 target but 10 flat out, so 3,000 waiting drain in 2 x 3,000 /
    # ((10 - 6.99) / 0.127) = 253 s, before a node. Counted at the target (8 - 6.99)
    # it would read 755 s and boot one for replicas that come after the queue is gone.
    peak, _ = engine_decide.decide(
        p, snapshot=load(rate=55, waiting=3000, prompt=50_000), cluster=cluster,
        state=state, now=now)
    assert peak.desired == 8
    assert [c.name for c in peak.clamps][:1] == ["backlog"]
    assert peak.clamps[0].detail.startswith(
        "8 replicas (ready, starting, on free GPUs) carry 10 flat out; 55 req/s need 6.99, "
        "so 3000 waiting drain in about 253 s, before a node could boot (360 s)")
    # Free GPUs count: 2 ready and room for 6 more on GPUs already free carry 5.1 at 40
    # req/s and drain the rest flat out within a pod start of their own, so the count
    # fills the free GPUs (8) and boots no node for the queue.
    roomy = types.ClusterState(current=2, ready=2, free_replica_slots=6)
    filled, _ = engine_decide.decide(
        p, snapshot=load(rate=40, waiting=3000, prompt=50_000), cluster=roomy,
        state=dataclasses.replace(state, last_desired=2), now=now)
    assert filled.desired == 8
    assert [c.name for c in filled.clamps][:1] == ["backlog"]
    # Past what they carry flat out (80 req/s x 0.127 = 10.2 > 10), a node is booted.
    past, _ = engine_decide.decide(
        p, snapshot=load(rate=80, waiting=3000, prompt=50_000), cluster=cluster,
        state=state, now=now)
    assert past.desired > 8 and "backlog" not in [c.name for c in past.clamps]
    # Without an arrival rate nothing is capped (no evidence of what the load is).
    blind, _ = engine_decide.decide(
        p, snapshot=dataclasses.replace(load(rate=40, waiting=3000, prompt=50_000),
                                        arrival_rate=None),
        cluster=cluster, state=state, now=now)
    assert blind.desired > 8


@pytest.mark.parametrize(("headroom", "running", "expected"), [
    ({}, 20, 2),                                    # none: the load's 2 replicas
    ({"replicas": 1}, 20, 3),                       # one spare replica
    ({"fraction": 0.5}, 20, 3),                     # 2 x 1.5
    ({"fraction": 0.25, "replicas": 1}, 32, 5),     # 3.2 x 1.25 + 1 = 5
])
def test_headroom_is_spare_capacity_on_the_capacity_demand(
    headroom: dict[str, float], running: float, expected: int
) -> None:
    sim = Sim(policy(headroom=headroom), current=1)
    assert sim.step(0, snap(running=running)) == expected


def test_headroom_rides_on_capacity_not_on_the_queue_guard() -> None:
    p = policy(headroom={"replicas": 2},
               signals={"concurrency": {"targetPerReplica": 100},
                        "queueDepth": {"targetWaitingPerReplica": 1}})
    sim = Sim(p, current=1)
    # concurrency 0.1 -> 1 + 2 spare = 3; the queue's 5 (5 waiting / 1) wins as it is.
    assert sim.step(0, snap(running=5, waiting=5)) == 5
    assert sim.last is not None and sim.last.winner == "queue_depth"


def test_a_step_is_not_extrapolated_as_a_ramp() -> None:
    # Demand jumps from 2 to 6 replicas' worth and stays: the line through the window has
    # a slope, the two levels explain it better, and the flat level after the step has
    # none, so the look-ahead adds nothing through the time to ready.
    p = policy(forecast={"enabled": True, "windowSeconds": 120})
    sim = Sim(p, current=2)
    for t in range(0, 121, 2):
        running = 20 if t < 60 else 60
        sim.step(t, snap(running=running + (t % 3) * 0.5))   # a little noise
    assert sim.last is not None and sim.last.forecast is not None
    assert sim.last.forecast.slope_per_s == 0.0
    assert sim.last.desired == 6   # 60 / 10: the level, not a projection
    # A steady ramp over the same window keeps its slope.
    ramp = Sim(p, current=2)
    for t in range(0, 121, 2):
        ramp.step(t, snap(running=20 + t / 3 + (t % 3) * 0.5))
    assert ramp.last is not None and ramp.last.forecast is not None
    assert ramp.last.forecast.slope_per_s > 0.02


def test_a_step_seen_through_a_smoothing_window_is_not_extrapolated_once_it_holds() -> None:
    # A step as a windowed estimate shows it (a 30 s rate or flow fit): flat at 8 running
    # for 60 s, a 36 s ramp to 68, then a plateau with noise. Once the level before the
    # step has mostly left the 120 s window the line fits as well as two levels, but the
    # last 30 s are flat: no trend is left to extrapolate through the time to ready.
    p = policy(forecast={"enabled": True, "windowSeconds": 120}, replicas={"min": 1, "max": 40})
    sim = Sim(p, current=1)

    def demand(t: int) -> float:
        if t < 60:
            return 8.0
        if t < 96:
            return 8.0 + 60.0 * (t - 60) / 36
        return 68.0 + (3.0 if (t // 2) % 2 else -3.0)

    slopes, planned, held = [], [], []
    for t in range(0, 181, 2):
        sim.step(t, snap(running=demand(t)))
        assert sim.last is not None and sim.last.forecast is not None
        if t >= 130:  # the plateau has filled the last 30 s
            slopes.append(sim.last.forecast.slope_per_s)
            planned.append(sim.last.forecast.replicas_at_ready)
            if sim.last.forecast.recent:  # and the decision says why
                step = next(s for s in sim.last.steps
                            if s.name is types.StepName.LOOK_AHEAD)
                held.append("the trend held to its last 30 s" in step.detail)
    # Without the recent bound: up to 0.06 replicas/s, 11 replicas planned for 7.1.
    assert max(slopes) < 0.02, slopes
    assert max(planned) <= 9, planned
    assert held and all(held), held
    # A ramp still rising in its last 30 s keeps its slope (0.05 replicas/s, less the
    # error of the whole window's fit).
    ramp = Sim(p, current=2)
    for t in range(0, 121, 2):
        ramp.step(t, snap(running=20 + 0.5 * t + (3.0 if (t // 2) % 2 else -3.0)))
    assert ramp.last is not None and ramp.last.forecast is not None
    assert ramp.last.forecast.slope_per_s > 0.04


def test_the_look_ahead_trusts_less_of_a_trend_that_did_not_come_true() -> None:
    p = policy(forecast={"enabled": True, "windowSeconds": 120})
    sim = Sim(p, current=2)
    # A ramp of 0.05 replicas/s for 120 s: the forecast lifts demand 60 s ahead ...
    for t in range(0, 121, 2):
        sim.step(t, snap(running=20 + 0.5 * t))
    assert sim.last is not None and sim.last.forecast is not None
    first = sim.last.forecast
    assert first.horizon_scale == 1.0 and first.demand_at_ready > first.demand_now + 2
    # ... but demand stops where it was: when the forecast comes due it realized nothing.
    for t in range(122, 200, 2):
        sim.step(t, snap(running=80))
    assert sim.state.horizon_scale == pytest.approx(0.5)
    # The next ramp is extrapolated with half its slope at first, and regains the trust
    # as its forecasts come true.
    lifted = []
    for t in range(200, 460, 2):
        sim.step(t, snap(running=80 + 0.5 * (t - 200)))
        fc = sim.last.forecast
        if fc is not None and fc.slope_per_s > 0:
            lifted.append(fc)
    assert lifted[0].horizon_scale == pytest.approx(0.5)
    assert lifted[0].demand_at_ready == pytest.approx(
        lifted[0].demand_now + 0.5 * lifted[0].slope_per_s * lifted[0].time_to_ready_s)
    assert lifted[-1].horizon_scale > 0.9


def _learned_at_10_req_s() -> Sim:
    """One replica at 10 req/s with 10 in flight: 0.1 replicas per req/s learned."""
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=1)
    for t in range(0, 40, 2):
        sim.step(t, types.SignalSnapshot(in_flight=value(10), queue_depth=value(0),
                                         arrival_rate=value(10), completion_rate=value(10)))
    assert sim.state.replicas_per_request_rate == pytest.approx(0.1)
    return sim


def _step_to_44(shared: float) -> types.SignalSnapshot:
    """A step to 44 req/s: the replica finishes 13/s, 830 wait, `shared` of them in a
    work queue."""
    return types.SignalSnapshot(in_flight=value(20), queue_depth=value(830),
                                arrival_rate=value(44), completion_rate=value(13),
                                shared_waiting=value(shared) if shared else None)


def test_at_a_step_the_backlog_is_sized_as_load_plus_drain_not_as_load() -> None:
    # Unsaturated: 10 req/s keep 10 in flight on 1 replica -> 0.1 replicas per req/s.
    sim = _learned_at_10_req_s()
    # A step to 44 req/s: 830 wait behind the replica. The queue reads 415 replicas and
    # concurrency 85; the load is 4.4 and draining 830 in 60 + 60 s takes 0.69 more.
    step = types.SignalSnapshot(in_flight=value(20), queue_depth=value(830),
                                arrival_rate=value(44))
    assert sim.step(40, step) == 6
    assert sim.last is not None
    queue = next(s for s in sim.last.signals if s.name == "queue_depth")
    assert queue.recommendation == 6 and "draining 830 waiting" in queue.detail


@pytest.mark.parametrize(("shared", "free", "expected"), [
    # 830 waiting at the replica that holds them (vLLM's queue): new replicas take the
    # new arrivals and drain none of it; sized as the test above.
    (0.0, 7, 6),
    # The same 830 in a JetStream work queue: a pod started now is ready in 60 s and
    # finds 830 + (44 - 13) x 60 = 2,690 waiting; draining them in 60 s takes 4.48 more
    # than the load's 4.4: 8.9, bought as far as the 8 that fit on free GPUs.
    (830.0, 7, 8),
    (830.0, 20, 9),
    # No GPU known to be free: a node boot away, those replicas would arrive after the
    # queue they were bought for; the count is sized as for a replica's own queue.
    (830.0, None, 6),
])
def test_a_shared_queue_is_drained_by_the_replicas_a_step_buys(
        shared: float, free: int | None, expected: int) -> None:
    sim = _learned_at_10_req_s()
    assert sim.step(40, _step_to_44(shared), free_replica_slots=free) == expected
    assert sim.last is not None
    queue = next(s for s in sim.last.signals if s.name == "queue_depth")
    assert ("the shared queue" in queue.detail) == (shared > 0)
    if shared:
        assert "2690 when a pod started now is ready in 60 s" in queue.detail


def test_replicas_starting_take_their_share_of_a_shared_queue() -> None:
    # As above, 830 waiting in a work queue with 7 free GPUs, but 3 replicas started 30 s
    # ago: ready in 30 s, they take 3 x 10 req/s for the last 30 s of the 60, so a pod
    # started now finds 2,690 - 900 = 1,790, and draining them asks 4.4 + 2.98 = 7.4.
    sim = _learned_at_10_req_s()
    now = sim.start + 40
    sim.current = 4
    # Without them counted the same queue asks 8.9: 9.
    assert sim.step(40, _step_to_44(830.0), ready=1, starting=(now - 30,) * 3,
                    free_replica_slots=10) == 8
    assert sim.last is not None
    queue = next(s for s in sim.last.signals if s.name == "queue_depth")
    assert "1790 when a pod started now is ready" in queue.detail
    assert "asks 7.38" in queue.detail


def test_without_a_reported_arrival_rate_flow_balance_estimates_it() -> None:
    # Replicas report only what they see: finished requests/s, waiting and running.
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=1)
    for t in range(0, 40, 2):   # steady: 10 finish per second, 10 in flight, none waiting
        sim.step(t, types.SignalSnapshot(in_flight=value(10), queue_depth=value(0),
                                         completion_rate=value(10)))
    assert sim.state.replicas_per_request_rate == pytest.approx(0.1)
    # A step: the replica still finishes 13/s, the queue grows 30/s, so 43 req/s arrive.
    for t in range(40, 71, 2):
        waiting = 30.0 * (t - 40)
        desired = sim.step(t, types.SignalSnapshot(
            in_flight=value(20), queue_depth=value(waiting), completion_rate=value(13)))
    assert sim.last is not None
    load = next(s for s in sim.last.steps if s.name == "load")
    assert "flow balance" in load.detail and "43 req/s" in load.detail
    # 43 x 0.1 = 4.3 replicas + draining 900 waiting in 120 s (0.75): 6, where the queue
    # alone read 450 and concurrency 92.
    assert desired == 6


def _overload_then_drain(sim: Sim) -> None:
    """10 req/s steady, a step that queues 30/s more for 30 s (flow balance: 43 req/s)."""
    for t in range(0, 40, 2):
        sim.step(t, types.SignalSnapshot(in_flight=value(10), queue_depth=value(0),
                                         completion_rate=value(10)))
    for t in range(40, 71, 2):
        sim.step(t, types.SignalSnapshot(in_flight=value(20), queue_depth=value(30.0 * (t - 40)),
                                         completion_rate=value(13)))


def _work_the_backlog_off(sim: Sim, **extra: types.SignalValue) -> None:
    """After `_overload_then_drain`: the 900 waiting are admitted and finish at 63/s (43
    arriving + 20 of the backlog); the count must stay at the 6 the load needs."""
    for t in range(72, 110, 2):
        running = 920.0 - 20.0 * (t - 72)
        desired = sim.step(t, types.SignalSnapshot(
            in_flight=value(running), queue_depth=value(0), completion_rate=value(63),
            **extra))
        assert desired <= 6, (t, running)


def test_a_draining_backlog_is_not_read_as_load() -> None:
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=1)
    _overload_then_drain(sim)
    assert sim.current == 6
    # The replicas arrive and work the backlog off: 900 waiting are admitted at once, the
    # queue is empty and the running count falls 20 a second as they finish 63/s (43
    # arriving + 20 of the backlog). Concurrency reads 920 / 10 = 92 replicas; the load
    # is 43 x 0.1 = 4.3, and the count must not buy the 92.
    _work_the_backlog_off(sim)
    assert sim.last is not None
    load = next(s for s in sim.last.steps if s.name == "load")
    assert "draining a backlog" in load.detail
    concurrency = next(s for s in sim.last.signals if s.name == "concurrency")
    assert concurrency.recommendation is not None and concurrency.recommendation <= 6


# Running requests, waiting ones and tokens/s, each replica 10, 2 and 1,000 at full speed.
BACKLOG_SIGNALS = {"concurrency": {"targetPerReplica": 10},
                   "queueDepth": {"targetWaitingPerReplica": 2},
                   "tokensPerSecond": {"capacityPerReplica": 1000, "targetUtilization": 1.0}}


def test_the_down_window_forgets_what_draining_a_backlog_took() -> None:
    # A gateway reports 10 req/s, then 73 (60/s more queue). tokens/s of replicas working
    # off the backlog reads their full speed (9,300 tok/s = 10 replicas): held to load +
    # draining like the other backlog readings. Once the backlog is gone (running back at
    # 73 req/s), the count goes to the load at once: the 300 s window remembers the load
    # of the overload and the drain, not the 9 that drained it.
    p = policy(signals=BACKLOG_SIGNALS)
    sim = Sim(p, current=1)

    def at(t: int, *, running: float, waiting: float, rate: float, done: float,
           tokens: float) -> int:
        return sim.step(t, types.SignalSnapshot(
            in_flight=value(running), queue_depth=value(waiting), arrival_rate=value(rate),
            completion_rate=value(done), tokens_per_second=value(tokens)))

    for t in range(0, 40, 2):
        at(t, running=10, waiting=0, rate=10, done=10, tokens=1000)
    for t in range(40, 71, 2):
        at(t, running=20, waiting=60.0 * (t - 40), rate=73, done=13, tokens=1300)
    held = sim.current
    assert held >= 9
    for t in range(72, 110, 2):
        running = 1820.0 - 40.0 * (t - 72)
        assert at(t, running=running, waiting=0, rate=73, done=93, tokens=9300) == held
        assert sim.last is not None
        tokens = next(s for s in sim.last.signals if s.name == "tokens_per_second")
        assert tokens.recommendation is not None and tokens.recommendation <= held
    for t in range(110, 130, 2):
        at(t, running=73, waiting=0, rate=73, done=73, tokens=7300)
    # 73 req/s: 7.3 replicas by what runs, 6.8 by the load learned at 10 req/s.
    assert sim.current in (7, 8)
    assert sim.last is not None
    assert not any(c.name == "stabilization_down" for c in sim.last.clamps)


def test_the_down_window_keeps_the_count_the_tolerance_holds_of_a_backlogs_load() -> None:
    # A gateway reports 10 req/s, then 43 (30/s more queue). What the window remembers of
    # the overload and its drain is the load: 43 req/s at the load of a request learned
    # at 10 req/s, 4.07 replicas, within 10 % of 4, so 4, as a rise to that reading buys
    # and the tolerance then holds (as it holds the 4.3 read once the drain is over).
    # Remembered as ceil(4.07) = 5, the fifth replica stayed a down window after the drain.
    p = policy(signals=BACKLOG_SIGNALS)
    sim = Sim(p, current=1)

    def at(t: int, *, running: float, waiting: float, done: float, tokens: float) -> int:
        return sim.step(t, types.SignalSnapshot(
            in_flight=value(running), queue_depth=value(waiting), arrival_rate=value(43.0
            if t >= 40 else 10.0), completion_rate=value(done),
            tokens_per_second=value(tokens)))

    for t in range(0, 40, 2):
        at(t, running=10, waiting=0, done=10, tokens=1000)
    for t in range(40, 71, 2):
        at(t, running=20, waiting=30.0 * (t - 40), done=13, tokens=1300)
    assert sim.current >= 5
    for t in range(72, 100, 2):  # the drain: the backlog's readings, held to load
        at(t, running=900.0 - 30.0 * (t - 72), waiting=0, done=73, tokens=7300)
    # The load alone: 4.3 replicas, held by 4 once a drain time (pod start + 60 s) has
    # passed since the overload, long before the overload's readings leave the window.
    for t in range(100, 240, 2):
        at(t, running=43, waiting=0, done=43, tokens=4300)
    assert sim.current == 4
    assert all(r.load is None or r.load <= 4 for r in sim.state.recommendations)


def test_a_falling_load_without_an_overload_is_load() -> None:
    # The running count falls as fast, but nothing queued before: the load itself fell
    # and the count follows the concurrency it reads, not a learned rate.
    p = policy(signals={"concurrency": {"targetPerReplica": 10},
                        "queueDepth": {"targetWaitingPerReplica": 2}})
    sim = Sim(p, current=8)
    for t in range(0, 40, 2):
        sim.step(t, types.SignalSnapshot(in_flight=value(80), queue_depth=value(0),
                                         completion_rate=value(80)))
    for t in range(40, 70, 2):
        running = 80.0 - 2.0 * (t - 40)
        sim.step(t, types.SignalSnapshot(in_flight=value(running), queue_depth=value(0),
                                         completion_rate=value(running)))
    assert sim.last is not None
    load = next(s for s in sim.last.steps if s.name == "load")
    assert "draining" not in load.detail
    assert all(s.name != "arrival_rate" for s in sim.last.signals)


def _square(sim: Sim, *, start: int, on_s: int, off_s: int | list[int], cycles: int
            ) -> list[tuple[int, int]]:
    """A square wave of running requests (80 on, 20 off); the count at each 5 s step.
    `off_s` a list: each cycle's off phase in turn (returns that jitter)."""
    offs = off_s if isinstance(off_s, list) else [off_s]
    counts = []
    begin = start
    for cycle in range(cycles):
        off = offs[cycle % len(offs)]
        for t in range(begin, begin + on_s + off, 5):
            running = 80.0 if t < begin + on_s else 20.0
            counts.append((t, sim.step(t, snap(running=running))))
        begin += on_s + off
    return counts


def test_restart_aware_plans_a_return_that_keeps_coming() -> None:
    # 80 running on for 300 s, 20 for 400 s; 10 per replica: 8 replicas on, 2 off. Pod
    # start 30 + 20 + 10 = 60 s; the returns come exactly 400 s apart, so a return is
    # planned with the least slack (20 s): started 60 + 20 s ahead of its time.
    hpa = Sim(policy(), current=8)
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    held = _square(hpa, start=0, on_s=300, off_s=400, cycles=4)
    planned = _square(aware, start=0, on_s=300, off_s=400, cycles=4)
    # The HPA's window holds the 8 for 300 s of every 400 s off; so does the restart-aware
    # engine until load has come back twice after about the same gap.
    assert [c for t, c in held if 300 <= t < 595] == [8] * 59
    assert [c for t, c in planned if 1000 <= t < 1295] == [8] * 59
    assert aware.state.returns >= 2
    assert aware.state.return_gap_s == pytest.approx(400, abs=10)
    assert aware.state.return_jitter_s == 0
    # The third off phase (1700-2100 s): released once a 20 s window no longer reaches
    # the on phase (1715; with jittering returns, 60 s), and back at 8 one time to
    # ready + 20 s ahead of the return (t = 2100 - 80), not after it.
    count = dict(planned)
    assert count[1710] == 8 and count[1715] == 2
    assert min(c for t, c in planned if 1700 <= t < 2100) == 2
    assert count[2100 - 80] == 8 and count[2100 - 85] < 8
    assert all(c == 8 for t, c in planned if 2100 - 80 <= t < 2400)
    # Replica-seconds over the last two periods, once the pattern is known.
    assert (sum(c for t, c in planned if t >= 1400)
            < 0.9 * sum(c for t, c in held if t >= 1400))


def test_restart_aware_plans_a_jittering_return_with_more_slack() -> None:
    # The same on phases, off 370 and 430 s by turns: each return comes about 30 to 60 s
    # from the learned gap, so a return is planned with the most slack (60 s), where
    # returns exactly 400 s apart get 20 s (the test above): a return 60 s early must not
    # find the replicas still starting.
    regular = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    jittering = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    _square(regular, start=0, on_s=300, off_s=400, cycles=5)
    counts = dict(_square(jittering, start=0, on_s=300, off_s=[370, 430], cycles=5))
    assert regular.state.return_jitter_s == 0
    jitter, gap = jittering.state.return_jitter_s, jittering.state.return_gap_s
    assert jittering.state.returns >= 2 and jitter is not None and jitter >= 20
    assert gap is not None and 370 <= gap <= 430
    # The fifth off phase starts at 5 x 300 + 2 x (370 + 430) = 3100 s: released once a
    # 60 s window no longer reaches the on phase (3155; 3115 for a regular return), and
    # back at 8 one pod start + 60 s before its expected end.
    assert counts[3150] == 8 and counts[3155] == 2
    due = 3100 + gap
    start = next(t for t in sorted(counts) if t > 3155 and counts[t] == 8)
    assert due - 120 <= start < due - 115  # the first 5 s step from due - 120
    assert all(counts[t] == 8 for t in range(start, 3470, 5))


def test_restart_aware_holds_the_absences_own_swings_after_a_short_slack() -> None:
    # A regular square wave (returns exactly 400 s apart: 20 s of slack) whose off phase
    # swings between 3 and 2 replicas' worth every 30 s (25 and 15 running). The slack
    # releases the on phase's 8 quickly; after that the window grows with the time away,
    # back to 60 s, so the count holds the swings' 3 instead of following each dip to 2
    # and buying the third back 30 s later (with half 6k-token prompts that dip missed a
    # window).
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    counts = {}
    for cycle in range(4):
        begin = cycle * 700
        for t in range(begin, begin + 700, 5):
            away = t - begin - 300
            running = 80.0 if away < 0 else (25.0 if away // 30 % 2 == 0 else 15.0)
            counts[t] = aware.step(t, snap(running=running))
    assert aware.state.returns >= 2 and aware.state.return_jitter_s == 0
    # The third off phase, 1700 to 2100 s: 8 go within the 20 s slack; from then until
    # the return is started (2100 - 80) the count is 3 at every step, never 2.
    assert counts[1695] == 8 and counts[1720] == 3
    assert all(counts[t] == 3 for t in range(1720, 2100 - 80, 5))
    assert counts[2100 - 80] == 8


def test_restart_aware_plans_no_return_from_a_swing_of_the_first_readings() -> None:
    # A restarted instance resumes the gap (400 s) and its jitter (none). Its first
    # readings swing high for 10 s (80 running) and settle at 20: no level was held for a
    # rise's confirmation (20 s), so that is no drop. Planned from it, the 8 would have
    # gone at 30 s and come back only at 10 + 400 - 80 s, after the load that comes at
    # 120 s. A real on phase (120 to 400 s) and its drop are planned on at once.
    resumed = types.Learned(return_gap_s=400.0, returns=3, return_jitter_s=0.0).state()
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8,
                state=resumed)
    counts = {}
    for t in range(0, 900, 5):
        on = t < 10 or 120 <= t < 400 or t >= 800
        counts[t] = aware.step(t, snap(running=80.0 if on else 20.0))
    assert all(counts[t] == 8 for t in range(0, 400, 5))
    assert counts[420] == 2 and counts[800 - 85] == 2
    assert all(counts[t] == 8 for t in range(800 - 80, 900, 5))


def test_restart_aware_starts_a_return_at_the_count_the_load_held() -> None:
    # The same square wave, but its on phase reads 7.6 and 8.4 replicas by turns (a rate's
    # swings; 8.4 is within 10 % of 8: served by 8), and 50 s before each drop a burst
    # reads 9.5, which the window still holds at the drop. Started again ahead of the
    # third return: 9, the count the engine's rules keep for the peak it read (9.5 is
    # within 10 % of 9), not its ceiling, 10. (A rise buys that count too, since the rise
    # rule of `recommend_replicas`; before it, the burst bought 10 and was left with.)
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    counts = {}
    for cycle in range(4):
        begin = cycle * 700
        for t in range(begin, begin + 700, 5):
            on = t < begin + 300
            running = (95.0 if t == begin + 250 else 84.0 if t // 5 % 2 else 76.0) if on \
                else 20.0
            counts[t] = aware.step(t, snap(running=running))
    assert aware.state.returns >= 2 and counts[1695] == 9
    assert min(c for t, c in counts.items() if 1700 <= t < 2100) == 2
    assert counts[2100 - 80] == 9 and counts[2100 - 85] < 9
    assert all(counts[t] == 9 for t in range(2100 - 80, 2100, 5))


def test_restart_aware_starts_a_return_at_the_level_its_margin_held() -> None:
    # With a tokens/s rule (target 0.8) the on phase reads 3.9 and 4.3 replicas by turns
    # and bursts to 5.5 for 30 s, 100 s into it (6 bought, 4 kept after it: 4.3 is within
    # 10 % of 4). The level held for a rise's confirmation (20 s) is 3.9, within 10 % of
    # 4, and 4 x 1 / 0.8 carries the 4.3 peak within the margin: the return starts 4,
    # and 4 serve the on phase until its burst (a start at 5, its peak's ceiling, kept 5).
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True},
                       signals={"tokensPerSecond": {"capacityPerReplica": 1000,
                                                    "targetUtilization": 0.8},
                                "queueDepth": {"targetWaitingPerReplica": 8}}), current=4)
    counts = {}
    for cycle in range(4):
        begin = cycle * 700
        for t in range(begin, begin + 700, 5):
            level = ((5.5 if begin + 100 <= t < begin + 130 else 4.3 if t // 5 % 2 else 3.9)
                     if t < begin + 300 else 1.0)
            counts[t] = aware.step(t, snap(tps=level * 800, waiting=0))
    assert aware.state.returns >= 2 and counts[1695] == 4 and counts[1740] == 1
    assert counts[2100 - 80] == 4 and counts[2100 - 85] == 1
    assert all(counts[t] == 4 for t in range(2100 - 80, 2200, 5))


def test_restart_aware_holds_while_the_load_climbs_back() -> None:
    # 80 running for 300 s, 20 for 200 s; from the second period the load climbs back
    # over 30 s (20 -> 80 running), as a rate read over a window does. The second return
    # (t = 1010, 40 running) teaches the pattern: 200 s is longer than the 60 s release
    # hold and the 120 s lead, so the next off phase is released. But the load is here
    # and climbing: the policy's window, not one SLO window reaching back into the off
    # phase, holds the 8 (with 60 s it released 4 of them at 1010 and bought them back).
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    counts = []
    for begin in range(0, 1500, 500):
        for t in range(begin, begin + 500, 5):
            climbing = begin > 0 and t < begin + 30
            running = 20.0 + 2.0 * (t - begin) if climbing else (80.0 if t < begin + 300
                                                                 else 20.0)
            counts.append((t, aware.step(t, snap(running=running))))
    assert aware.state.returns >= 2
    assert all(c == 8 for t, c in counts if t < 1300)
    # Once the load is away again, the pattern releases them after one SLO window.
    assert min(c for t, c in counts if 1300 <= t < 1380) < 8


def test_restart_aware_says_it_holds_a_gap_a_release_would_not_save() -> None:
    # Off 150 and 190 s by turns: the returns come about 20 s from the learned gap, so
    # the slack is the most (3 x 20 = 60 s). Released 60 s after the drop and started
    # 120 s before the return, the replicas would never be away. The pattern is learned,
    # the window holds them, and the explanation says so (it used to say they were
    # released after 60 s).
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    counts = _square(aware, start=0, on_s=300, off_s=[150, 190], cycles=6)
    assert aware.state.returns >= 2
    assert aware.state.return_jitter_s is not None and aware.state.return_jitter_s >= 20
    assert min(c for _, c in counts) == 8
    assert aware.last is not None
    details = [s.detail for s in aware.last.steps]
    assert any("a release and a restart would save nothing" in d for d in details)
    assert not any("released after" in d for d in details)


def test_restart_aware_plans_a_return_where_a_short_window_would_not_hold() -> None:
    # A 60 s down window, off 130 and 170 s by turns (about 20 s from the learned gap:
    # 60 s of slack): a release would save nothing (60 s held + 120 s lead > 150 s), but
    # the policy's own window lets the replicas go at drop + 60 s, so the return is
    # still planned: back at 8 one lead (120 s) before the load.
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True,
                                 "scaleDown": {"stabilizationSeconds": 60, "policies": []}}),
                current=8)
    counts = _square(aware, start=0, on_s=300, off_s=[130, 170], cycles=6)
    assert aware.state.returns >= 2
    gap = aware.state.return_gap_s
    assert gap is not None and 130 <= gap <= 170
    # The fourth off phase, 1630 to 1800 s: the return is planned from its expected
    # time (1630 + 150) less 120 s, before the 60 s window would let the replicas go
    # (1690): the 8 stay for the load.
    assert all(c == 8 for t, c in counts if 1630 <= t < 1800)


def test_restart_aware_keeps_the_window_through_dips_and_forgets_a_pattern() -> None:
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    # Dips shorter than a restart (40 s) are no pattern: the window holds throughout.
    counts = _square(aware, start=0, on_s=100, off_s=40, cycles=6)
    assert min(c for _, c in counts) == 8
    assert aware.state.returns == 0
    # A pattern (twice back after 400 s), then the load stays away: the planned return
    # is started, and the pattern dropped once 1.25 x the gap has passed.
    _square(aware, start=1000, on_s=300, off_s=400, cycles=3)
    assert aware.state.returns >= 2
    started = []
    for t in range(3100, 4000, 5):
        started.append((t, aware.step(t, snap(running=80 if t < 3400 else 20))))
    # Due at 3400 + 400: started 80 s before (returns exactly 400 s apart: 20 s of
    # slack), given up 100 s after (1.25 x 400).
    assert dict(started)[3800 - 80] == 8 and dict(started)[3800 - 85] < 8
    assert aware.state.return_gap_s is None and aware.state.returns == 0
    # Then the policy's window again: the 8 held through 3900 + 300 s.
    assert all(c == 8 for t, c in started if 3720 <= t)




def _levels(sim: Sim, *, noise_every: int, until: int = 1600) -> dict[int, int]:
    """8 replicas of load (80 running, 10 per replica) for 300 s, 6 until 700 s, then 4
    with a blip to 5 every `noise_every` s until 1100 s, then 2: the count every 5 s.
    The 8 and the 6 are never needed again (they leave the 300 s window, at 595 and 995 s,
    unrecommended since); the blips are a level of the load coming back."""
    counts = {}
    for t in range(0, until, 5):
        if t < 300:
            running = 80.0
        elif t < 700:
            running = 60.0
        elif t < 1100:
            running = 50.0 if (t - 700) % noise_every < 10 else 40.0
        else:
            running = 20.0
        counts[t] = sim.step(t, snap(running=running))
    return counts


def test_restart_aware_holds_as_long_as_levels_came_back() -> None:
    # Pod start 60 s. The first falls are held the whole window: nothing has been seen to
    # leave yet. By 1100 s two levels left for good (8 and 6), and the blips came back
    # within 40 s (1.5 x 40 = 60, no longer than a pod start): after the fall to 2, each
    # level is held one pod start (60 s) past its last recommendation, not 300 s.
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    hpa = Sim(policy(), current=8)
    learned, held = _levels(aware, noise_every=40), _levels(hpa, noise_every=40)
    assert all(learned[t] == 8 for t in range(300, 595, 5))
    assert all(learned[t] == 6 for t in range(700, 995, 5))
    assert len([at for at in aware.state.level_leaves if at < MONDAY_0600_UTC + 1100]) == 2
    # The blips every 40 s stay held (a 60 s window still reaches the last one).
    assert all(learned[t] == 5 for t in range(995, 1125, 5))
    # The last blip (5) at 1065 s, the last 4 at 1095 s: gone 60 s after each.
    assert learned[1125] == 4 and learned[1150] == 4 and learned[1155] == 2
    # The HPA's window holds the 5 until 1365 s and the 4 until 1395 s.
    assert held[1360] == 5 and held[1390] == 4 and held[1395] == 2
    # One replica 240 s less (5 -> 4) and two 240 s less (4 -> 2): 720 replica-seconds.
    assert 5 * (sum(held.values()) - sum(learned.values())) == 720
    assert aware.last is not None
    assert any("levels left 4 times and none came back later than 40 s: held 60 s"
               in s.detail for s in aware.last.steps)


def test_restart_aware_keeps_the_window_for_levels_that_come_back_late() -> None:
    # The same load, but the blips come back every 200 s: a level returned after 195 s,
    # and 1.5 x that is about the whole window (293 s of 300): the fall is held as the
    # HPA holds it, but for the window's last 7 s.
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=8)
    hpa = Sim(policy(), current=8)
    learned, held = _levels(aware, noise_every=200), _levels(hpa, noise_every=200)
    assert len(aware.state.level_leaves) >= 2
    assert [r.after_s for r in aware.state.level_returns] == [195.0]
    # Each level goes 7 s before the HPA lets it (5 -> 4 at 1200 s, 4 -> 2 at 1390 s, one
    # 5 s step each): 3 replica-steps, 15 replica-seconds in 1,600 s.
    assert learned[1195] == held[1195] == 5 and learned[1200] == 4 and held[1200] == 5
    assert learned[1390] == 2 and held[1390] == 4
    assert 5 * (sum(held.values()) - sum(learned.values())) == 15
    assert aware.last is not None
    assert any("came back within 195 s: held 293 s" in s.detail for s in aware.last.steps)


def _swing(sim: Sim, *, waiting: float) -> None:
    """Demand for 12 replicas, then 10 for 50 s, then 12 again 55 s after it was last
    recommended: running + `waiting` at 10 per replica (12 ready at first)."""
    for t in range(0, 200, 5):
        running = 100.0 - waiting if 50 <= t < 100 else 120.0 - waiting
        sim.step(t, snap(running=running, waiting=waiting))


def test_restart_aware_learns_no_return_from_a_backlog() -> None:
    # While a backlog is served the readings count it: a queue's swings are the backlog's
    # echo, not load that came back, so they teach the learned hold nothing. The same
    # swing with nothing waiting is a level of the load returning after 55 s (1.5 x 55 =
    # 82.5 s, longer than the 60 s pod start: it would hold later falls 83 s).
    backlogged = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=12)
    _swing(backlogged, waiting=40.0)  # beyond 1 waiting per ready replica: overloaded
    assert backlogged.last is not None and backlogged.last.desired == 12
    assert backlogged.state.level_returns == ()
    steady = Sim(policy(behavior={**BEHAVIOR, "restartAware": True}), current=12)
    _swing(steady, waiting=0.0)
    assert [r.after_s for r in steady.state.level_returns] == [55.0]


def test_restart_aware_keeps_the_window_while_the_kv_cache_binds() -> None:
    # Memory-bound: the KV cache's reading wins. Its dips are answers ending together,
    # not load that left, so whatever was learned the policy's window holds.
    aware = Sim(policy(behavior={**BEHAVIOR, "restartAware": True},
                       signals={"concurrency": {"targetPerReplica": 10},
                                "kvCache": {"targetUtilization": 0.8}}), current=8)
    counts = {}
    for t in range(0, 1600, 5):
        # Readings for 8, then 6, then 4 replicas (ready x usage / 0.8), then 2.
        need = 8 if t < 300 else 6 if t < 700 else 4 if t < 1100 else 2
        usage = need * 0.8 / aware.current - 0.01
        counts[t] = aware.step(t, types.SignalSnapshot(in_flight=value(10),
                                                       kv_cache_usage=value(usage)))
    assert len(aware.state.level_leaves) >= 2
    assert aware.last is not None and aware.last.winner == "kv_cache"
    assert all(counts[t] == 4 for t in range(1100, 1395, 5)) and counts[1400] == 2


def _saturated(*, prompt: float, generated: float, completed: float | None = None
               ) -> types.SignalSnapshot:
    """200 waiting behind the ready replicas (beyond 8 per replica: all busy)."""
    return types.SignalSnapshot(
        arrival_rate=value(40), queue_depth=value(200), tokens_per_second=value(generated),
        prompt_tokens_per_second=value(prompt),
        completion_rate=None if completed is None else value(completed))


def test_saturated_replicas_check_the_tokens_capacity_model() -> None:
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    sim = Sim(p, current=2)
    # 2 saturated replicas serve 2,000 generated + 35,000 prompt tok/s: the model says
    # 2,000 / 6,000 + 35,000 / 25,000 = 1.733 replicas of work, 0.867 per replica.
    busy = _saturated(prompt=35_000, generated=2_000, completed=20)
    for t in range(0, 30, 2):
        sim.step(t, busy, ready=2)
    assert sim.state.served_share == 1.0       # the rates still cover the time before
    for t in range(30, 62, 2):
        sim.step(t, busy, ready=2)
    assert sim.state.served_share == pytest.approx(1.733 / 2, rel=1e-3)
    # The load of one request as they serve it: 2 replicas / 20 finished per s / 0.8.
    assert sim.state.replicas_per_request_rate == pytest.approx(0.125, rel=1e-3)
    # Later, unsaturated: (1,000 / 6,000 + 10,000 / 25,000) / 0.8 = 0.71 by the model,
    # 0.71 / 0.867 = 0.82 as served.
    sim.step(70, load(rate=5, waiting=0, prompt=10_000), ready=2)
    assert sim.last is not None
    tokens = next(o for o in sim.last.signals if o.name == "tokens_per_second")
    assert "seen to serve 87%" in tokens.detail
    assert next(s for s in sim.last.steps if s.name == "load").detail.count("x 0.87") == 1


def _memory_bound(usage: float) -> types.SignalSnapshot:
    """6 waiting (under the overload bound of 8 a replica) and the caches `usage` full."""
    return types.SignalSnapshot(
        queue_depth=value(6), tokens_per_second=value(2_000),
        prompt_tokens_per_second=value(35_000), kv_cache_usage=value(usage))


def test_a_full_kv_cache_is_saturation_too() -> None:
    # Long prompts: the caches are full (vLLM admits no more) with a few waiting, under
    # the queue's overload bound (8 per replica). What the replicas serve then is their
    # capacity on this mix, as with a queue: 1.733 / 2 = 0.867 of the model.
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    full, half = Sim(p, current=2), Sim(p, current=2)
    for t in range(0, 62, 2):
        full.step(t, _memory_bound(0.97), ready=2)
        half.step(t, _memory_bound(0.5), ready=2)
    assert full.state.served_share == pytest.approx(1.733 / 2, rel=1e-3)
    assert half.state.served_share == 1.0       # room in the cache: no capacity read


def test_a_full_cache_swinging_under_the_full_mark_stays_saturated() -> None:
    # With requests waiting for room, a full cache's mean swings as answers end and
    # waiting requests take their blocks: 0.97, 0.93, 0.98, 0.92, ... Saturation lasts
    # while the mean stays at 0.90 or more once it began at 0.95, so it lasts the 30 s
    # that make what the replicas serve their capacity; a cache at 0.85 ends it.
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    swinging, emptying = Sim(p, current=2), Sim(p, current=2)
    for t in range(0, 62, 2):
        swinging.step(t, _memory_bound((0.97, 0.93, 0.98, 0.92)[t // 2 % 4]), ready=2)
        emptying.step(t, _memory_bound((0.97, 0.85)[t // 2 % 2]), ready=2)
    assert swinging.state.served_share == pytest.approx(1.733 / 2, rel=1e-3)
    assert emptying.state.served_share == 1.0


def test_a_backlog_left_on_old_replicas_teaches_no_capacity() -> None:
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    sim = Sim(p, current=1)
    # One replica holds the backlog; 3 more become ready at 20 s and serve only new
    # arrivals, so per ready replica the work reads low (0.5 of the model): not capacity.
    for t in range(0, 90, 2):
        ready = 1 if t < 20 else 4
        sim.step(t, _saturated(prompt=25_000 * ready / 2, generated=3_000 * ready / 2),
                 ready=ready)
    assert sim.state.served_share == 1.0


def test_the_served_share_is_bounded() -> None:
    p = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    sim = Sim(p, current=1)
    # One replica reporting 5x what the model allows one replica: a wrong policy (or a
    # hostile report), held to twice the model.
    for t in range(0, 80, 2):
        sim.step(t, _saturated(prompt=125_000, generated=0), ready=1)
    assert sim.state.served_share == 2.0


def _sawtooth(sim: Sim, *, cycles: int, periods: list[int] | None = None
              ) -> list[tuple[int, types.Decision]]:
    """Running requests climbing 10 -> 100 over 240 s, then 10 until the period ends (300 s,
    or each of `periods` in turn); 10 per replica. Each 4 s step's decision."""
    out: list[tuple[int, types.Decision]] = []
    begin = 0
    for cycle in range(cycles):
        period = (periods or [300])[cycle % len(periods or [300])]
        for t in range(begin, begin + period, 4):
            sim.step(t, snap(running=sawtooth_running(t - begin)))
            assert sim.last is not None
            out.append((t, sim.last))
        begin += period
    return out


def test_a_rise_is_not_extrapolated_past_the_drop_that_ends_each_cycle() -> None:
    # A sawtooth: the look-ahead (pod start 60 s) projects each climb's trend a minute on,
    # past the drop at its top. Once drops came a cycle apart twice in a row (three
    # drops: at 240, 540 and 840 s), the trend is extrapolated up to the next drop only.
    p = policy(forecast={"enabled": True, "windowSeconds": 120},
               replicas={"min": 1, "max": 40}, behavior={**BEHAVIOR, "restartAware": True})
    sim = Sim(p, current=1, ready_after=60)
    decisions = dict(_sawtooth(sim, cycles=5))
    assert sim.state.drop_cycles >= 2
    assert sim.state.drop_cycle_s == pytest.approx(300, abs=8)

    def forecast_at(t: int) -> types.Forecast:
        fc = decisions[t].forecast
        assert fc is not None
        return fc

    # 20 s before the top of the second climb (cycle not known yet): a minute's trend.
    early = forecast_at(300 + 220)
    assert early.drop_in_s is None
    assert early.demand_at_ready == pytest.approx(
        early.demand_now + early.slope_per_s * early.horizon_scale * 60, rel=1e-6)
    # The same point of the fifth climb: the trend up to the drop, about 20 s ahead.
    late = forecast_at(1200 + 220)
    assert late.drop_in_s is not None and 12 <= late.drop_in_s <= 28
    assert late.demand_at_ready == pytest.approx(
        late.demand_now + late.slope_per_s * late.horizon_scale * late.drop_in_s, rel=1e-6)
    assert late.demand_at_ready < early.demand_at_ready
    look = next(s for s in decisions[1200 + 220].steps if s.name == "look_ahead")
    assert "the load falls away in" in look.detail
    # Early in a climb the drop is further off than a pod start: the whole minute.
    assert forecast_at(1200 + 100).drop_in_s is None


def test_drops_that_come_irregularly_make_no_cycle() -> None:
    # Drops 300 and 325 s apart by turns: no two in a row within 5 % of each other.
    p = policy(forecast={"enabled": True, "windowSeconds": 120},
               replicas={"min": 1, "max": 40}, behavior={**BEHAVIOR, "restartAware": True})
    sim = Sim(p, current=1, ready_after=60)
    decisions = _sawtooth(sim, cycles=6, periods=[300, 325])
    assert sim.state.drop_cycles < 2
    assert all(d.forecast is None or d.forecast.drop_in_s is None for _, d in decisions)


def test_a_cycle_whose_drop_does_not_come_is_forgotten() -> None:
    p = policy(forecast={"enabled": True, "windowSeconds": 120},
               replicas={"min": 1, "max": 40}, behavior={**BEHAVIOR, "restartAware": True})
    sim = Sim(p, current=1, ready_after=60)
    _sawtooth(sim, cycles=4)
    assert sim.state.drop_cycles >= 2
    # Then the load holds at its top: the drop due at 1440 s does not come.
    for t in range(1200, 1600, 4):
        sim.step(t, snap(running=100.0))
    assert sim.state.drop_cycles == 0 and sim.state.drop_cycle_s is None


def test_a_cycle_releases_what_it_needs_no_more_within_a_restart() -> None:
    # The sawtooth of 10 -> 100 running over 240 s, every 300 s (1 to 10 replicas), pod
    # start 120 s. The HPA's 300 s window spans the whole cycle: it holds the top's
    # replicas throughout. Once the drops came a cycle apart twice in a row (at 240, 540
    # and 840 s) and the last cycle's demand was recorded (540-840 s), each cycle is
    # planned from the one before: the top is released the slack after the drop (20 s:
    # the drops came within a second of the cycle) to what the last cycle needed within
    # a lead and a slack (140 + 20 s: up to about 115 s into the climb, 5.35 replicas,
    # which 5 hold within their 10 %), and each level is back one restart before the
    # climb reaches it.
    hpa = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START), current=1,
              ready_after=120)
    aware = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                       behavior={**BEHAVIOR, "restartAware": True}), current=1,
                ready_after=120)
    held = dict((t, d.desired) for t, d in _sawtooth(hpa, cycles=6))
    decisions = dict(_sawtooth(aware, cycles=6))
    planned = {t: d.desired for t, d in decisions.items()}
    assert aware.state.drop_cycles >= 2 and aware.state.drop_jitter_s is not None
    assert aware.state.drop_jitter_s < 5
    fifth = range(1140, 1440, 4)  # from the fifth drop to the sixth
    assert all(held[t] == 9 for t in fifth)  # 9.55 at the top is within 10 % of 9
    # Held through the slack, then released to 5.
    assert planned[1152] == held[1152] and min(planned[t] for t in fifth) == 5
    # Each level is there a pod start (120 s) before the load reads it.
    for t in fifth:
        ahead = max(sawtooth_running(t + s) for s in range(0, 121, 4)) / 10
        assert planned[t] >= math.ceil(ahead / 1.1), t
    assert sum(planned[t] for t in fifth) < sum(held[t] for t in fifth)
    # No thrash: nothing released is bought back within the slack (20 s), though the
    # climb's need rises every step (each release keeps what a lead and a slack need).
    times = sorted(planned)
    downs = [t for a, t in zip(times, times[1:], strict=False) if planned[t] < planned[a]]
    ups = [t for a, t in zip(times, times[1:], strict=False) if planned[t] > planned[a]]
    assert downs and all(u - d >= 20 for d in downs for u in ups if u > d)
    # The rule explains itself: a decision won by the cycle, its look-ahead says why.
    won = [d for t, d in decisions.items() if t in fifth and d.winner == "cycle"]
    assert won
    look = next(s for s in won[0].steps if s.name == "look_ahead")
    assert "the last cycle needed" in look.detail
    stabilize = next(s for s in decisions[1160].steps if s.name == "stabilize")
    assert "the last cycle's need held ahead" in stabilize.detail


def test_a_cycle_is_not_planned_before_it_repeated() -> None:
    # Until drops came a cycle apart twice in a row (the third drop, at 840 s), no cycle
    # is planned: the down window holds the second drop's count through its cycle.
    aware = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                       behavior={**BEHAVIOR, "restartAware": True}), current=1,
                ready_after=120)
    decisions = _sawtooth(aware, cycles=3)
    assert all(d.winner != "cycle" for t, d in decisions if t < 840)
    assert all(d.desired == 9 for t, d in decisions if 540 <= t < 840)
    assert aware.state.drop_cycles == 2 and aware.state.last_cycle_demand


def test_a_cycle_releases_nothing_it_would_buy_back_within_the_slack() -> None:
    # A cycle learned (300 s, drops on time: 20 s of slack; pod start 120 s: a lead of
    # 140 s) whose last cycle read 1 replica until 190 s after its drop and 9 from then.
    # The drop was at t = -5. At t = 30 the down window (20 s) no longer holds the 9 read
    # at t = 10, and the cycle's need within the lead (35 to 175 s after the drop) is 1;
    # but it needs 9 again within the lead and the slack (195 s): released at 30, they
    # would be started again at 45. So they stay.
    aware = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                       behavior={**BEHAVIOR, "restartAware": True}), current=9,
                ready_after=120)
    profile = (1.0,) * 19 + (9.0,) * 11
    aware.state = types.EngineState(
        last_drop_at=aware.start - 5, drop_cycle_s=300.0, drop_cycles=2, drop_jitter_s=0.0,
        last_cycle_demand=profile)
    aware.step(0, snap(running=90.0))
    aware.step(10, snap(running=90.0))
    counts = {t: aware.step(t, snap(running=10.0)) for t in range(15, 65, 5)}
    assert all(c == 9 for c in counts.values()), counts
    assert aware.last is not None and aware.last.winner == "cycle"
    stabilize = next(s for s in aware.last.steps if s.name == "stabilize")
    assert "released after 20 s" in stabilize.detail


def test_a_cycle_is_not_planned_over_a_time_it_did_not_read() -> None:
    # The same cycle, but the last cycle's signals were missing from 180 to 200 s after
    # its drop: no plan rests on that time, and the down window holds the 9 read at t = 10.
    aware = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                       behavior={**BEHAVIOR, "restartAware": True}), current=9,
                ready_after=120)
    profile = (1.0,) * 18 + (engine_decide.UNREAD,) * 2 + (1.0,) * 10
    aware.state = types.EngineState(
        last_drop_at=aware.start - 5, drop_cycle_s=300.0, drop_cycles=2, drop_jitter_s=0.0,
        last_cycle_demand=profile)
    aware.step(0, snap(running=90.0))
    aware.step(10, snap(running=90.0))
    decisions = []
    for t in range(15, 65, 5):
        aware.step(t, snap(running=10.0))
        assert aware.last is not None
        decisions.append(aware.last)
    assert all(d.desired == 9 and d.winner != "cycle" for d in decisions)


def test_a_cycle_never_holds_longer_than_the_policys_window() -> None:
    # The policy's down window (10 s) is shorter than the cycle's slack (20 s): it stays
    # the longest hold, so the fall is released 10 s after the last high reading.
    behavior = {**BEHAVIOR, "restartAware": True,
                "scaleDown": {"stabilizationSeconds": 10, "policies": []}}
    aware = Sim(policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                       behavior=behavior), current=9, ready_after=120)
    aware.state = types.EngineState(
        last_drop_at=aware.start - 5, drop_cycle_s=300.0, drop_cycles=2, drop_jitter_s=0.0,
        last_cycle_demand=(1.0,) * 30)
    aware.step(0, snap(running=90.0))
    counts = {t: aware.step(t, snap(running=10.0)) for t in range(5, 30, 5)}
    assert counts[5] == 9 and counts[10] == 1, counts
    assert aware.last is not None
    stabilize = next(s for s in aware.last.steps if s.name == "stabilize")
    assert "released after 10 s" in stabilize.detail
