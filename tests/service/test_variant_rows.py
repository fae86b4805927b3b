"""Variants, pure parts: a variant its HPA owns mixed at what it holds, the write's owners
read from its outcomes, each variant's status, and node planning per variant's pool."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scaler.actuators import base as actuators
from scaler.engine import cost as engine_cost
from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import loader, model
from scaler.service import arbiter as fleet_arbiter
from scaler.service import conditions, explain
from scaler.service import state as service_state
from scaler.service import variants as service_variants

from . import factories

POOLS = """\
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: h100}
spec: {gpusPerNode: 4, maxNodes: 2, gpuHourly: 2.0}
---
apiVersion: scaler.io/v1alpha1
kind: GpuPool
metadata: {name: l40s}
spec: {gpusPerNode: 4, maxNodes: 1, gpuHourly: 1.0}
"""

# Yardstick 10 requests; H100: 30 on 2 GPUs (4.0/h), L40S: 10 on 1 GPU (1.0/h).
VARIANTS = [
    {"name": "h100", "target": {"name": "chat-h100"}, "nodePool": "h100", "capacity": 30,
     "resources": {"gpusPerReplica": 2}},
    {"name": "l40s", "target": {"name": "chat-l40s"}, "nodePool": "l40s", "capacity": 10},
]
OWNER = "HorizontalPodAutoscaler/chat-h100"


def _fleet() -> policy_fleet.Fleet:
    result = loader.parse_documents(POOLS, "pools.yaml")
    assert not result.errors
    return policy_fleet.fleet_of(result)


def _chat(node_pool: dict[str, object] | None = None) -> model.ScalePolicy:
    spec: dict[str, object] = {"signals": {"concurrency": {"targetPerReplica": 10}},
                               "replicas": {"min": 1, "max": 40}, "variants": VARIANTS}
    if node_pool is not None:
        spec["nodePool"] = node_pool
    return factories.policy("chat", spec=spec)


def _decision(key: str, *, desired: int, ahead: int | None = None) -> types.Decision:
    forecast = None if ahead is None else types.Forecast(
        time_to_ready_s=60.0, needs_node=False, demand_now=desired, slope_per_s=0.0,
        demand_at_ready=ahead, replicas_at_ready=ahead, replicas_at_node_ready=ahead)
    return types.Decision(model=key, at=factories.NOW, current=desired, desired=desired,
                          recommendation=desired, winner=None, signals=(), forecast=forecast)


def test_a_variant_its_hpa_owns_is_mixed_at_what_it_holds() -> None:
    chat = _chat()
    arbiter = fleet_arbiter.Arbiter()
    arbiter.set_fleet(_fleet(), keys={chat.key})
    # A demand of 50; 3 H100 and 4 L40S held. Free: the cheapest cover of what is held,
    # 1 H100 + 2 L40S (6.0/h).
    arbiter.record_variants(chat, _decision(chat.key, desired=5),
                            held={"h100": (3, 0), "l40s": (4, 0)})
    arbiter.arbitrate()
    free = arbiter.mix(chat.key)
    assert free is not None and dict(free.replicas) == {"h100": 1, "l40s": 2}
    # Its HPA holds the 3 H100 (90): counted whole, nothing asked of the L40S.
    assert arbiter.owners(chat.key) is None  # never checked: the next write checks
    assert arbiter.record_owners(chat.key, {"h100": OWNER})
    assert not arbiter.record_owners(chat.key, {"h100": OWNER})
    assert arbiter.arbitrate() == [chat.key]
    owned = arbiter.mix(chat.key)
    assert owned is not None and dict(owned.replicas) == {"h100": 3, "l40s": 0}
    note = arbiter.describe_mix(chat)
    assert note is not None and f"h100 is scaled by {OWNER}: not patched, its 3 held" in note
    # A demand of 130 the HPA's 90 cannot serve: the L40S take the 40 left.
    arbiter.record_variants(chat, _decision(chat.key, desired=13),
                            held={"h100": (3, 0), "l40s": (0, 0)})
    arbiter.arbitrate()
    grown = arbiter.mix(chat.key)
    assert grown is not None and dict(grown.replicas) == {"h100": 3, "l40s": 4}
    # Its HPA removed: the variant is mixed as the others.
    assert arbiter.record_owners(chat.key, {})
    assert arbiter.owners(chat.key) == {}


def _outcome(kind: actuators.Outcome, *, previous: int | None, owner: str | None = None
             ) -> actuators.ApplyOutcome:
    return actuators.ApplyOutcome(kind, "Deployment/inference/x", previous, 1, owner=owner)


def test_a_write_tells_which_variants_an_hpa_owns() -> None:
    chat = _chat()
    skipped = _outcome(actuators.Outcome.SKIPPED_HPA_OWNED, previous=None, owner=OWNER)
    applied = _outcome(actuators.Outcome.APPLIED, previous=0)
    not_leader = _outcome(actuators.Outcome.NOT_LEADER, previous=None)
    assert service_variants.owners_after(chat, [skipped, applied], before={}) == {
        "h100": OWNER}
    # Read past the ownership check: no longer owned. Not the leader: nothing learnt.
    assert service_variants.owners_after(chat, [applied, applied],
                                         before={"h100": OWNER}) == {}
    assert service_variants.owners_after(chat, [not_leader],
                                         before={"h100": OWNER}) == {"h100": OWNER}
    # The rest of the mix written sets the outcome; every variant owned: skipped.
    assert service_variants.combined([skipped, applied]).outcome is actuators.Outcome.APPLIED
    assert service_variants.combined([skipped]).outcome is \
        actuators.Outcome.SKIPPED_HPA_OWNED


def _status(policy: model.ScalePolicy, rows: Sequence[service_state.VariantObservation],
            decision: types.Decision) -> service_state.ModelStatus:
    observation = service_state.Observation(
        decision=decision, snapshot=types.SignalSnapshot(),
        cluster=types.ClusterState(current=decision.current, ready=decision.current),
        at=factories.NOW, variants=tuple(rows))
    return service_state.ModelStatus(policy=policy, last=observation, decisions={},
                                     patches={}, clamps={}, cost=engine_cost.Cost())


def _row(name: str, pool: str, count: int, owner: str | None = None
         ) -> service_state.VariantObservation:
    return service_state.VariantObservation(name=name, target=f"chat-{name}", pool=pool,
                                            desired=count, current=count, ready=count,
                                            starting=0, gpus_per_replica=1, gpu_hourly=1.0,
                                            owner=owner)


def test_status_variants_and_their_condition() -> None:
    chat = _chat()
    rows = [_row("h100", "h100", 3, owner=OWNER), _row("l40s", "l40s", 0)]
    status = _status(chat, rows, _decision(chat.key, desired=9))
    assert status.last is not None
    body = conditions.status(chat, status.last, problems=(), previous=None, generation=1,
                             now=factories.NOW)
    assert body["variants"] == [
        {"name": "h100", "target": "chat-h100", "pool": "h100", "desiredReplicas": 3,
         "currentReplicas": 3, "readyReplicas": 3, "startingReplicas": 0,
         "scaledBy": OWNER},
        {"name": "l40s", "target": "chat-l40s", "pool": "l40s", "desiredReplicas": 0,
         "currentReplicas": 0, "readyReplicas": 0, "startingReplicas": 0}]
    (scaled,) = [c for c in body["conditions"] if c["type"] == "VariantsScaled"]
    assert (scaled["status"], scaled["reason"]) == ("False", "OwnedByHPA")
    # Without variants: no such condition, no status.variants.
    plain = factories.observation()
    body = conditions.status(factories.policy(), plain, problems=(), previous=None,
                             generation=1, now=factories.NOW)
    assert "variants" not in body
    assert "VariantsScaled" not in {c["type"] for c in body["conditions"]}


def test_each_variant_is_planned_on_its_own_pool_with_its_forecast() -> None:
    pools = _fleet().pools
    # A mix of 2 H100 and 4 L40S (pool l40s full) for 100 requests, forecast 120: the 20
    # more go to one more H100 (its pool has room for 4).
    chat = _chat({"name": "h100", "gpusPerNode": 4, "actuator": "placeholder"})
    rows = [_row("h100", "h100", 2), _row("l40s", "l40s", 4)]
    decision = _decision(chat.key, desired=10, ahead=12)
    assert service_variants.variant_forecasts(chat, decision, rows, pools=pools) == {
        "h100": 3, "l40s": 4}
    # Owned, it stays at its count: the forecast goes nowhere else with room.
    owned = [dataclasses.replace(rows[0], owner=OWNER), rows[1]]
    assert service_variants.variant_forecasts(chat, decision, owned, pools=pools) == {
        "h100": 2, "l40s": 4}
    # Another model on pool h100 with its own nodePool: its settings are the pool's.
    other = factories.policy("embed", spec={
        "nodePool": {"name": "h100", "gpusPerNode": 4, "actuator": "clusterapi",
                     "machineDeployment": "h100-md"}})
    statuses = [_status(chat, rows, decision),
                _status(other, [], _decision(other.key, desired=1))]
    h100 = service_variants.pool_members(statuses, "h100", pools=pools)
    assert h100 is not None and h100.pool.actuator == "placeholder"  # chat < embed by key
    assert {(d.model, d.gpus_per_replica, d.replicas, d.forecast_replicas)
            for d in h100.demands} == {("inference/chat#h100", 2, 2, 3),
                                       ("inference/embed", 1, 1, 1)}
    # Pool l40s: no spec.nodePool names it, so chat's settings on the GpuPool's nodes.
    l40s = service_variants.pool_members(statuses, "l40s", pools=pools)
    assert l40s is not None
    assert (l40s.pool.name, l40s.pool.actuator, l40s.pool.max_nodes) == ("l40s",
                                                                          "placeholder", 1)
    assert [(d.model, d.replicas) for d in l40s.demands] == [("inference/chat#l40s", 4)]
    assert service_variants.planned_pools(chat, actuators_by_kind={"placeholder"}) == [
        "h100", "l40s"]
    # Without settings from any policy, a pool is not planned (the cluster autoscaler's).
    bare = _chat()
    assert service_variants.pool_members([_status(bare, rows, decision)], "l40s",
                                         pools=pools) is None


BUDGET = """\
---
apiVersion: scaler.io/v1alpha1
kind: GpuBudget
metadata: {name: batchers}
spec: {tenant: batchers, pool: l40s, maxGpus: 1}
"""


def _batch(*, tier: str = "batch") -> model.ScalePolicy:
    return factories.policy("digest", labels={"tenant": "batchers"}, spec={
        "signals": {"concurrency": {"targetPerReplica": 10}}, "tier": tier,
        "replicas": {"min": 1, "max": 40}, "variants": VARIANTS})


def test_a_batch_mix_keeps_busy_replicas_unless_a_budget_is_exceeded() -> None:
    digest = _batch()
    arbiter = fleet_arbiter.Arbiter()
    arbiter.set_fleet(_fleet(), keys={digest.key})
    held = {"h100": (0, 0), "l40s": (3, 0)}
    # A demand of 10 (one L40S) with 2 of the 3 L40S busy: both kept.
    arbiter.record_variants(digest, _decision(digest.key, desired=1), held=held,
                            busy={"l40s": 2})
    arbiter.arbitrate()
    kept = arbiter.mix(digest.key)
    assert kept is not None and dict(kept.replicas) == {"h100": 0, "l40s": 2}
    note = arbiter.describe_mix(digest)
    assert note is not None and "kept for unfinished work l40s: 2" in note
    # The same as an online model: busy replicas are no reason to keep one.
    online = _batch(tier="online")
    arbiter.set_fleet(_fleet(), keys={online.key})
    arbiter.record_variants(online, _decision(online.key, desired=1), held=held,
                            busy={"l40s": 2})
    arbiter.arbitrate()
    free = arbiter.mix(online.key)
    assert free is not None and dict(free.replicas) == {"h100": 0, "l40s": 1}
    # Its tenant's budget allows 1 GPU of pool l40s: the grant cuts a busy replica.
    result = loader.parse_documents(POOLS + BUDGET, "fleet.yaml")
    assert not result.errors
    arbiter.set_fleet(policy_fleet.fleet_of(result), keys={digest.key})
    arbiter.record_variants(digest, _decision(digest.key, desired=1), held=held,
                            busy={"l40s": 2})
    arbiter.arbitrate()
    cut = arbiter.mix(digest.key)
    assert cut is not None and dict(cut.replicas) == {"h100": 0, "l40s": 1}


def test_each_variant_accrues_its_own_gpus_at_its_own_price() -> None:
    chat = _chat()
    row = dataclasses.replace(_row("h100", "h100", 2), gpus_per_replica=2, gpu_hourly=2.0)
    rows = [row, dataclasses.replace(_row("l40s", "l40s", 4), gpu_hourly=1.0)]
    status = _status(chat, rows, _decision(chat.key, desired=10))
    assert status.last is not None
    # One hour: 2 x 2 + 4 x 1 GPU-hours, costing 8.0 + 4.0 (the model's 10 yardstick
    # replicas of 1 GPU at spec.cost's 2.5 would have read 10 GPU-hours and 25.0).
    hour = factories.NOW + 3600.0
    by_variant = service_state.accrue_variants({}, policy=chat, since=status.last, until=hour)
    assert {n: (c.allocated_gpu_hours, c.cost) for n, c in by_variant.items()} == {
        "h100": (4.0, 8.0), "l40s": (4.0, 4.0)}
    total = service_state.accrue(engine_cost.Cost(), policy=chat, since=status.last, until=hour)
    assert (total.allocated_gpu_hours, total.cost) == (8.0, 12.0)


def test_each_variant_s_cost_is_in_explain_and_status_as_its_counters_hold_it() -> None:
    chat = _chat()
    registry = factories.loaded_state(chat)
    h100 = dataclasses.replace(_row("h100", "h100", 2), gpus_per_replica=2, gpu_hourly=2.0)
    rows = (h100, dataclasses.replace(_row("l40s", "l40s", 4), gpu_hourly=1.0))
    # 50 in flight on the 2 x 30 + 4 x 10 = 100 the ready replicas serve: half busy.
    in_flight = types.SignalValue.assess(50.0, age_s=0.5, stale_after_s=30.0)
    first = service_state.Observation(
        decision=_decision(chat.key, desired=10), snapshot=types.SignalSnapshot(
            in_flight=in_flight), cluster=types.ClusterState(current=10, ready=10),
        at=factories.NOW, variants=rows)
    registry.record(chat.key, first)
    # One hour later: 2 x 2 and 4 x 1 GPU-hours, costing 8.0 and 4.0, half of it idle.
    registry.record(chat.key, dataclasses.replace(first, at=factories.NOW + 3600.0))
    status = registry.status(chat.key)
    assert status is not None and status.last is not None
    counted = {name: (c.allocated_gpu_hours, c.cost, c.idle_cost)
               for name, c in status.variant_costs.items()}  # what /metrics reads
    assert counted == {"h100": (4.0, 8.0, 4.0), "l40s": (4.0, 4.0, 2.0)}

    document = explain.decision_document(status, status.last)
    assert [(r["name"], r["gpu_hours"], r["cost"], r["idle_cost"])
            for r in document["variants"]] == [("h100", 4.0, 8.0, 4.0),
                                               ("l40s", 4.0, 4.0, 2.0)]
    text = explain.describe(document)
    assert ("  - h100 (chat-h100, pool h100): 2 desired, 2 asked for, 2 ready, 0 starting; "
            "since start 4 GPU-hours, cost 8, idle cost 4") in text
    assert "  - l40s (chat-l40s, pool l40s): 4 desired, 4 asked for, 4 ready, 0 starting; " \
           "since start 4 GPU-hours, cost 4, idle cost 2" in text

    body = conditions.status(chat, status.last, problems=(), previous=None, generation=1,
                             now=factories.NOW, variant_costs=status.variant_costs)
    assert [(r["name"], r["gpuHours"], r["cost"], r["idleCost"]) for r in body["variants"]] == [
        ("h100", 4.0, 8.0, 4.0), ("l40s", 4.0, 4.0, 2.0)]
    # Before any accrual (the first evaluation), every variant has cost 0 so far.
    fresh = factories.loaded_state(chat)
    fresh.record(chat.key, first)
    early = fresh.status(chat.key)
    assert early is not None and early.last is not None
    assert {(r["gpu_hours"], r["cost"], r["idle_cost"]) for r in
            explain.decision_document(early, early.last)["variants"]} == {(0.0, 0.0, 0.0)}


def test_an_unchanged_mix_is_written_once_per_recheck_interval_to_check_its_owners() -> None:
    chat = _chat()
    held = _decision(chat.key, desired=2)
    items = [(view, held) for view in service_variants.views(chat, pools={})]
    interval = service_variants.OWNER_RECHECK_S
    checked = factories.NOW

    def pending(owners: dict[str, str] | None, *, after_s: float,
                at: float | None = checked) -> bool:
        return service_variants.pending(items, owners=owners, checked_at=at,
                                        now=checked + after_s)

    assert not pending({}, after_s=interval - 0.5)  # checked, none owned, no count changed
    assert pending({}, after_s=interval)  # time to check again
    assert pending({}, after_s=-60.0)  # the wall clock was set back past the check
    assert pending({}, after_s=0.0, at=None)  # never fully checked
    assert pending(None, after_s=0.0)  # owners never read
    assert pending({"h100": OWNER}, after_s=0.0)  # an owner known: whether it is still
    changed = [(view, dataclasses.replace(held, desired=3)) for view, _ in items]
    assert service_variants.pending(changed, owners={}, checked_at=checked, now=checked)
    # A full check is one outcome per variant, each past the ownership check.
    skipped = _outcome(actuators.Outcome.SKIPPED_HPA_OWNED, previous=None, owner=OWNER)
    unchanged = _outcome(actuators.Outcome.UNCHANGED, previous=2)
    failed = _outcome(actuators.Outcome.FAILED, previous=None)
    assert service_variants.every_owner_checked(chat, [skipped, unchanged])
    assert not service_variants.every_owner_checked(chat, [unchanged])  # stopped early
    assert not service_variants.every_owner_checked(chat, [unchanged, failed])
