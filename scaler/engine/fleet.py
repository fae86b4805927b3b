"""Fleet arbitration: one pure step over every model's ask, against shared GPU pools and budgets.

After each model's own decision (`decide`), `arbitrate` divides each pool among its models
and returns, per model, the replicas granted and the cap to pass into its next decision as
`ClusterState.budget_gpus` (with `Grant.reason` as `ClusterState.budget_reason`). Every
cycle recomputes from the asks alone, so nothing is remembered: capacity a borrower took is
given back the moment its owner asks, because the owner's guarantee is served before any
borrowing on the next call.

Order, each step on what the steps before left:
1. Floors (max(min, warm floor)): a floor is a safety bound and is never cut, not by a
   pool nor by a budget ceiling. If floors alone exceed a pool, the reasons say so and
   nothing more is granted there.
2. Guarantees: each budget's `guaranteed` GPUs to its own models, tier by tier (online,
   then batch, then dev; within a tier budgets by name).
3. Borrowing: what is left of each pool (its GPUs, minus reservations, minus all granted so
   far) tier by tier to models whose every budget may borrow, or that have none, up to each
   ceiling. What is left includes the idle part of guarantees (an owner asking less than its
   guarantee): that is what borrowing means, and step 2 of the next cycle takes it back.

Within one step and tier, replicas go one at a time to the model with the smallest share of
its ask met (granted / asked, ties by key): water-filling, so a shortfall is shared in
proportion to the asks (asks of 4 and 12 replicas on 8 free: 2 and 6), and the outcome
does not depend on the order of the input. Tensor-parallel models take whole replicas: with
12 GPUs left, an 8-GPU replica fits once and the 4 GPUs over go to a smaller model.
Reservations (training) are never granted, except where floors alone already exceed them.

A cap equals the grant, so caps on a pool never sum above it: a model that wants more than
its last grant is clamped once, asks again uncapped (`uncapped_desired`), and is granted
more at the next arbitration. The service re-arbitrates after any ask changes and
re-evaluates the models whose cap moved, so that wait is one evaluation, not one period.

Models on no known pool and under no budget pass through unchanged (cap None). A model
under a budget but on no known pool is held to its budgets only.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scaler.core import vocabulary
from scaler.engine import spec as engine_spec
from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import model

TIER_ORDER: tuple[vocabulary.Tier, ...] = tuple(vocabulary.Tier)
"""Tiers in the order they are served (the enum's order: online, batch, dev)."""
_TIER_RANK = {tier: rank for rank, tier in enumerate(TIER_ORDER)}


@dataclass(frozen=True, slots=True)
class FleetPool:
    """A GPU pool now: `gpus` usable (healthy, schedulable), of which `reserved` are held
    for work the scaler does not scale (training) and never granted."""

    name: str
    gpus: int
    reserved: int = 0

    @property
    def grantable(self) -> int:
        """GPUs the scaled models may share: 64 usable less 16 reserved -> 48."""
        return max(0, self.gpus - self.reserved)


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A tenant's or cost centre's budget (exactly one of the two is set).

    pool: the pool it covers (None: every pool). guaranteed: GPUs its models get before any
    borrowing. ceiling: GPUs its models may hold in all (None: no ceiling beyond the pools).
    borrow: whether its models may go beyond the guarantee (into unguaranteed capacity and
    others' idle guarantees), up to the ceiling.
    """

    name: str
    tenant: str | None = None
    cost_center: str | None = None
    pool: str | None = None
    guaranteed: int = 0
    ceiling: int | None = None
    borrow: bool = False

    def covers(self, ask: Ask) -> bool:
        owner = ((self.tenant is not None and self.tenant == ask.tenant)
                 or (self.cost_center is not None and self.cost_center == ask.cost_center))
        return owner and (self.pool is None or self.pool == ask.pool)

    @property
    def label(self) -> str:
        """'tenant search', or 'cost centre ai (budget ai-h100)' when the names differ."""
        who = (f"tenant {self.tenant}" if self.tenant is not None
               else f"cost centre {self.cost_center}")
        owner = self.tenant if self.tenant is not None else self.cost_center
        return who if owner == self.name else f"{who} (budget {self.name})"


@dataclass(frozen=True, slots=True)
class Ask:
    """One model's own decision, as arbitration reads it.

    desired: replicas its decision wants before any fleet cap (`uncapped_desired`);
    floor: max(min, warm floor) now, in replicas; current: replicas it holds now (only for
    saying who gave what).
    """

    key: str
    pool: str | None
    tier: vocabulary.Tier
    tenant: str | None
    cost_center: str | None
    gpus_per_replica: int
    floor: int
    desired: int
    current: int


@dataclass(frozen=True, slots=True)
class Grant:
    """What one model may hold: `replicas` (never below its floor), `cap_gpus` to pass as
    `ClusterState.budget_gpus` (None: not arbitrated, no cap), and why.

    borrowed_gpus: the part granted beyond its floor and guarantees (from unguaranteed or
    idle guaranteed capacity), the first given back when an owner asks.
    """

    key: str
    replicas: int
    cap_gpus: int | None
    reason: str
    borrowed_gpus: int = 0


def uncapped_desired(decision: types.Decision) -> int:
    """The replicas a decision wanted before the fleet's cap: the EXTERNAL_BUDGET clamp's
    `before` when it clamped, else `desired`. An ask must be this, or a model capped once
    would ask for its cap for ever."""
    for clamp in decision.clamps:
        if clamp.name is types.ClampName.EXTERNAL_BUDGET:
            return clamp.before
    return decision.desired


def ask_of(policy: model.ScalePolicy, decision: types.Decision, *, now: float) -> Ask:
    """A model's ask from its policy and latest decision (floor taken at `now`)."""
    return ask_from(policy, desired=uncapped_desired(decision), current=decision.current,
                    now=now)


def ask_from(policy: model.ScalePolicy, *, desired: int, current: int, now: float) -> Ask:
    """A model's ask from its policy and the numbers of a decision (`ask_of`; another
    shard's decision, sent as numbers: the service's relay)."""
    spec = engine_spec.resolve(policy)
    pool = policy.spec.node_pool
    return Ask(key=policy.key, pool=None if pool is None else pool.name,
               tier=policy.spec.tier, tenant=policy.tenant, cost_center=policy.cost_center,
               gpus_per_replica=spec.gpus_per_replica, floor=spec.floor_at(now)[0],
               desired=desired, current=current)


@dataclass(slots=True, eq=False)
class _Slot:
    """One arbitrated model while arbitration runs."""

    ask: Ask
    want: int  # replicas: max(desired, floor)
    budgets: tuple[BudgetRule, ...]
    rank: int  # position of its tier in TIER_ORDER
    gpr: int  # GPUs per replica
    pool: str | None  # its pool, when arbitration knows it
    ceilings: tuple[tuple[str, int], ...]  # (budget, ceiling) of its budgets that have one
    granted: int = 0
    borrowed: int = 0  # replicas granted in step 3
    gave: list[str] = field(default_factory=list)  # 'batch model ns/x gave 2'


@dataclass(slots=True)
class _Ledger:
    """GPUs left per pool and GPUs held per budget, as the steps grant."""

    pool_left: dict[str, int]
    held: dict[str, int]

    def room(self, slot: _Slot, *, guarantee: BudgetRule | None) -> int:
        """Whole replicas `slot` may still get (up to its ask): the pool's left, every
        ceiling of its budgets, and in step 2 the guarantee being served."""
        # The hot loop of arbitration (one call per replica granted): no allocation.
        held = self.held
        gpus = self.pool_left[slot.pool] if slot.pool is not None else None
        for name, ceiling in slot.ceilings:
            if gpus is None or ceiling - held[name] < gpus:
                gpus = ceiling - held[name]
        if guarantee is not None:
            left = guarantee.guaranteed - held[guarantee.name]
            gpus = left if gpus is None else min(gpus, left)
        wanted = slot.want - slot.granted
        return wanted if gpus is None else max(0, min(wanted, gpus // slot.gpr))

    def fits(self, slots: Sequence[_Slot], *, guarantee: BudgetRule | None) -> bool:
        """Whether every slot's whole remaining ask fits at once (most steps, when a pool
        is not short: then no water-filling is needed)."""
        need_pool: dict[str, int] = {}
        need_budget: dict[str, int] = {}
        total = 0
        for slot in slots:
            gpus = (slot.want - slot.granted) * slot.gpr
            total += gpus
            if slot.pool is not None:
                need_pool[slot.pool] = need_pool.get(slot.pool, 0) + gpus
            for name, _ in slot.ceilings:
                need_budget[name] = need_budget.get(name, 0) + gpus
        if guarantee is not None and total > guarantee.guaranteed - self.held[guarantee.name]:
            return False
        ceilings = {name: ceiling for slot in slots for name, ceiling in slot.ceilings}
        return (all(need <= self.pool_left[pool] for pool, need in need_pool.items())
                and all(need <= ceilings[name] - self.held[name]
                        for name, need in need_budget.items()))

    def take(self, slot: _Slot, replicas: int, *, borrowed: bool = False) -> None:
        gpus = replicas * slot.gpr
        slot.granted += replicas
        if borrowed:
            slot.borrowed += replicas
        if slot.pool is not None:
            self.pool_left[slot.pool] -= gpus
        for budget in slot.budgets:
            self.held[budget.name] += gpus


def arbitrate(
    pools: Iterable[FleetPool], budgets: Iterable[BudgetRule], asks: Iterable[Ask]
) -> dict[str, Grant]:
    """Grants for every ask, by key (see the module docstring for the rules)."""
    pool_list = list(pools)
    budget_list = sorted(budgets, key=lambda budget: budget.name)
    ask_list = sorted(asks, key=lambda ask: ask.key)
    _unique_names([pool.name for pool in pool_list], "pool")
    _unique_names([budget.name for budget in budget_list], "budget")
    _unique_names([ask.key for ask in ask_list], "ask")
    for pool in pool_list:
        if pool.gpus < 0 or pool.reserved < 0:
            raise ValueError(f"pool {pool.name}: GPUs and reserved GPUs must not be negative, "
                             f"not {pool.gpus} and {pool.reserved}")
    for budget in budget_list:
        if (budget.tenant is None) == (budget.cost_center is None):
            raise ValueError(f"budget {budget.name}: set exactly one of tenant and "
                             "cost_center")
        if budget.guaranteed < 0 or (budget.ceiling is not None and budget.ceiling < 0):
            raise ValueError(f"budget {budget.name}: guaranteed and ceiling must not be "
                             f"negative, not {budget.guaranteed} and {budget.ceiling}")
    pool_by_name = {pool.name: pool for pool in pool_list}
    owners: dict[tuple[str, str | None], list[BudgetRule]] = {}
    for budget in budget_list:  # by name, so each list stays in name order
        owner = (("tenant", budget.tenant) if budget.tenant is not None
                 else ("cost-center", budget.cost_center))
        owners.setdefault(owner, []).append(budget)
    grants: dict[str, Grant] = {}
    slots: list[_Slot] = []
    by_tier: list[list[_Slot]] = [[] for _ in TIER_ORDER]
    guaranteed: dict[tuple[int, str], list[_Slot]] = {}  # (tier rank, budget) -> members
    for ask in ask_list:
        _check(ask)
        covering = _covering(owners, ask)
        if ask.pool not in pool_by_name and not covering:
            grants[ask.key] = Grant(key=ask.key, replicas=ask.desired, cap_gpus=None,
                                    reason="")
            continue
        slot = _Slot(ask=ask, want=max(ask.desired, ask.floor), budgets=covering,
                     rank=_TIER_RANK[ask.tier], gpr=ask.gpus_per_replica,
                     pool=ask.pool if ask.pool in pool_by_name else None,
                     ceilings=tuple((b.name, b.ceiling) for b in covering
                                    if b.ceiling is not None))
        slots.append(slot)
        by_tier[slot.rank].append(slot)
        for budget in covering:
            if budget.guaranteed > 0:
                guaranteed.setdefault((slot.rank, budget.name), []).append(slot)
    ledger = _Ledger(pool_left={name: pool.grantable for name, pool in pool_by_name.items()},
                     held={budget.name: 0 for budget in budget_list})
    # 1. Floors, never cut.
    for slot in slots:
        ledger.take(slot, slot.ask.floor)
    floors_over = {name: -left for name, left in ledger.pool_left.items() if left < 0}
    # 2. Guarantees, tier by tier, budgets by name.
    for rank in range(len(TIER_ORDER)):
        for budget in budget_list:
            members = guaranteed.get((rank, budget.name))
            if members:
                _fill(members, ledger, guarantee=budget)
    # 3. Borrowing what is left, tier by tier.
    for tier_slots in by_tier:
        _fill([s for s in tier_slots if all(b.borrow for b in s.budgets)], ledger,
              guarantee=None)
    _attribute(slots)
    for slot in slots:
        grants[slot.ask.key] = Grant(
            key=slot.ask.key, replicas=slot.granted, cap_gpus=slot.granted * slot.gpr,
            reason=_reason(slot, ledger, pool_by_name, floors_over),
            borrowed_gpus=slot.borrowed * slot.gpr)
    return grants


def _covering(owners: Mapping[tuple[str, str | None], list[BudgetRule]], ask: Ask
              ) -> tuple[BudgetRule, ...]:
    """The budgets that cover `ask`, by name: its tenant's and cost centre's, on its pool
    or on every pool."""
    by_tenant = owners.get(("tenant", ask.tenant), ()) if ask.tenant is not None else ()
    by_center = (owners.get(("cost-center", ask.cost_center), ())
                 if ask.cost_center is not None else ())
    if not by_tenant and not by_center:
        return ()
    found = [b for b in (*by_tenant, *by_center) if b.covers(ask)]
    if by_tenant and by_center:
        found.sort(key=lambda budget: budget.name)
    return tuple(found)


def _unique_names(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} {name}: named twice")
        seen.add(name)


def _check(ask: Ask) -> None:
    if ask.gpus_per_replica < 1:
        raise ValueError(f"ask {ask.key}: gpus_per_replica must be at least 1, "
                         f"not {ask.gpus_per_replica}")
    for name in ("floor", "desired", "current"):
        if getattr(ask, name) < 0:
            raise ValueError(f"ask {ask.key}: {name} must not be negative, "
                             f"not {getattr(ask, name)}")


def _fill(slots: Sequence[_Slot], ledger: _Ledger, *, guarantee: BudgetRule | None) -> None:
    """Water-fill: replicas to the slot with the smallest share of its ask met (ties by
    key) until each has its ask or no room is left for another of its replicas.

    Several replicas go at once while the slot stays the smallest share: with shares 0/4
    (this slot) and 1/2 next, it takes ceil(1/2 x 4) - 0 = 2 before the next is served,
    exactly as one at a time would.
    """
    pending = [s for s in slots if s.granted < s.want]
    borrowed = guarantee is None
    if ledger.fits(pending, guarantee=guarantee):
        for slot in pending:
            ledger.take(slot, slot.want - slot.granted, borrowed=borrowed)
        return
    heap = [(s.granted / s.want, s.ask.key, index) for index, s in enumerate(pending)]
    heapq.heapify(heap)
    while heap:
        _, _, index = heapq.heappop(heap)
        slot = pending[index]
        room = ledger.room(slot, guarantee=guarantee)
        if room < 1:
            continue  # ledgers only shrink: it will not fit later in this step either
        if heap:
            following = pending[heap[0][2]]
            # The least granted count whose share reaches the following slot's share.
            level = -(-following.granted * slot.want // following.want)
            room = min(room, max(1, level - slot.granted))
        ledger.take(slot, room, borrowed=borrowed)
        if slot.granted < slot.want:
            heapq.heappush(heap, (slot.granted / slot.want, slot.ask.key, index))


def _attribute(slots: Sequence[_Slot]) -> None:
    """Who gave what: per pool, GPUs cut from what models hold (below both their holding
    and their ask) go to the models that grow, lowest tier giving first, highest taking
    first, each by key. Example: batch ns/x holds 6, is granted 4; online ns/y holds 14,
    is granted 16: 'batch model ns/x gave 2' on ns/y and 'gave 2 to online model ns/y'
    on ns/x."""
    groups: dict[str | None, list[_Slot]] = {}
    for slot in slots:
        groups.setdefault(slot.ask.pool, []).append(slot)
    for members in groups.values():
        givers = sorted(((s, (min(s.ask.current, s.want) - s.granted) * s.gpr)
                         for s in members if min(s.ask.current, s.want) > s.granted),
                        key=lambda pair: (-pair[0].rank, pair[0].ask.key))
        takers = sorted(((s, (s.granted - s.ask.current) * s.gpr)
                         for s in members if s.granted > s.ask.current),
                        key=lambda pair: (pair[0].rank, pair[0].ask.key))
        left = [amount for _, amount in givers]
        index = 0
        for taker, gain in takers:
            while gain > 0 and index < len(givers):
                giver = givers[index][0]
                moved = min(gain, left[index])
                taker.gave.append(f"{giver.ask.tier} model {giver.ask.key} gave {moved}")
                giver.gave.append(f"gave {moved} to {taker.ask.tier} model {taker.ask.key}")
                gain -= moved
                left[index] -= moved
                if left[index] == 0:
                    index += 1


def _reason(slot: _Slot, ledger: _Ledger, pools: Mapping[str, FleetPool],
            floors_over: Mapping[str, int]) -> str:
    """'capped by tenant search: 16 of 16 GPUs; batch model ns/x gave 2', or for a model
    granted its whole ask, what it got and where from."""
    gpr, ask = slot.gpr, slot.ask
    granted = slot.granted * gpr
    pool = pools.get(ask.pool) if ask.pool is not None else None
    if slot.granted >= slot.want:
        parts = [f"granted all {granted} GPUs asked"
                 + (f" on pool {pool.name}" if pool is not None else "")]
        if slot.borrowed:
            parts.append(f"{slot.borrowed * gpr} borrowed beyond floor and guarantee, "
                         "given back first")
    else:
        parts = [_binding(slot, ledger, pool, floors_over)]
        parts.append(f"granted {granted} of {slot.want * gpr} GPUs asked")
    return "; ".join(parts + slot.gave)


def _binding(slot: _Slot, ledger: _Ledger, pool: FleetPool | None,
             floors_over: Mapping[str, int]) -> str:
    """What stopped a model short of its ask: a ceiling, a guarantee it may not borrow
    beyond, floors over the pool, or the pool itself (checked in that order)."""
    gpr = slot.gpr
    for budget in slot.budgets:
        held = ledger.held[budget.name]
        if budget.ceiling is not None and held + gpr > budget.ceiling:
            return f"capped by {budget.label}: {held} of {budget.ceiling} GPUs"
    for budget in slot.budgets:
        held = ledger.held[budget.name]
        if not budget.borrow and held + gpr > budget.guaranteed:
            return (f"capped by {budget.label} at its guarantee: {held} of "
                    f"{budget.guaranteed} GPUs, no borrowing")
    if pool is None:  # unreachable: something above bound it
        return "capped by its budgets"
    if pool.name in floors_over:
        return (f"floors alone need {pool.grantable + floors_over[pool.name]} GPUs of pool "
                f"{pool.name}'s {pool.grantable}{_reserved(pool)}: floors kept, nothing more "
                "granted")
    left = ledger.pool_left[pool.name]
    text = (f"capped by pool {pool.name}: {pool.grantable - left} of {pool.grantable} GPUs"
            f"{_reserved(pool)}")
    if left > 0:
        text += f", {left} left are under one replica of {gpr}"
    return text


def _reserved(pool: FleetPool) -> str:
    return f" ({pool.gpus} less {pool.reserved} reserved)" if pool.reserved else ""


def budget_rule(budget: policy_fleet.GpuBudget) -> BudgetRule:
    """A GpuBudget as arbitration reads it."""
    spec = budget.spec
    return BudgetRule(
        name=budget.name, tenant=spec.tenant, cost_center=spec.cost_center, pool=spec.pool,
        guaranteed=spec.guaranteed_gpus, ceiling=spec.max_gpus, borrow=spec.borrow)


def fleet_pool(pool: policy_fleet.GpuPool, *, excluded_gpus: int = 0) -> FleetPool:
    """A GpuPool's GPUs (gpusPerNode x maxNodes, less those the latest cluster read
    excluded for health errors: a simulated pool excludes none) and its reservations."""
    return FleetPool(name=pool.name, gpus=max(0, pool.spec.total_gpus - excluded_gpus),
                        reserved=pool.spec.reserved_gpus)
