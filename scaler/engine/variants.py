"""Variants: the cheapest mix of a model's hardware variants that serves its demand, pure.

A model may run as several Deployments of the same weights on different hardware (H100,
A100, L40S), each replica serving `capacity` in the policy's unit (requests or tokens/s)
at a `price` per hour. `mix` turns the model's demand in that unit into replicas per
variant; `settle` makes each variant an Ask on its own pool (key `ns/model#variant`), so
arbitration, budgets and reasons work unchanged, and moves a capped variant's shortfall
to the next-cheapest variant with room.

The rule of `mix`, in two cases that never overlap:
- The replicas held (ready and starting, within each variant's room) already serve the
  demand: remove, the cheapest remaining set that still covers it (so the most expensive
  per unit go first).
- They do not: keep every one of them and add the cheapest cover of the shortfall, on the
  variants whose time to ready fits the look-ahead (all of them if those cannot cover it).
A step never adds to one variant while it removes from another: a warm replica swapped for
a cheaper cold one would leave its share unserved for a whole pod start, and any removal
that the kept ready replicas could afford would make the additions pointless. The swap
happens over two steps instead: the cheaper replicas are added while demand grows, and
once they are held, the dearer ones are removed.

Both cases are the same problem, the cheapest cover with bounds: counts 0 <= n_i <= u_i
minimising sum(n_i x price_i) with sum(n_i x capacity_i) >= need. It is solved exactly by
a depth-first search over the variants in order of price per unit, the most of the
cheapest first, pruned by the continuous bound (cost so far + need left x the lowest price
per unit among the rest). With at most `model.MAX_VARIANTS` variants the last one's count
is implied by the others, so the worst case is the product of three count ranges; the
bound cuts almost all of it (the first branch is the greedy cover, and few beat it).
Example: demand 100 requests; an H100 replica serves 40 at 10.0/h (0.25 per unit), an
L40S one 12 at 2.0/h (0.17 per unit). Cheapest single variants: 3 x H100 = 30.0/h,
9 x L40S = 18.0/h, so 9 x L40S. With room for only 5 L40S: 5 x L40S (60) + 1 x H100 (40)
= 20.0/h, where H100 alone would be 30.0/h.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from scaler.core import vocabulary
from scaler.engine import fleet as engine_fleet
from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import model

SEPARATOR = "#"
"""Between a model's key and its variant's name in an Ask's key: 'ns/llama#l40s'."""


@dataclass(frozen=True, slots=True)
class Option:
    """One variant as `mix` reads it.

    capacity: what one replica serves (policy unit); price: one replica for one hour;
    ready, starting: replicas held now; room: the most replicas it may hold (its pool's
    room or its grant; None: no bound); time_to_ready_s: a new replica's start; keep:
    replicas it keeps whatever the demand, a batch tier's variant's replicas reporting
    unfinished work (the engine's `spare.busy_floor`, per variant), within what it holds
    (so within its room: a grant below them still cuts them, as a budget does).
    """

    name: str
    capacity: float
    price: float
    ready: int = 0
    starting: int = 0
    room: int | None = None
    time_to_ready_s: float = 0.0
    pool: str | None = None
    gpus_per_replica: int = 1
    keep: int = 0

    @property
    def held(self) -> int:
        """Replicas it holds now, within its room (a grant under what it holds cuts it)."""
        held = self.ready + self.starting
        return held if self.room is None else min(held, self.room)

    @property
    def unit_price(self) -> float:
        """Price per capacity unit and hour: 10.0/h for 40 requests -> 0.25."""
        return self.price / self.capacity


@dataclass(frozen=True, slots=True)
class Mix:
    """Replicas per variant, what they serve and cost, and whether the demand is met."""

    replicas: Mapping[str, int]
    capacity: float
    cost_hourly: float
    met: bool


def _check(options: Sequence[Option], demand: float) -> None:
    names = [o.name for o in options]
    if len(set(names)) != len(names):
        raise ValueError(f"variants named twice in {names}")
    if not math.isfinite(demand) or demand < 0:
        raise ValueError(f"demand must be finite and not negative, not {demand}")
    for o in options:
        if not (o.capacity > 0 and math.isfinite(o.capacity)) or not o.price >= 0:
            raise ValueError(f"variant {o.name}: capacity must be positive and price not "
                             f"negative, not {o.capacity} and {o.price}")
        if min(o.ready, o.starting, o.room if o.room is not None else 0, o.keep) < 0:
            raise ValueError(f"variant {o.name}: counts must not be negative")


