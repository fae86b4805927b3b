"""Scale-down that spares work: deletion costs from reported work, and the batch tier's
rule that replicas with unfinished work stay unless the model is over its GPU budget."""

from __future__ import annotations

import dataclasses

import pytest

from scaler.core import vocabulary
from scaler.engine import spare, types

from .helpers import Sim, policy, snap, value

Work = spare.PodWork


@pytest.mark.parametrize(("work", "cost"), [
    (Work(), 0),
    (Work(in_flight=30, queue_depth=12), 42),
    (Work(in_flight=0.5), 1),            # any work at all ranks above an idle pod
    (Work(in_flight=-3), 0),             # never negative: nothing known to cut
    (Work(in_flight=float("nan")), 0),
    (Work(in_flight=1e12), spare.INT32_MAX),  # the annotation must stay an int32
    (Work(in_flight=float("inf")), spare.INT32_MAX),
    (Work(in_flight=spare.INT32_MAX - 1, queue_depth=0.5), spare.INT32_MAX),
])
def test_deletion_cost_is_running_plus_waiting_within_int32(work: spare.PodWork,
                                                           cost: int) -> None:
    assert spare.deletion_cost(work) == cost


def test_work_by_source_joins_the_two_signals() -> None:
    assert spare.work_by_source(in_flight={"a": 3, "b": 0}, queue_depth={"b": 2, "c": 1}) == {
        "a": Work(3, 0), "b": Work(0, 2), "c": Work(0, 1)}


def test_a_silent_pod_costs_the_median_of_the_reporting_ones_online() -> None:
    work = {"idle": Work(), "mid": Work(in_flight=3), "busy": Work(in_flight=40),
            "gateway": Work(queue_depth=500)}  # not a pod of the target: ignored
    pods = ["idle", "mid", "busy", "silent"]
    assert spare.costs(pods, work, tier=vocabulary.Tier.ONLINE) == {
        "idle": 0, "mid": 3, "busy": 40, "silent": 3}
    # In a batch tier it may be busy: the median of the busy ones (3, 40 -> 3).
    assert spare.costs(pods, work, tier=vocabulary.Tier.BATCH)["silent"] == 3
    # No report at all: Kubernetes' own default, 0.
    assert spare.costs(["a", "b"], {}, tier=vocabulary.Tier.ONLINE) == {"a": 0, "b": 0}


def test_busy_replicas_count_sources_with_unfinished_work() -> None:
    work = {"a": Work(in_flight=1), "b": Work(queue_depth=2), "c": Work(), "d": Work(0.0, 0.0)}
    assert spare.busy_replicas(work) == 2


@pytest.mark.parametrize(("busy", "current", "floor"), [
    (None, 6, 0), (4, 6, 4), (9, 6, 6), (0, 6, 0), (-1, 6, 0)])
def test_busy_floor_never_exceeds_what_the_target_has(busy: int | None, current: int,
                                                      floor: int) -> None:
    cluster = types.ClusterState(current=current, ready=current, busy_replicas=busy)
    assert spare.busy_floor(cluster) == floor


FAST_DOWN = {"scaleUp": {"stabilizationSeconds": 0, "policies": []},
             "scaleDown": {"stabilizationSeconds": 0, "policies": []}}


def test_busy_replicas_are_not_removed_unless_over_budget() -> None:
    """6 replicas, demand for 2 (20 running at 10 per replica), 4 report unfinished work."""
    def decide(**cluster: object) -> types.Decision:
        sim = Sim(policy(behavior=FAST_DOWN), current=6)
        sim.step(0, snap(running=20, waiting=0), **cluster)
        assert sim.last is not None
        return sim.last

    assert decide().desired == 2  # no busy count (not a batch tier): down to demand
    kept = decide(busy_replicas=4)
    assert kept.desired == 4
    assert [(c.name, c.before, c.after) for c in kept.clamps] == [
        (types.ClampName.UNFINISHED_WORK, 2, 4)]
    assert decide(busy_replicas=0).desired == 2
    # More busy sources than replicas (a gateway's queue among them): hold, never add.
    assert decide(busy_replicas=9).desired == 6
    # Over its GPU budget (3 GPUs where it holds 6): the budget wins, down to it and no
    # further than the busy rule allows.
    over = decide(busy_replicas=4, budget_gpus=3)
    assert over.desired == 3
    assert [c.name for c in over.clamps] == [types.ClampName.UNFINISHED_WORK,
                                             types.ClampName.EXTERNAL_BUDGET]
    # Within budget (a cap above what it holds), the busy replicas stay.
    assert decide(busy_replicas=4, budget_gpus=8).desired == 4


def test_the_busy_rule_never_slows_a_scale_up() -> None:
    sim = Sim(policy(behavior=FAST_DOWN), current=1)
    assert sim.step(0, snap(running=50, waiting=0), busy_replicas=1) == 5
    assert sim.last is not None and sim.last.clamps == ()


def with_finished(snapshot: types.SignalSnapshot, finished: float, *, age: float = 0.0
                  ) -> types.SignalSnapshot:
    return dataclasses.replace(snapshot, completion_rate=value(finished, age=age))


@pytest.mark.parametrize(("running", "finished", "age", "seconds"), [
    (400, 4, 0, 100.0), (20, 0.2, 0, 100.0), (30, 10, 0, 3.0),
    (400, 0, 0, None),  # nothing finishes: no time to tell
    (0, 4, 0, None),  # nothing running: nothing to cut
    (400, 4, 60, None),  # stale completions
    (1e300, 1e-300, 0, None)])  # no overflow: not a finite time
def test_answer_seconds_is_littles_law(running: float, finished: float, age: float,
                                       seconds: float | None) -> None:
    snapshot = with_finished(snap(running=running), finished, age=age)
    assert spare.answer_seconds(snapshot) == seconds
    assert spare.answer_seconds(snap(running=running)) is None  # completions not reported


def test_a_scale_down_beyond_the_grace_period_warns_that_it_cuts_answers() -> None:
    """6 replicas, demand for 2 (20 running at 10 per replica): with 0.2 finishing a
    second, answers run 20 / 0.2 = 100 s, past the pods' 30 s grace period."""
    def decide(*, finished: float, grace: float | None, running: float = 20
               ) -> types.Decision:
        sim = Sim(policy(behavior=FAST_DOWN), current=6)
        sim.step(0, with_finished(snap(running=running, waiting=0), finished),
                 grace_period_s=grace)
        assert sim.last is not None
        return sim.last

    cut = decide(finished=0.2, grace=30.0)
    assert cut.desired == 2
    assert cut.cut_warning is not None
    assert "100 s" in cut.cut_warning and "terminationGracePeriodSeconds of 30 s" in (
        cut.cut_warning)
    assert decide(finished=4.0, grace=30.0).cut_warning is None  # 5 s answers drain
    assert decide(finished=0.2, grace=120.0).cut_warning is None  # within the grace
    assert decide(finished=0.2, grace=None).cut_warning is None  # grace period unknown
    up = decide(finished=0.2, grace=30.0, running=100)  # a scale-up cuts nothing
    assert up.desired == 10 and up.cut_warning is None
