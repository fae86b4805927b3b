"""The engine's learned state kept across restarts: the record's codec, its refusals, what
a resumed engine decides, and what a write keeps (scaler.service.learned)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.engine import decide, recommend, types
from scaler.service import learned
from tests.engine.helpers import BASE, SLOW_START, Sim, policy, sawtooth_running, snap, value

TOKENS_AND_QUEUE = {"queueDepth": {"targetWaitingPerReplica": 8},
                    "tokensPerSecond": {"capacityPerReplica": 6000,
                                        "promptCapacityPerReplica": 25000,
                                        "targetUtilization": 0.8}}
POLICY = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
NOW = 1_764_930_000.0
DAY = 86_400.0
LEARNED = types.Learned(pod_start_s=104.2, node_boot_s=290.0, observed_until=NOW - 50,
                        replicas_per_request_rate=0.0913, load_samples=310,
                        served_share=0.868, served_samples=41, return_gap_s=402.0,
                        returns=3, return_jitter_s=12.5, horizon_scale=0.5,
                        level_returns=(types.LevelReturn(at=NOW - 1500, after_s=180.5),
                                       types.LevelReturn(at=NOW - 400, after_s=42.0)),
                        level_leaves=(NOW - 2000, NOW - 1200, NOW - 300),
                        last_drop_at=NOW - 100, drop_cycle_s=301.5, drop_cycles=4,
                        drop_jitter_s=2.5, cycle_demand=(1.0, 2.25, decide.UNREAD),
                        last_cycle_demand=(1.0, 2.5, 4.75, 6.0, 1.125))


def _decode(text: str, *, now: float = NOW, max_age_s: float = DAY) -> types.Learned:
    return learned.decode(text, now=now, policy_fingerprint=learned.fingerprint(POLICY),
                          max_age_s=max_age_s)


def _record(**fields: Any) -> str:
    document = json.loads(learned.encode(LEARNED, at=NOW - 60,
                                         policy_fingerprint=learned.fingerprint(POLICY)))
    document.update(fields)
    return json.dumps(document)


def test_a_record_round_trips_and_starts_an_engine_state_from_it() -> None:
    text = learned.encode(LEARNED, at=NOW - 60, policy_fingerprint=learned.fingerprint(POLICY))
    assert len(text) < 700
    assert _decode(text) == LEARNED
    # Two returns the engine kept apart may round to the same length: both are kept.
    assert len(_decode(_record(levelReturns=[[NOW - 60, 90.0], [NOW - 30, 90.0]]))
               .level_returns) == 2
    # A leave older than the engine remembers is no error: its next decision forgets it.
    assert _decode(_record(levelLeaves=[NOW - 2 * DAY])).level_leaves == (NOW - 2 * DAY,)
    state = LEARNED.state()
    assert types.Learned.of(state) == LEARNED
    assert state.recommendations == () and state.last_desired is None  # windows start empty
    # Nothing learned yet: the record holds only what every record holds.
    empty = json.loads(learned.encode(types.Learned(), at=NOW, policy_fingerprint="f"))
    assert set(empty) == {"v", "at", "policy", "loadSamples", "servedShare", "servedSamples",
                          "returns", "horizonScale"}
    assert learned.decode(json.dumps(empty), now=NOW, policy_fingerprint="f",
                          max_age_s=DAY) == types.Learned()


def _saturated() -> types.SignalSnapshot:
    """2 replicas with 200 waiting serving 2,000 generated and 35,000 prompt tokens/s: the
    model says 1.733 replicas of work (0.867 a replica)."""
    return types.SignalSnapshot(
        arrival_rate=value(40), queue_depth=value(200), tokens_per_second=value(2_000),
        prompt_tokens_per_second=value(35_000), completion_rate=value(20))


def _calm() -> types.SignalSnapshot:
    return types.SignalSnapshot(queue_depth=value(0), tokens_per_second=value(4_000),
                                prompt_tokens_per_second=value(60_000), arrival_rate=value(5))


def test_a_resumed_engine_decides_with_what_was_learned() -> None:
    # One instance learns the served share under saturation...
    first = Sim(POLICY, current=2)
    for t in range(0, 62, 2):
        first.step(t, _saturated(), ready=2)
    assert first.state.served_share == pytest.approx(0.867, rel=1e-3)
    text = learned.encode(types.Learned.of(first.state), at=first.start + 62,
                          policy_fingerprint=learned.fingerprint(POLICY))
    # ... a second starts from its record, a third from nothing, on the same calm load:
    # (4,000 / 6,000 + 60,000 / 25,000) / 0.8 = 3.83 replicas by the model, 4.42 as served.
    resumed = Sim(POLICY, current=4, state=learned.decode(
        text, now=first.start + 100, policy_fingerprint=learned.fingerprint(POLICY),
        max_age_s=DAY).state())
    fresh = Sim(POLICY, current=4)
    for t in range(100, 132, 2):  # a rise within the margin is confirmed for 20 s first
        resumed.step(t, _calm(), ready=4)
        fresh.step(t, _calm(), ready=4)
    assert (resumed.current, fresh.current) == (5, 4)
    assert resumed.last is not None
    tokens = next(o for o in resumed.last.signals if o.name == "tokens_per_second")
    assert "seen to serve 87%" in tokens.detail


def test_the_fingerprint_follows_the_capacity_model_not_the_bounds() -> None:
    print_ = learned.fingerprint(POLICY)
    assert learned.fingerprint(policy(signals=TOKENS_AND_QUEUE,
                                      replicas={"min": 2, "max": 80})) == print_
    changed = {**TOKENS_AND_QUEUE, "tokensPerSecond": {
        **TOKENS_AND_QUEUE["tokensPerSecond"], "capacityPerReplica": 9000}}
    assert learned.fingerprint(policy(signals=changed,
                                      replicas={"min": 1, "max": 40})) != print_


@pytest.mark.parametrize(("text", "reason", "names"), [
    ("{not json", learned.MALFORMED, "not JSON"),
    ("[1, 2]", learned.MALFORMED, "not a JSON object"),
    (_record(v=2), learned.MALFORMED, "v: 2"),
    (_record(at="yesterday"), learned.MALFORMED, "at"),
    (_record(at=NOW + 3600), learned.IMPLAUSIBLE, "at"),
    (_record(at=NOW - 2 * DAY), learned.STALE, "at"),
    (_record(policy="0123456789abcdef"), learned.POLICY_CHANGED, "policy"),
    (_record(servedShare=5.0), learned.IMPLAUSIBLE, "servedShare"),
    (_record(servedShare=float("nan")), learned.IMPLAUSIBLE, "servedShare"),
    (_record(replicasPerRequestRate=float("inf")), learned.IMPLAUSIBLE,
     "replicasPerRequestRate"),
    (_record(podStartSeconds=-3), learned.IMPLAUSIBLE, "podStartSeconds"),
    (_record(returnJitterSeconds=-0.5), learned.IMPLAUSIBLE, "returnJitterSeconds"),
    (_record(horizonScale=1e300), learned.IMPLAUSIBLE, "horizonScale"),
    (_record(servedSamples=10**400), learned.IMPLAUSIBLE, "servedSamples"),
    (_record(loadSamples=1.5), learned.MALFORMED, "loadSamples"),
    (_record(returns=True), learned.MALFORMED, "returns"),
    (_record(observedUntil=NOW + DAY), learned.IMPLAUSIBLE, "observedUntil"),
    (_record(extra=1), learned.MALFORMED, "unknown fields"),
    (_record(levelReturns={"at": NOW}), learned.MALFORMED, "levelReturns: not a list"),
    (_record(levelReturns=[[NOW - 60]]), learned.MALFORMED, "levelReturns"),
    (_record(levelReturns=[[NOW - 60, -1]]), learned.IMPLAUSIBLE, "levelReturns"),
    (_record(levelReturns=[[NOW + DAY, 60]]), learned.IMPLAUSIBLE, "levelReturns"),
    (_record(levelReturns=[[NOW - 60, 30], [NOW - 30, 90]]), learned.MALFORMED,
     "each no longer than the one before"),
    (_record(levelReturns=[[NOW - 30, 90], [NOW - 60, 30]]), learned.MALFORMED,
     "not oldest first"),
    (_record(levelLeaves=[NOW - t for t in range(33)]), learned.IMPLAUSIBLE,
     "levelLeaves: 33 entries"),
    (_record(levelLeaves=[NOW - 10, NOW - 20]), learned.MALFORMED, "levelLeaves"),
    (_record(levelLeaves=["yesterday"]), learned.MALFORMED, "levelLeaves"),
    (_record(levelLeaves=[float("inf")]), learned.IMPLAUSIBLE, "levelLeaves"),
    (_record(lastDropAt=NOW + DAY), learned.IMPLAUSIBLE, "lastDropAt"),
    (_record(lastDropAt="yesterday"), learned.MALFORMED, "lastDropAt"),
    (_record(dropCycleSeconds=-300), learned.IMPLAUSIBLE, "dropCycleSeconds"),
    (_record(dropCycles=-1), learned.IMPLAUSIBLE, "dropCycles"),
    (_record(cycleDemand={"0": 1.0}), learned.MALFORMED, "cycleDemand: not a list"),
    (_record(lastCycleDemand=[1.0] * 91), learned.IMPLAUSIBLE,
     "lastCycleDemand: 91 entries"),
    (_record(cycleDemand=[1.0, -0.5]), learned.IMPLAUSIBLE, "cycleDemand: -0.5"),
    (_record(lastCycleDemand=[1e300]), learned.IMPLAUSIBLE, "lastCycleDemand"),
    (_record(cycleDemand=[float("nan")]), learned.IMPLAUSIBLE, "cycleDemand"),
    (_record(cycleDemand=["x"]), learned.MALFORMED, "cycleDemand"),
    (_record(padding="x" * 5000), learned.MALFORMED, "bytes"),
])
def test_a_bad_record_is_refused_whole_naming_the_field(text: str, reason: str,
                                                        names: str) -> None:
    with pytest.raises(learned.Refused) as refused:
        _decode(text)
    assert refused.value.reason == reason
    assert names in str(refused.value)


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=6)
_NUMBERS = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**400, 10**400)
            | st.sampled_from([0.0, -0.0, 5e-324, 1e300, -1e300]))


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.sampled_from([*learned._FIELDS, "observedUntil", "at",
                                               learned.RETURNS, learned.LEAVES,
                                               learned.LAST_DROP, *learned.PROFILES]),
                              _NUMBERS | _ANY_JSON | st.lists(
                                  _NUMBERS | st.lists(_NUMBERS, max_size=3), max_size=4),
                              max_size=6))
def test_whatever_a_record_holds_it_is_refused_or_decided_on_within_bounds(
        fields: dict[str, Any]) -> None:
    text = _record(**fields)
    try:
        resumed = _decode(text)
    except learned.Refused:
        return
    # Restart-aware, so the learned hold's lists are read too (the behavior is not in the
    # fingerprint: the record is this policy's).
    aware = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40},
                   behavior={**BASE["spec"]["behavior"], "restartAware": True})
    assert learned.fingerprint(aware) == learned.fingerprint(POLICY)
    sim = Sim(aware, current=4, start=NOW, state=resumed.state())
    for t in range(0, 20, 2):
        desired = sim.step(t, _calm() if t < 10 else _saturated(), ready=4)
        assert 1 <= desired <= 40


def test_the_fullest_record_the_engine_can_write_is_read_back() -> None:
    # Every list as long as the engine keeps it and every value as long as its bounds let
    # it be written: a record the leader writes is never refused as too long.
    day, week = learned.DAY_S - 0.001, 7 * learned.DAY_S - 0.001
    fullest = types.Learned(
        pod_start_s=day, node_boot_s=day, observed_until=NOW - 0.001,
        replicas_per_request_rate=recommend.MAX_DEMAND_REPLICAS - 0.001,
        load_samples=learned.MAX_COUNT, served_share=1.999, served_samples=learned.MAX_COUNT,
        return_gap_s=week, returns=learned.MAX_COUNT, return_jitter_s=week,
        horizon_scale=0.999,
        level_returns=tuple(types.LevelReturn(at=NOW - 3599.999, after_s=86_399.999)
                            for _ in range(decide.HOLD_SAMPLES)),
        level_leaves=(NOW - 3599.999,) * decide.HOLD_SAMPLES,
        last_drop_at=NOW - 899.999, drop_cycle_s=week, drop_cycles=learned.MAX_COUNT,
        drop_jitter_s=week,
        cycle_demand=(recommend.MAX_DEMAND_REPLICAS - 0.001,) * decide.CYCLE_MAX_BINS,
        last_cycle_demand=(recommend.MAX_DEMAND_REPLICAS - 0.001,) * decide.CYCLE_MAX_BINS)
    text = learned.encode(fullest, at=NOW, policy_fingerprint=learned.fingerprint(POLICY))
    assert len(text) <= learned.MAX_RECORD_BYTES
    assert _decode(text) == fullest


def test_resume_takes_each_record_once_and_counts_what_it_refuses() -> None:
    counts: Counter[str] = Counter()
    other = policy(signals=TOKENS_AND_QUEUE, replicas={"min": 1, "max": 40})
    other = other.model_copy(update={"metadata": other.metadata.model_copy(
        update={"name": "other"})})
    resume = learned.Resume({learned.data_key(POLICY.key): _record(),
                             learned.data_key(other.key): _record(servedShare=9),
                             "no_dot": "{}"}, max_age_s=DAY, counts=counts)
    assert counts == {learned.MALFORMED: 1}  # a key that names no model
    assert resume.take(POLICY, now=NOW) == (LEARNED, NOW - 60)
    assert resume.take(POLICY, now=NOW) is None  # taken once
    assert resume.take(other, now=NOW) is None
    assert counts == {learned.MALFORMED: 1, learned.RESUMED: 1, learned.IMPLAUSIBLE: 1}
    assert resume.records == {}


def test_a_write_keeps_what_was_learned_within_the_configmaps_size() -> None:
    policies = {f"ns/m{i}": POLICY for i in range(5)}
    values = {f"ns/m{i}": types.Learned(load_samples=i, served_share=0.9) for i in range(4)}
    values["ns/m0"] = types.Learned()          # nothing learned: not written
    values["ns/gone"] = LEARNED                # no policy any more: not written
    pending = {"ns/m4": "kept as read", "ns/m1": "superseded", "ns/other": "no policy"}
    data, omitted = learned.payload(values, policies, at=NOW, pending=pending)
    assert sorted(data) == ["ns.m1", "ns.m2", "ns.m3", "ns.m4"]
    assert data["ns.m4"] == "kept as read" and omitted == 0
    assert _decode(data["ns.m3"]) == values["ns/m3"]
    # Over the bound: those with the most samples are kept, the rest counted.
    many = {f"ns/m{i}": dataclasses.replace(LEARNED, load_samples=i + 1) for i in range(4000)}
    data, omitted = learned.payload(many, dict.fromkeys(many, POLICY), at=NOW, pending={})
    size = sum(len(k) + len(v) for k, v in data.items())
    assert size <= learned.MAX_DATA_BYTES < size + 300
    assert omitted == 4000 - len(data) > 0
    assert "ns.m3999" in data and "ns.m0" not in data


def test_data_keys_are_configmap_keys_and_name_the_model_again() -> None:
    key = "inference/llama-3.1-8b"
    assert learned.data_key(key) == "inference.llama-3.1-8b"
    assert learned.model_key(learned.data_key(key)) == key


def test_a_record_taken_onto_a_running_state_keeps_its_windows() -> None:
    # A follower in a queue group taking over: its windows are its own, what was learned
    # is the leader's.
    sim = Sim(POLICY, current=2)
    for t in range(0, 20, 2):
        sim.step(t, _calm(), ready=2)
    state = LEARNED.onto(sim.state)
    assert types.Learned.of(state) == LEARNED
    assert state.recommendations == sim.state.recommendations != ()
    assert state.last_desired == sim.state.last_desired


def test_a_restarted_instance_holds_a_fall_as_long_as_the_one_before_had_learned() -> None:
    # Restart-aware, pod start 60 s, a 300 s window. The first instance saw the load
    # leave twice (8 replicas of it for 300 s, 6 until 700 s) and its blips come back
    # within 40 s: a fall is held one pod start. It writes its record and stops.
    aware = policy(behavior={**BASE["spec"]["behavior"], "restartAware": True})
    first = Sim(aware, current=8)
    for t in range(0, 1100, 5):
        running = (80.0 if t < 300 else 60.0 if t < 700
                   else 50.0 if (t - 700) % 40 < 10 else 40.0)
        first.step(t, snap(running=running))
    assert len(first.state.level_leaves) == 2 and first.current == 5
    at = first.start + 1100
    record = learned.encode(types.Learned.of(first.state), at=at,
                            policy_fingerprint=learned.fingerprint(aware))
    kept = learned.decode(record, now=at, policy_fingerprint=learned.fingerprint(aware),
                          max_age_s=DAY)
    # The load falls to 2 replicas' worth as the next instance starts. Started from the
    # record it holds its 5 one pod start (60 s); started from nothing, the window.
    resumed = Sim(aware, current=5, start=at, state=kept.state())
    fresh = Sim(aware, current=5, start=at)
    counts, said = {}, {}
    for t in range(0, 400, 5):
        counts[t] = (resumed.step(t, snap(running=20.0)), fresh.step(t, snap(running=20.0)))
        assert resumed.last is not None
        said[t] = " ".join(step.detail for step in resumed.last.steps)
    assert counts[55] == (5, 5) and counts[60] == (2, 5)
    assert counts[295] == (2, 5) and counts[300] == (2, 2)
    assert "levels left 2 times and none came back later than 40 s: held 60 s" in said[55]


def test_a_restarted_instance_plans_the_cycle_the_one_before_had_learned() -> None:
    # Restart-aware, pod start 120 s, the sawtooth of 10 -> 100 running every 300 s (1 to
    # 10 replicas). The first instance saw its drops come a cycle apart and planned each
    # cycle from the one before; it writes its record at 1,500 s, as the sixth climb
    # begins, and stops.
    aware = policy(replicas={"min": 1, "max": 40}, coldStart=SLOW_START,
                   behavior={**BASE["spec"]["behavior"], "restartAware": True})
    first = Sim(aware, current=1, ready_after=120)
    for t in range(0, 1500, 4):
        first.step(t, snap(running=sawtooth_running(t)))
    at = first.start + 1500
    record = learned.encode(types.Learned.of(first.state), at=at,
                            policy_fingerprint=learned.fingerprint(aware))
    kept = learned.decode(record, now=at, policy_fingerprint=learned.fingerprint(aware),
                          max_age_s=DAY)
    assert kept.drop_cycles >= 2 and kept.last_cycle_demand
    # The next instance starts from the record, another from nothing; and, for reference,
    # the first goes on as if it had not stopped. Two more cycles.
    resumed = Sim(aware, current=first.current, ready_after=120, start=first.start,
                  state=kept.state())
    fresh = Sim(aware, current=first.current, ready_after=120, start=first.start)
    went_on = first
    counts: dict[str, list[int]] = {"resumed": [], "fresh": [], "went_on": []}
    for t in range(1500, 2100, 4):
        for name, sim in (("resumed", resumed), ("fresh", fresh), ("went_on", went_on)):
            counts[name].append(sim.step(t, snap(running=sawtooth_running(t))))
    # Resumed, the cycle is planned as though no restart had happened.
    assert counts["resumed"] == counts["went_on"]
    assert resumed.last is not None and resumed.last.winner == "cycle"
    # From nothing, the top's 9 replicas are held through the next cycle by the window
    # (it has seen no drop yet); resumed, the slack after each drop releases them to 5.
    after_drop = [i for i, t in enumerate(range(1500, 2100, 4)) if 1764 <= t < 1800]
    assert all(counts["fresh"][i] == 9 for i in after_drop)
    assert min(counts["resumed"][i] for i in after_drop) == 5