def cheapest_cover(*, capacities: Sequence[float], prices: Sequence[float],
                   uppers: Sequence[int], need: float) -> list[int] | None:
    """Counts 0 <= n_i <= uppers[i] with sum(n_i x capacities[i]) >= need at the least
    sum(n_i x prices[i]) (ties: fewer replicas, then the earlier variants); None when even
    every upper bound falls short. Exact (see the module docstring)."""
    slack = 1e-9 * max(1.0, need)
    if sum(u * c for u, c in zip(uppers, capacities, strict=True)) < need - slack:
        return None
    order = sorted(range(len(capacities)), key=lambda i: (prices[i] / capacities[i], i))
    # The lowest price per unit among order[k:], for the bound.
    cheapest_rest = [math.inf] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        i = order[k]
        per_unit = prices[i] / capacities[i] if uppers[i] > 0 else math.inf
        cheapest_rest[k] = min(cheapest_rest[k + 1], per_unit)
    best: list[tuple[float, int, tuple[int, ...]]] = []
    counts = [0] * len(capacities)

    def search(k: int, left: float, cost: float) -> None:
        if left <= slack:
            key = (round(cost, 9), sum(counts), tuple(-c for c in counts))
            if not best or key < best[0]:
                best[:] = [key]
                chosen[:] = counts
            return
        if k == len(order) or (best and cost + left * cheapest_rest[k] > best[0][0] + 1e-9):
            return
        i = order[k]
        most = min(uppers[i], math.ceil(left / capacities[i] - 1e-9))
        for n in range(most, -1, -1):  # the most of the cheapest first: a good first best
            counts[i] = n
            search(k + 1, left - n * capacities[i], cost + n * prices[i])
        counts[i] = 0

    chosen: list[int] = []
    search(0, need, 0.0)
    return list(chosen) if best else None


def mix(options: Sequence[Option], *, demand: float, lookahead_s: float) -> Mix:
    """Replicas per variant serving `demand` (the policy's unit) at the least price per
    hour, held replicas kept first (see the module docstring). When the rooms cannot
    cover the demand, every variant is filled to its room (`met` False)."""
    _check(options, demand)
    busy = [min(o.keep, o.held) for o in options]
    if any(busy):
        # The kept replicas stay and serve their share; the rest is mixed as usual over
        # what each variant holds and may add beyond them. Exact: with n_i = k_i + m_i,
        # the cheapest cover of the demand with n_i >= k_i is k plus the cheapest cover
        # of what k leaves. Example: 2 busy L40S of 12 kept, demand 30: 6 left to mix.
        rest = mix([_beyond(o, k) for o, k in zip(options, busy, strict=True)],
                   demand=max(0.0, demand - sum(k * o.capacity
                                                for o, k in zip(options, busy, strict=True))),
                   lookahead_s=lookahead_s)
        return _result(options, counts=[rest.replicas[o.name] + k
                                        for o, k in zip(options, busy, strict=True)],
                       demand=demand)
    held = [o.held for o in options]
    caps = [o.capacity for o in options]
    prices = [o.price for o in options]
    slack = 1e-9 * max(1.0, demand)
    held_capacity = sum(h * c for h, c in zip(held, caps, strict=True))
    if held_capacity >= demand - slack:
        kept = cheapest_cover(capacities=caps, prices=prices, uppers=held, need=demand)
        assert kept is not None  # the held set itself covers it
        return _result(options, counts=kept, demand=demand)
    shortfall = demand - held_capacity
    rooms = [(o.room if o.room is not None else h + math.ceil(shortfall / o.capacity)) - h
             for o, h in zip(options, held, strict=True)]
    in_time = [r if o.time_to_ready_s <= lookahead_s else 0
               for o, r in zip(options, rooms, strict=True)]
    extra = (cheapest_cover(capacities=caps, prices=prices, uppers=in_time, need=shortfall)
             or cheapest_cover(capacities=caps, prices=prices, uppers=rooms, need=shortfall))
    if extra is None:  # short whatever is chosen: all the room there is
        extra = rooms
    return _result(options, counts=[h + e for h, e in zip(held, extra, strict=True)],
                   demand=demand)


def _beyond(option: Option, kept: int) -> Option:
    """The variant less `kept` of its held replicas (ready ones first) and of its room."""
    ready = max(0, option.ready - kept)
    return replace(option, ready=ready, starting=option.starting - (kept - (option.ready - ready)),
                   room=None if option.room is None else option.room - kept, keep=0)


def _result(options: Sequence[Option], *, counts: Sequence[int], demand: float) -> Mix:
    capacity = sum(n * o.capacity for n, o in zip(counts, options, strict=True))
    return Mix(replicas={o.name: n for o, n in zip(options, counts, strict=True)},
               capacity=capacity,
               cost_hourly=sum(n * o.price for n, o in zip(counts, options, strict=True)),
               met=capacity >= demand - 1e-9 * max(1.0, demand))


