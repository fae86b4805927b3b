"""Fleet arbitration: tables of (pools, budgets, asks) -> grants, and Hypothesis properties."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core import vocabulary
from scaler.engine import decide as engine_decide
from scaler.engine import fleet, types
from tests.engine.helpers import policy, snap

ONLINE, BATCH, DEV = vocabulary.Tier.ONLINE, vocabulary.Tier.BATCH, vocabulary.Tier.DEV


def ask(key: str, desired: int, *, tier: vocabulary.Tier = ONLINE, pool: str | None = "p",
        tenant: str | None = None, cost_center: str | None = None, gpr: int = 1,
        floor: int = 0, current: int | None = None) -> fleet.Ask:
    return fleet.Ask(key=key, pool=pool, tier=tier, tenant=tenant, cost_center=cost_center,
                     gpus_per_replica=gpr, floor=floor, desired=desired,
                     current=desired if current is None else current)


def pool(gpus: int, reserved: int = 0, name: str = "p") -> fleet.FleetPool:
    return fleet.FleetPool(name=name, gpus=gpus, reserved=reserved)


def budget(name: str, *, guaranteed: int = 0, ceiling: int | None = None, borrow: bool = True,
           pool_name: str | None = None, cost_center: bool = False) -> fleet.BudgetRule:
    return fleet.BudgetRule(name=name, tenant=None if cost_center else name,
                            cost_center=name if cost_center else None, pool=pool_name,
                            guaranteed=guaranteed, ceiling=ceiling, borrow=borrow)


def replicas(grants: dict[str, fleet.Grant]) -> dict[str, int]:
    return {key: grant.replicas for key, grant in grants.items()}


TABLE = [
    pytest.param([pool(16)], [], [ask("ns/a", 4), ask("ns/b", 6)], {"ns/a": 4, "ns/b": 6},
                 id="room-for-all"),
    pytest.param([pool(10)], [], [ask("ns/a", 8, tier=BATCH), ask("ns/b", 8, tier=BATCH)],
                 {"ns/a": 5, "ns/b": 5}, id="a-tier-short-shares-evenly"),
    pytest.param([pool(8)], [], [ask("ns/a", 4, tier=BATCH), ask("ns/b", 12, tier=BATCH)],
                 {"ns/a": 2, "ns/b": 6}, id="shortfall-in-proportion-to-asks"),
    pytest.param([pool(9)], [], [ask("ns/a", 8, tier=BATCH), ask("ns/b", 8, tier=BATCH)],
                 {"ns/a": 5, "ns/b": 4}, id="odd-replica-to-the-first-key"),
    pytest.param([pool(12)], [], [ask("ns/on", 6, tier=ONLINE), ask("ns/ba", 6, tier=BATCH),
                                  ask("ns/dev", 6, tier=DEV)],
                 {"ns/on": 6, "ns/ba": 6, "ns/dev": 0}, id="online-then-batch-then-dev"),
    pytest.param([pool(8)], [], [ask("ns/on", 6), ask("ns/ba", 6, tier=BATCH, floor=3)],
                 {"ns/on": 5, "ns/ba": 3}, id="a-floor-is-never-cut-for-a-higher-tier"),
    pytest.param([pool(4)], [], [ask("ns/a", 4, floor=3), ask("ns/b", 4, tier=BATCH,
                                                               floor=3)],
                 {"ns/a": 3, "ns/b": 3}, id="floors-above-the-pool-are-kept"),
    pytest.param([pool(64, reserved=16)], [], [ask("ns/a", 64)], {"ns/a": 48},
                 id="reservation-never-granted"),
    pytest.param([pool(12)], [], [ask("ns/tp", 2, gpr=8), ask("ns/small", 8, tier=BATCH)],
                 {"ns/tp": 1, "ns/small": 4}, id="whole-tensor-parallel-replicas"),
    pytest.param([pool(16)], [budget("a", guaranteed=8), budget("b", guaranteed=0)],
                 [ask("ns/a", 8, tenant="a", tier=BATCH), ask("ns/b", 16, tenant="b")],
                 {"ns/a": 8, "ns/b": 8}, id="a-batch-guarantee-before-online-borrowing"),
    pytest.param([pool(16)], [budget("a", guaranteed=8), budget("b")],
                 [ask("ns/a", 2, tenant="a"), ask("ns/b", 16, tenant="b")],
                 {"ns/a": 2, "ns/b": 14}, id="idle-guarantee-is-borrowed"),
    pytest.param([pool(16)], [budget("a", guaranteed=8), budget("b", borrow=False,
                                                               guaranteed=4)],
                 [ask("ns/a", 2, tenant="a"), ask("ns/b", 16, tenant="b")],
                 {"ns/a": 2, "ns/b": 4}, id="no-borrowing-stops-at-the-guarantee"),
    pytest.param([pool(32)], [budget("a", guaranteed=4, ceiling=10)],
                 [ask("ns/a1", 8, tenant="a"), ask("ns/a2", 8, tenant="a")],
                 {"ns/a1": 5, "ns/a2": 5}, id="ceiling-over-a-tenant's-models"),
    pytest.param([pool(32), pool(32, name="q")], [budget("a", ceiling=10)],
                 [ask("ns/a1", 8, tenant="a"), ask("ns/a2", 8, tenant="a", pool="q")],
                 {"ns/a1": 5, "ns/a2": 5}, id="a-budget-on-every-pool-spans-them"),
    pytest.param([pool(32), pool(32, name="q")], [budget("a", ceiling=4, pool_name="q")],
                 [ask("ns/a1", 8, tenant="a"), ask("ns/a2", 8, tenant="a", pool="q")],
                 {"ns/a1": 8, "ns/a2": 4}, id="a-pool-budget-covers-its-pool-only"),
    pytest.param([pool(32)], [budget("a", ceiling=12),
                              budget("cc", ceiling=6, cost_center=True)],
                 [ask("ns/a", 10, tenant="a", cost_center="cc")], {"ns/a": 6},
                 id="the-tightest-of-two-budgets"),
    pytest.param([pool(4)], [budget("a", ceiling=2)], [ask("ns/a", 4, tenant="a", floor=3)],
                 {"ns/a": 3}, id="a-floor-over-a-ceiling-is-kept"),
    pytest.param([pool(4)], [], [ask("ns/elsewhere", 9, pool="other"),
                                 ask("ns/nopool", 7, pool=None)],
                 {"ns/elsewhere": 9, "ns/nopool": 7}, id="unknown-pools-pass-through"),
    pytest.param([], [budget("a", ceiling=3)], [ask("ns/a", 9, tenant="a", pool=None)],
                 {"ns/a": 3}, id="a-budget-holds-a-model-on-no-pool"),
    pytest.param([pool(8)], [], [ask("ns/a", 0, floor=2)], {"ns/a": 2},
                 id="an-ask-below-its-floor-gets-the-floor"),
]


@pytest.mark.parametrize(("pools", "budgets", "asks", "expected"), TABLE)
def test_arbitration_table(pools: list[fleet.FleetPool], budgets: list[fleet.BudgetRule],
                           asks: list[fleet.Ask], expected: dict[str, int]) -> None:
    assert replicas(fleet.arbitrate(pools, budgets, asks)) == expected


def test_the_owner_takes_its_guarantee_back_the_next_cycle() -> None:
    pools, budgets = [pool(16)], [budget("a", guaranteed=8), budget("b")]
    idle = fleet.arbitrate(pools, budgets, [ask("ns/a", 2, tenant="a", tier=BATCH),
                                            ask("ns/b", 16, tenant="b", current=0)])
    assert replicas(idle) == {"ns/a": 2, "ns/b": 14}
    assert idle["ns/b"].borrowed_gpus == 14
    # The owner asks its whole guarantee: the borrower is cut by 6 at once.
    back = fleet.arbitrate(pools, budgets, [ask("ns/a", 8, tenant="a", tier=BATCH, current=2),
                                            ask("ns/b", 16, tenant="b", current=14)])
    assert replicas(back) == {"ns/a": 8, "ns/b": 8}
    assert back["ns/b"].reason == ("capped by pool p: 16 of 16 GPUs; granted 8 of 16 GPUs "
                                   "asked; gave 6 to batch model ns/a")
    assert back["ns/a"].reason == ("granted all 8 GPUs asked on pool p; "
                                   "online model ns/b gave 6")


def test_a_capped_model_is_told_who_gave_what() -> None:
    grants = fleet.arbitrate([pool(20)], [budget("search", guaranteed=16, ceiling=16)],
                             [ask("ns/y", 20, tenant="search", current=14),
                              ask("ns/x", 6, tier=BATCH, current=6)])
    assert grants["ns/y"].cap_gpus == 16
    assert grants["ns/y"].reason == ("capped by tenant search: 16 of 16 GPUs; granted 16 of "
                                     "20 GPUs asked; batch model ns/x gave 2")
    assert grants["ns/x"].replicas == 4
    assert grants["ns/x"].reason.endswith("gave 2 to online model ns/y")


def test_reasons_name_the_binding_limit() -> None:
    grants = fleet.arbitrate(
        [pool(64, reserved=16), pool(4, name="tiny"), pool(100, name="roomy")],
        [budget("nb", guaranteed=2, borrow=False),
         budget("ai-h100", cost_center=True, ceiling=3)],
        [ask("ns/big", 64), ask("ns/nb", 8, tenant="nb", pool="roomy"),
         ask("ns/cc", 8, cost_center="ai-h100", pool="roomy"),
         ask("ns/tp", 1, gpr=8, pool="tiny"),
         ask("ns/floors", 8, pool="tiny", floor=6, tier=DEV)])
    assert grants["ns/big"].reason == ("capped by pool p: 48 of 48 GPUs (64 less 16 "
                                       "reserved); granted 48 of 64 GPUs asked")
    assert grants["ns/nb"].reason == ("capped by tenant nb at its guarantee: 2 of 2 GPUs, "
                                      "no borrowing; granted 2 of 8 GPUs asked")
    assert grants["ns/cc"].reason == ("capped by cost centre ai-h100: 3 of 3 GPUs; "
                                      "granted 3 of 8 GPUs asked")
    assert grants["ns/tp"].reason == ("floors alone need 6 GPUs of pool tiny's 4: floors "
                                      "kept, nothing more granted; granted 0 of 8 GPUs asked")
    assert grants["ns/floors"].replicas == 6
    assert fleet.BudgetRule(name="ai-h100", cost_center="ai").label == \
        "cost centre ai (budget ai-h100)"


def test_a_replica_that_does_not_fit_says_so() -> None:
    grants = fleet.arbitrate([pool(12)], [], [ask("ns/tp", 2, gpr=8)])
    assert grants["ns/tp"].reason == ("capped by pool p: 8 of 12 GPUs, 4 left are under one "
                                      "replica of 8; granted 8 of 16 GPUs asked")


def test_pass_through_has_no_cap() -> None:
    grants = fleet.arbitrate([pool(4)], [], [ask("ns/x", 9, pool="other")])
    assert grants["ns/x"] == fleet.Grant(key="ns/x", replicas=9, cap_gpus=None, reason="")


def test_input_order_does_not_matter() -> None:
    asks = [ask(f"ns/m{i}", 3 + i % 5, tier=list(vocabulary.Tier)[i % 3], gpr=1 + i % 2,
                tenant="t" if i % 4 == 0 else None, floor=i % 2) for i in range(30)]
    pools, budgets = [pool(40)], [budget("t", guaranteed=6, ceiling=12)]
    expected = fleet.arbitrate(pools, budgets, asks)
    shuffled = list(asks)
    random.Random(7).shuffle(shuffled)
    assert fleet.arbitrate(pools, budgets, shuffled) == expected


@pytest.mark.parametrize(("asks", "message"), [
    ([ask("ns/a", 1, gpr=0)], "ask ns/a: gpus_per_replica must be at least 1, not 0"),
    ([ask("ns/a", -1)], "ask ns/a: desired must not be negative, not -1"),
    ([ask("ns/a", 1), ask("ns/a", 2)], "ask ns/a: named twice"),
])
def test_bad_asks_are_named(asks: list[fleet.Ask], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fleet.arbitrate([pool(4)], [], asks)


def test_bad_pools_and_budgets_are_named() -> None:
    with pytest.raises(ValueError, match="pool p: named twice"):
        fleet.arbitrate([pool(4), pool(8)], [], [])
    with pytest.raises(ValueError, match="budget a: named twice"):
        fleet.arbitrate([], [budget("a"), budget("a")], [])
    with pytest.raises(ValueError, match="pool p: GPUs and reserved GPUs must not be "
                                         "negative, not 4 and -1"):
        fleet.arbitrate([pool(4, reserved=-1)], [], [])
    with pytest.raises(ValueError, match="budget b: set exactly one of tenant and "
                                         "cost_center"):
        fleet.arbitrate([], [fleet.BudgetRule(name="b", tenant="t", cost_center="c")], [])
    with pytest.raises(ValueError, match="budget a: guaranteed and ceiling must not be "
                                         "negative, not -2 and None"):
        fleet.arbitrate([], [budget("a", guaranteed=-2)], [])


def test_an_ask_reads_the_decision_before_the_fleet_cap() -> None:
    capped = policy(replicas={"min": 1, "max": 20}, resources={"gpusPerReplica": 2},
                    nodePool={"name": "h100", "gpusPerNode": 8})
    cluster = types.ClusterState(current=2, ready=2, budget_gpus=8, budget_reason="test cap")
    decision, _ = engine_decide.decide(capped, snapshot=snap(running=100), cluster=cluster,
                                       state=types.EngineState(), now=0.0)
    assert decision.desired == 4  # 8 GPUs / 2 per replica
    external = [c for c in decision.clamps if c.name is types.ClampName.EXTERNAL_BUDGET]
    assert external and "test cap" in external[0].detail
    built = fleet.ask_of(capped, decision, now=0.0)
    assert (built.desired, built.floor, built.pool, built.tier, built.gpus_per_replica) == \
        (10, 1, "h100", ONLINE, 2)


# -- properties ---------------------------------------------------------------------------

TENANTS = ("t0", "t1", "t2")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[fleet.FleetPool], list[fleet.BudgetRule],
                                     list[fleet.Ask]]:
    pools = [fleet.FleetPool(name=name, gpus=draw(st.integers(0, 48)),
                                reserved=draw(st.integers(0, 8))) for name in ("p", "q")]
    budgets = [fleet.BudgetRule(name=tenant, tenant=tenant,
                                pool=draw(st.sampled_from(["p", "q"])),
                                guaranteed=draw(st.integers(0, 16)),
                                ceiling=draw(st.one_of(st.none(), st.integers(0, 40))),
                                borrow=draw(st.booleans()))
               for tenant in draw(st.sets(st.sampled_from(TENANTS)))]
    asks = []
    for index in range(draw(st.integers(0, 10))):
        floor = draw(st.integers(0, 3))
        asks.append(fleet.Ask(
            key=f"ns/m{index}", pool=draw(st.sampled_from(["p", "q", None])),
            tier=draw(st.sampled_from(list(vocabulary.Tier))),
            tenant=draw(st.one_of(st.none(), st.sampled_from(TENANTS))), cost_center=None,
            gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])), floor=floor,
            desired=draw(st.integers(0, 12)), current=draw(st.integers(0, 12))))
    return pools, budgets, asks


@settings(max_examples=250, deadline=None)
@given(fleets())
def test_arbitration_properties(
    case: tuple[list[fleet.FleetPool], list[fleet.BudgetRule], list[fleet.Ask]],
) -> None:
    pools, budgets, asks = case
    grants = fleet.arbitrate(pools, budgets, asks)
    assert set(grants) == {a.key for a in asks}
    by_key = {a.key: a for a in asks}
    covering = {a.key: [b for b in budgets if b.covers(a)] for a in asks}

    def gpus(key: str) -> int:
        return grants[key].replicas * by_key[key].gpus_per_replica

    for a in asks:
        grant = grants[a.key]
        if grant.cap_gpus is None:  # not arbitrated: its own decision stands
            assert grant.replicas == a.desired
            continue
        # Never below a floor; never above the ask (or the floor when it asks less).
        assert a.floor <= grant.replicas <= max(a.desired, a.floor)
        assert grant.cap_gpus == gpus(a.key)
    for p in pools:
        members = [a for a in asks if a.pool == p.name]
        floors = sum(a.floor * a.gpus_per_replica for a in members)
        # Never above a pool's GPUs less reservations, except floors.
        assert sum(gpus(a.key) for a in members) <= max(p.grantable, floors)
    for b in budgets:
        members = [a for a in asks if b.covers(a)]
        held = sum(gpus(a.key) for a in members)
        floors = sum(a.floor * a.gpus_per_replica for a in members)
        if b.ceiling is not None:
            assert held <= max(b.ceiling, floors)  # never above a ceiling
        if not b.borrow:  # nor, without borrowing, above its guarantee
            assert held <= max(b.guaranteed, floors)
        # A guarantee is honoured when its owner asks, up to whole replicas, wherever the
        # pool can hold every budget's guarantee (or floors) plus the floors of the rest.
        target = b.guaranteed if b.ceiling is None else min(b.guaranteed, b.ceiling)
        same_pool = [a for a in asks if a.pool == b.pool]
        others = sum(a.floor * a.gpus_per_replica for a in same_pool if not covering[a.key])
        claims = sum(max(c.guaranteed, sum(a.floor * a.gpus_per_replica for a in asks
                                           if c.covers(a)))
                     for c in budgets if c.pool == b.pool)
        capacity = next(p.grantable for p in pools if p.name == b.pool)
        if claims + others <= capacity:
            for a in members:
                if grants[a.key].replicas < max(a.desired, a.floor):
                    assert held + a.gpus_per_replica > target or \
                        _over_a_ceiling(a, covering[a.key], grants, by_key)
    # Online is never cut while a lower tier on its pool holds borrowed GPUs it could use.
    for a in asks:
        grant = grants[a.key]
        if (a.tier is not ONLINE or a.pool not in {p.name for p in pools}
                or grant.replicas >= max(a.desired, a.floor)
                or not all(b.borrow for b in covering[a.key])
                or _over_a_ceiling(a, covering[a.key], grants, by_key)):
            continue
        lower = sum(grants[o.key].borrowed_gpus for o in asks
                    if o.pool == a.pool and o.tier is not ONLINE)
        capacity = next(p.grantable for p in pools if p.name == a.pool)
        left = capacity - sum(gpus(o.key) for o in asks if o.pool == a.pool)
        assert max(0, left) + lower < a.gpus_per_replica


def _over_a_ceiling(a: fleet.Ask, covering: list[fleet.BudgetRule],
                    grants: dict[str, fleet.Grant], by_key: dict[str, fleet.Ask]) -> bool:
    """Whether one more replica of `a` would pass a ceiling of one of its budgets."""
    for b in covering:
        held = sum(grants[k].replicas * o.gpus_per_replica for k, o in by_key.items()
                   if b.covers(o))
        if b.ceiling is not None and held + a.gpus_per_replica > b.ceiling:
            return True
    return False


@settings(max_examples=100, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_arbitration_is_deterministic(
    case: tuple[list[fleet.FleetPool], list[fleet.BudgetRule], list[fleet.Ask]],
    shuffler: random.Random,
) -> None:
    pools, budgets, asks = case
    expected = fleet.arbitrate(pools, budgets, asks)
    shuffled = [dataclasses.replace(a) for a in asks]
    shuffler.shuffle(shuffled)
    shuffler.shuffle(budgets)
    assert fleet.arbitrate(list(reversed(pools)), budgets, shuffled) == expected
