"""A rise the utilisation margin absorbs is confirmed before it buys a replica
(`decide._rise_confirmed`): one reading's swing is not load."""

from __future__ import annotations

import dataclasses

from scaler.engine import decide as engine_decide
from scaler.engine import types
from tests.engine.helpers import Sim, policy, snap, value

# 1,000 tokens/s a replica at 0.8: 3,200 tokens/s is 4.0 replicas, 3,760 is 4.7 (within
# the 1 / 0.8 = 1.25x margin of 4, beyond the 10 % tolerance), 4,600 is 5.75 (beyond it,
# and beyond 5's tolerance: it buys 6).
SIGNALS = {"tokensPerSecond": {"capacityPerReplica": 1000, "targetUtilization": 0.8},
           "queueDepth": {"targetWaitingPerReplica": 4},
           "p95Latency": {"metric": "ttft", "sloSeconds": 2.0}}
STEADY, SWING, BEYOND = 3200.0, 3760.0, 4600.0
CALM = {"waiting": 0.0, "p95": 0.3}


def steady_sim() -> Sim:
    sim = Sim(policy(signals=SIGNALS), current=4)
    for t in range(31):
        assert sim.step(t, snap(tps=STEADY, **CALM)) == 4
    return sim


def test_one_swing_within_the_margin_buys_nothing() -> None:
    sim = steady_sim()
    assert sim.step(31, snap(tps=SWING, **CALM)) == 4
    assert sim.last is not None
    assert any("utilisation margin absorbs" in note for note in sim.last.notes)
    recommend = next(step for step in sim.last.steps if step.name == "recommend")
    assert "not yet confirmed" in recommend.detail
    # Nothing was recorded for the down window to hold: the count stays 4 afterwards.
    for t in range(32, 400, 10):
        assert sim.step(t, snap(tps=STEADY, **CALM)) == 4, t


def test_a_rise_read_for_the_confirm_time_scales_up() -> None:
    sim = steady_sim()
    confirm = int(engine_decide.RISE_CONFIRM_S)
    for t in range(31, 31 + confirm):
        assert sim.step(t, snap(tps=SWING, **CALM)) == 4, t
    assert sim.step(31 + confirm, snap(tps=SWING, **CALM)) == 5


def test_a_dip_inside_the_confirm_time_starts_it_again() -> None:
    sim = steady_sim()
    confirm = int(engine_decide.RISE_CONFIRM_S)
    for t in range(31, 41):
        sim.step(t, snap(tps=SWING, **CALM))
    sim.step(41, snap(tps=STEADY, **CALM))
    for t in range(42, 42 + confirm):
        assert sim.step(t, snap(tps=SWING, **CALM)) == 4, t
    assert sim.step(42 + confirm, snap(tps=SWING, **CALM)) == 5


def test_waiting_requests_confirm_at_once() -> None:
    sim = steady_sim()
    # 3 waiting at 4 ready is more than half a request each: the replicas are full.
    assert sim.step(31, snap(tps=SWING, waiting=3.0, p95=0.3)) == 5


def test_latency_towards_the_slo_confirms_at_once() -> None:
    sim = steady_sim()
    assert sim.step(31, snap(tps=SWING, waiting=0.0, p95=1.2)) == 5


def test_a_cache_past_its_target_confirms_at_once() -> None:
    # Memory's margin is not compute's: caches at 85 % (target 0.8) are close to full.
    # 4 x 0.85 / 0.8 = 4.25 replicas of memory, tokens/s 4.7: within the tokens margin.
    signals = {**SIGNALS, "kvCache": {"targetUtilization": 0.8}}
    sim = Sim(policy(signals=signals), current=4)
    for t in range(31):
        assert sim.step(t, kv(snap(tps=STEADY, **CALM), 0.6)) == 4
    assert sim.step(31, kv(snap(tps=SWING, **CALM), 0.85)) == 5
    # Caches under their target: the swing waits for its confirmation as before.
    sim = Sim(policy(signals=signals), current=4)
    for t in range(31):
        sim.step(t, kv(snap(tps=STEADY, **CALM), 0.6))
    assert sim.step(31, kv(snap(tps=SWING, **CALM), 0.75)) == 4


def kv(snapshot: types.SignalSnapshot, usage: float) -> types.SignalSnapshot:
    return dataclasses.replace(snapshot, kv_cache_usage=value(usage))


def test_unknown_strain_confirms_at_once() -> None:
    sim = steady_sim()
    assert sim.step(31, snap(tps=SWING)) == 5  # no queue or latency reading


def test_a_rise_beyond_the_margin_acts_at_once() -> None:
    sim = steady_sim()
    assert sim.step(31, snap(tps=BEYOND, **CALM)) == 6


def test_without_a_tokens_rule_nothing_is_held() -> None:
    # Concurrency alone has no utilisation target, so no margin to absorb a swing.
    sim = Sim(policy(signals={"concurrency": {"targetPerReplica": 10},
                              "queueDepth": {"targetWaitingPerReplica": 4}}), current=4)
    for t in range(31):
        assert sim.step(t, snap(running=40, waiting=0)) == 4
    assert sim.step(31, snap(running=47, waiting=0)) == 5


def test_a_short_forecast_window_confirms_within_half_of_it() -> None:
    # The demand samples reach back one forecast window (10 s here): a rise is confirmed
    # after 5 s, not held until strain shows.
    sim = Sim(policy(signals=SIGNALS, forecast={"enabled": False, "windowSeconds": 10}),
              current=4)
    for t in range(31):
        assert sim.step(t, snap(tps=STEADY, **CALM)) == 4
    for t in range(31, 36):
        assert sim.step(t, snap(tps=SWING, **CALM)) == 4, t
    assert sim.step(36, snap(tps=SWING, **CALM)) == 5


def test_headroom_is_confirmed_by_the_same_samples() -> None:
    # One spare replica: 3,200 tokens/s is 4.0 replicas of load + 1 = 5.0 held; 3,700
    # (4.625 + 1 = 5.6 at 5, within the margin) read for the confirm time buys the sixth.
    sim = Sim(policy(signals=SIGNALS, headroom={"replicas": 1}), current=5)
    for t in range(31):
        assert sim.step(t, snap(tps=STEADY, **CALM)) == 5
    confirm = int(engine_decide.RISE_CONFIRM_S)
    for t in range(31, 31 + confirm):
        assert sim.step(t, snap(tps=3700.0, **CALM)) == 5, t
    assert sim.step(31 + confirm, snap(tps=3700.0, **CALM)) == 6