# ----- the fleet step ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VariantModel:
    """A model with variants as the fleet step reads it: who it is, its demand in the
    policy's unit, the look-ahead its decision used, and its variants."""

    key: str
    tier: vocabulary.Tier
    tenant: str | None
    cost_center: str | None
    demand: float
    lookahead_s: float
    options: tuple[Option, ...]


def variant_key(model_key: str, variant: str) -> str:
    """'ns/llama' and 'l40s' -> 'ns/llama#l40s': the Ask of one variant."""
    return f"{model_key}{SEPARATOR}{variant}"


def _asks(item: VariantModel, chosen: Mix) -> list[engine_fleet.Ask]:
    return [engine_fleet.Ask(
                key=variant_key(item.key, o.name), pool=o.pool, tier=item.tier,
                tenant=item.tenant, cost_center=item.cost_center,
                gpus_per_replica=o.gpus_per_replica, floor=0,
                desired=chosen.replicas[o.name], current=o.ready + o.starting)
            for o in item.options]


def settle(pools: Sequence[engine_fleet.FleetPool],
           budgets: Sequence[engine_fleet.BudgetRule], *, asks: Sequence[engine_fleet.Ask],
           models: Sequence[VariantModel]
           ) -> tuple[dict[str, engine_fleet.Grant], dict[str, Mix]]:
    """Grants for every ask and every variant (by Ask key), and each model's final mix.

    Pass 1: each model's mix, every variant bounded by its pool's grantable GPUs, becomes
    one Ask per variant; everything is arbitrated as one. Pass 2, only when a variant was
    granted less than its mix asked: that model mixes again with each capped variant's
    room set to its grant (so its shortfall moves to the next-cheapest variant with room),
    and everything is arbitrated again. Two passes suffice for what is capped in pass 1
    (a cap only lowers what a variant may hold); a variant newly short in pass 2 keeps its
    grant (its mix is cut to it) and asks again next cycle. Variant floors are 0: the
    policy's replicas.min and warm floor bound the model's demand, not a variant.
    """
    grantable = {p.name: p.grantable for p in pools}

    def bounded(option: Option, room: int | None) -> Option:
        if option.pool in grantable:
            pool_room = grantable[option.pool] // option.gpus_per_replica
            room = pool_room if room is None else min(room, pool_room)
        return replace(option, room=room)

    first = {m.key: mix([bounded(o, o.room) for o in m.options], demand=m.demand,
                        lookahead_s=m.lookahead_s) for m in models}
    variant_asks = [a for m in models for a in _asks(m, first[m.key])]
    grants = engine_fleet.arbitrate(pools, budgets, [*asks, *variant_asks])
    mixes = first
    short = [m for m in models
             if any(grants[variant_key(m.key, o.name)].replicas < first[m.key].replicas[o.name]
                    for o in m.options)]
    if short:
        mixes = dict(first)
        bound: dict[str, str] = {}  # variant key -> why pass 1 cut it
        for m in short:
            capped = []
            for o in m.options:
                grant = grants[variant_key(m.key, o.name)]
                cut = grant.replicas < first[m.key].replicas[o.name]
                if cut:
                    bound[grant.key] = grant.reason
                capped.append(bounded(o, grant.replicas if cut else o.room))
            mixes[m.key] = mix(capped, demand=m.demand, lookahead_s=m.lookahead_s)
        again = {a.key: a for m in short for a in _asks(m, mixes[m.key])}
        grants = engine_fleet.arbitrate(
            pools, budgets, [*asks, *(again.get(a.key, a) for a in variant_asks)])
        # A variant cut in pass 1 and granted its new ask in pass 2 keeps pass 1's reason:
        # it is why the model mixed again (a budget of 2 GPUs made it ask 1, not 12).
        for key, reason in bound.items():
            if grants[key].replicas >= again[key].desired:
                grants[key] = replace(grants[key], reason=reason)
    final: dict[str, Mix] = {}
    for m in models:
        counts = [min(mixes[m.key].replicas[o.name],
                      grants[variant_key(m.key, o.name)].replicas) for o in m.options]
        final[m.key] = _result(m.options, counts=counts, demand=m.demand)
    return grants, final


# ----- from a policy ----------------------------------------------------------------------


def unit_capacity(policy: model.ScalePolicy) -> float:
    """What one replica of the policy's own target serves in its unit, the yardstick a
    variant's capacity is written in: concurrency.targetPerReplica, else
    tokensPerSecond.capacityPerReplica."""
    signals = policy.spec.signals
    if signals.concurrency is not None:
        return signals.concurrency.target_per_replica
    if signals.tokens_per_second is not None:
        return signals.tokens_per_second.capacity_per_replica
    raise ValueError(f"policy {policy.key}: variants need signals.concurrency or "
                     "signals.tokensPerSecond")


def demand_of(policy: model.ScalePolicy, decision: types.Decision) -> float:
    """The model's demand in its unit: the replicas its decision wanted before any fleet
    cap, of the policy's own per-replica capacity. `decide` sizes replicas of that
    yardstick, so 5 replicas at targetPerReplica 16 are a demand of 80 requests (rounded
    up to a whole yardstick replica: at most one replica's worth over the load)."""
    return engine_fleet.uncapped_desired(decision) * unit_capacity(policy)


def lookahead_of(policy: model.ScalePolicy, decision: types.Decision) -> float:
    """Seconds ahead the decision planned for: its forecast's time to ready (a node boot
    included when no GPU was free), else the policy's pod start. A variant that starts
    slower than this grows only when the faster ones cannot cover the demand."""
    if decision.forecast is not None:
        return decision.forecast.time_to_ready_s
    return policy.spec.cold_start.pod_start_seconds


def options_of(policy: model.ScalePolicy, *, pools: Mapping[str, policy_fleet.GpuPool],
               held: Mapping[str, tuple[int, int]]) -> tuple[Option, ...]:
    """The policy's variants as Options: `held` gives (ready, starting) per variant name;
    a variant's GPU-hour is its own gpuHourly, else its GpuPool's, else spec.cost's."""
    spec = policy.spec
    out = []
    for variant in spec.variants:
        pool = pools.get(variant.node_pool)
        hourly = (variant.gpu_hourly if variant.gpu_hourly is not None
                  else pool.spec.gpu_hourly if pool is not None else spec.cost.gpu_hourly)
        gpr = variant.resources.gpus_per_replica
        start = (variant.pod_start_seconds if variant.pod_start_seconds is not None
                 else spec.cold_start.pod_start_seconds)
        ready, starting = held.get(variant.name, (0, 0))
        out.append(Option(name=variant.name, capacity=variant.capacity, price=hourly * gpr,
                          ready=ready, starting=starting, time_to_ready_s=start,
                          pool=variant.node_pool, gpus_per_replica=gpr))
    return tuple(out)


def weights_of(policy: model.ScalePolicy) -> tuple[float, ...]:
    """Each variant's replica in replicas of the policy's yardstick, in spec.variants
    order: an H100 replica of 40 requests is 2.5 of a policy at targetPerReplica 16."""
    unit = unit_capacity(policy)
    return tuple(variant.capacity / unit for variant in policy.spec.variants)


def equivalent_state(states: Sequence[types.ClusterState], *, weights: Sequence[float]
                     ) -> types.ClusterState:
    """A model's variants as `decide` reads replicas: each variant's replicas weighed by
    its yardstick weight (`weights_of`), so current, ready and starting are
    capacity-equivalent: 2 H100 (2.5 each) + 3 L40S (1.0) read as 8 replicas.

    Rounded down: the equivalent never claims more than is held. Rounded to nearest, 6 x
    2.82 = 16.94 would read 17, the decision 17 x 34 = 578 would be 2 above the 576 held,
    the mix would add one more replica, and so on each cycle (measured in the fleet
    replay: 14 -> 49). A starting replica counts once per whole weight (at least once),
    free slots per whole replica of the yardstick; excluded GPUs and capacity notes add
    up; the SM-active ratio is the mean over the variants' ready replicas."""

    def floor(value: float) -> int:
        return math.floor(value + 1e-9)

    pairs = list(zip(states, weights, strict=True))
    free = [s.free_replica_slots for s in states]
    active = [(s.gpu_sm_active, s.ready) for s in states
              if s.gpu_sm_active is not None and s.ready > 0]
    ready_active = sum(n for _, n in active)
    return types.ClusterState(
        current=floor(sum(s.current * w for s, w in pairs)),
        ready=floor(sum(s.ready * w for s, w in pairs)),
        starting=tuple(sorted(t for s, w in pairs for t in s.starting
                              for _ in range(max(1, round(w))))),
        free_replica_slots=(None if any(f is None for f in free) else
                            sum(int((f or 0) * w) for f, w in zip(free, weights, strict=True))),
        observations=tuple(o for s in states for o in s.observations)[-20:],
        excluded_gpus=sum(s.excluded_gpus for s in states),
        capacity_notes=tuple(note for s in states for note in s.capacity_notes),
        gpu_sm_active=(sum(v * n for v, n in active) / ready_active if active else None),
        grace_period_s=min((s.grace_period_s for s in states if s.grace_period_s is not None),
                           default=None))
