"""The fleet step in the service: every model's latest ask, arbitrated, and each one's cap.

The reactor decides each model alone; this keeps what each decision asked
(`engine.fleet.ask_of`), re-arbitrates the whole fleet when an ask changed, and gives
each next decision its cap as `ClusterState.budget_gpus` with the reason. One event loop
owns it, so no locks.

A model with variants (spec.variants) is kept as its demand and variants instead
(`record_variants`), and arbitration then mixes it over its variants' pools
(`engine.variants.settle`); `mix` gives the replicas per variant the reactor writes to
each variant's target (`service.variants`), and `describe_mix` says why in words. A
variant whose target an HPA or KEDA ScaledObject scales (`record_owners`) is mixed at what
it holds, never more or less: its replicas serve their share, so the others are not sized
as if it were empty, and no count is asked of it that the scaler would have to write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scaler.core import vocabulary
from scaler.engine import fleet as engine_fleet
from scaler.engine import nodes as engine_nodes
from scaler.engine import spec as engine_spec
from scaler.engine import types
from scaler.engine import variants as engine_variants
from scaler.policy import fleet as policy_fleet
from scaler.policy import model

AWAITING = "awaiting the fleet's first arbitration: held at what it has"


@dataclass(frozen=True, slots=True)
class RemoteAsk:
    """What a model of a split domain sends its domain's arbiter (another shard): the
    decision's numbers only; the arbiter reads tier, tenant, pool and floor from its own
    copy of the policy (every shard loads every file), never from the wire.

    desired: replicas before any fleet cap (`engine.fleet.uncapped_desired`); current:
    replicas held; replicas, forecast_replicas: its node pool demand
    (`engine.nodes.pool_demand`); excluded_gpus: GPUs of its pool the latest read
    excluded (unhealthy, NotReady); at: the decision's time.
    """

    key: str
    desired: int
    current: int
    replicas: int
    forecast_replicas: int
    excluded_gpus: int
    at: float


class Arbiter:
    """Asks by model, the last arbitration's grants, and the pools and budgets in force."""

    def __init__(self) -> None:
        self._fleet = policy_fleet.Fleet()
        self._budgets: tuple[engine_fleet.BudgetRule, ...] = ()
        self._excluded: dict[str, int] = {}  # pool -> GPUs the latest read excluded
        self._asks: dict[str, engine_fleet.Ask] = {}
        self._grants: dict[str, engine_fleet.Grant] = {}
        self._variants: dict[str, engine_variants.VariantModel] = {}
        self._mixes: dict[str, engine_variants.Mix] = {}
        # model -> variant -> its HPA, for the models whose targets' owners were checked,
        # and when every variant's owner was last checked (`service.variants.pending`)
        self._owners: dict[str, dict[str, str]] = {}
        self._owners_checked: dict[str, float] = {}
        self.arbitrations = 0
        # With several shards, for split domains (`policy.shards`): own models another
        # shard arbitrates, their latest grant from it, and the asks still to send; other
        # shards' models arbitrated here (their policies) and their node pool demands.
        self._remote: frozenset[str] = frozenset()
        self._remote_grants: dict[str, engine_fleet.Grant] = {}
        self.outbox: dict[str, RemoteAsk] = {}
        self._foreign: dict[str, model.ScalePolicy] = {}
        self._foreign_asks: dict[str, RemoteAsk] = {}
        self._foreign_on: dict[str, list[str]] = {}

    @property
    def active(self) -> bool:
        """Whether any GpuPool or GpuBudget is in force, or another shard arbitrates a
        model here (else every model passes through)."""
        return bool(self._fleet.pools or self._budgets or self._remote)

    def set_fleet(self, fleet: policy_fleet.Fleet, *, keys: Collection[str],
                  remote: Collection[str] = (),
                  foreign: Mapping[str, model.ScalePolicy] | None = None) -> None:
        """The pools and budgets in force, and the models that remain (others are
        forgotten). With several shards: `remote`, the own models another shard
        arbitrates; `foreign`, other shards' models arbitrated here, by key."""
        self._remote = frozenset(remote)
        self._remote_grants = {k: g for k, g in self._remote_grants.items()
                               if k in self._remote}
        self.outbox = {k: a for k, a in self.outbox.items() if k in self._remote}
        self._foreign = dict(foreign or {})
        self._foreign_asks = {k: a for k, a in self._foreign_asks.items()
                              if k in self._foreign}
        self._foreign_on = {}  # node pool -> its foreign models, by key
        for key, policy in sorted(self._foreign.items()):
            if policy.spec.node_pool is not None:
                self._foreign_on.setdefault(policy.spec.node_pool.name, []).append(key)
        keys = set(keys) | set(self._foreign_asks)
        self._fleet = fleet
        self._budgets = tuple(engine_fleet.budget_rule(b) for _, b in sorted(fleet.budgets.items()))
        self._excluded = {name: n for name, n in self._excluded.items() if name in fleet.pools}
        self._asks = {key: ask for key, ask in self._asks.items() if key in keys}
        self._grants = {key: g for key, g in self._grants.items()
                        if key.partition(engine_variants.SEPARATOR)[0] in keys}
        self._variants = {key: v for key, v in self._variants.items() if key in keys}
        self._mixes = {key: m for key, m in self._mixes.items() if key in keys}
        self._owners = {key: o for key, o in self._owners.items() if key in keys}
        self._owners_checked = {k: at for k, at in self._owners_checked.items() if k in keys}

    def capped(self, policy: model.ScalePolicy, cluster: types.ClusterState, *, now: float
               ) -> types.ClusterState:
        """The cluster state with the model's cap from the last arbitration.

        Never below the floor now (a warm floor that just rose is not cut while the
        fleet catches up). A model the fleet covers but has not arbitrated yet is held at
        what it has: on a start, 1,000 models deciding alone would each take the pool.
        """
        if not self.active or policy.spec.variants:  # variants: the mix is capped instead
            return cluster
        remote = policy.key in self._remote
        grant = (self._remote_grants if remote else self._grants).get(policy.key)
        spec = engine_spec.resolve(policy)
        floor_gpus = spec.floor_at(now)[0] * spec.gpus_per_replica
        if grant is None:
            if not remote and (self._fleet.pool_of(policy) is None
                               and not self._fleet.budgets_of(policy)):
                return cluster
            cap, reason = max(cluster.current * spec.gpus_per_replica, floor_gpus), AWAITING
        elif grant.cap_gpus is None:
            return cluster
        else:
            cap, reason = max(grant.cap_gpus, floor_gpus), grant.reason
        return cluster.with_budget(cap, reason)

    def record(self, policy: model.ScalePolicy, decision: types.Decision,
               cluster: types.ClusterState, *, now: float) -> bool:
        """Keep a decision's ask; True when it differs from the last one (re-arbitrate).
        The ask of a model another shard arbitrates goes to the outbox instead (sent by
        `service.relay`): False."""
        if not self.active:
            return False
        if policy.key in self._remote:
            demand = engine_nodes.pool_demand(policy, decision)
            self.outbox[policy.key] = RemoteAsk(
                key=policy.key, desired=engine_fleet.uncapped_desired(decision),
                current=decision.current, replicas=demand.replicas,
                forecast_replicas=demand.forecast_replicas,
                excluded_gpus=cluster.excluded_gpus, at=decision.at)
            return False
        pool = policy.spec.node_pool
        if pool is not None and pool.name in self._fleet.pools:
            self._excluded[pool.name] = cluster.excluded_gpus
        ask = engine_fleet.ask_of(policy, decision, now=now)
        changed = self._asks.get(policy.key) != ask
        self._asks[policy.key] = ask
        return changed

    def record_variants(self, policy: model.ScalePolicy, decision: types.Decision, *,
                        held: Mapping[str, tuple[int, int]],
                        excluded_gpus: Mapping[str, int] | None = None,
                        busy: Mapping[str, int] | None = None) -> bool:
        """Keep the decision of a model with variants as its demand, look-ahead and
        variants, `held` giving (ready, starting) per variant name and `excluded_gpus` the
        GPUs each variant's pool excluded by pool name; True when it differs from the
        last one (re-arbitrate).

        `busy`: a batch tier's replicas reporting unfinished work per variant name
        (`service.variants.Reading.busy`), which its mix keeps whatever the demand
        (`Option.keep`, as the simulator's fleet replay keeps them); a grant below them
        (a budget or the pool exceeded) still cuts them. Other tiers keep nothing.
        Example: 3 L40S held, 2 busy, a demand one L40S serves: the mix keeps 2."""
        for pool, gpus in (excluded_gpus or {}).items():
            if pool in self._fleet.pools:
                self._excluded[pool] = gpus
        options = engine_variants.options_of(policy, pools=self._fleet.pools, held=held)
        if busy and policy.spec.tier is vocabulary.Tier.BATCH:
            options = tuple(dataclasses.replace(o, keep=busy.get(o.name, 0)) for o in options)
        item = engine_variants.VariantModel(
            key=policy.key, tier=policy.spec.tier, tenant=policy.tenant,
            cost_center=policy.cost_center,
            demand=engine_variants.demand_of(policy, decision),
            lookahead_s=engine_variants.lookahead_of(policy, decision), options=options)
        changed = self._variants.get(policy.key) != item
        self._variants[policy.key] = item
        return changed

    def record_owners(self, key: str, owners: Mapping[str, str], *,
                      checked_at: float | None = None) -> bool:
        """The variants of model `key` whose targets an HPA or ScaledObject scales, by
        variant name (as the last write of its mix found them); True when that changed
        (re-arbitrate: those variants are mixed at what they hold). `checked_at`: the
        wall time that write checked every variant's owner (None: some went unchecked,
        and the time of the last full check stays)."""
        if checked_at is not None:
            self._owners_checked[key] = checked_at
        found = dict(owners)
        changed = (self._owners.get(key) or {}) != found
        self._owners[key] = found
        return changed

    def owners(self, key: str) -> Mapping[str, str] | None:
        """Variant name -> the HPA or ScaledObject that scales its target, for model
        `key`; None before any write of its mix checked them."""
        return self._owners.get(key)

    def owners_checked_at(self, key: str) -> float | None:
        """When a write of model `key`'s mix last checked every variant's owner (None:
        never)."""
        return self._owners_checked.get(key)

    def _mixed(self, item: engine_variants.VariantModel) -> engine_variants.VariantModel:
        """The model as `settle` mixes it: each variant an HPA owns kept at what it holds
        and given no room beyond (`Option.keep`, `room`), so the demand it serves is not
        asked of the others. Example: an HPA holds 2 H100 of 30 each; a demand of 100
        leaves 40 to mix over the rest."""
        owned = self._owners.get(item.key)
        if not owned:
            return item
        return dataclasses.replace(item, options=tuple(
            dataclasses.replace(o, keep=o.ready + o.starting, room=o.ready + o.starting)
            if o.name in owned else o for o in item.options))

    def arbitrate(self) -> list[str]:
        """Arbitrate the latest asks (and mix the models with variants); the keys whose
        cap or mix changed, to evaluate again."""
        if not self.active and not self._variants:
            return []
        pools = [engine_fleet.fleet_pool(pool, excluded_gpus=self._excluded.get(name, 0))
                 for name, pool in self._fleet.pools.items()]
        grants, mixes = engine_variants.settle(
            pools, self._budgets, asks=list(self._asks.values()),
            models=[self._mixed(item) for item in self._variants.values()])
        self.arbitrations += 1
        moved = {key for key, grant in grants.items()
                 if engine_variants.SEPARATOR not in key and (key not in self._grants
                                             or self._grants[key].cap_gpus != grant.cap_gpus)}
        moved |= {key for key, chosen in mixes.items() if self._mixes.get(key) != chosen}
        self._grants = grants
        self._mixes = mixes
        return sorted(moved)

    def mix(self, key: str) -> engine_variants.Mix | None:
        """The replicas per variant of a model with variants, from the last arbitration."""
        return self._mixes.get(key)

    @property
    def fleet(self) -> policy_fleet.Fleet:
        """The pools and budgets in force."""
        return self._fleet

    def describe_mix(self, policy: model.ScalePolicy) -> str | None:
        """The model's last mix in words (None before one), for the explanation:
        'variant h100: 2, l40s: 4; cheapest mix meeting the demand of 100 requests (serves
        100 at 12.00/h; held h100: 1, l40s: 0); l40s fills pool l40s: 4 of 4 GPUs'."""
        chosen = self._mixes.get(policy.key)
        item = self._variants.get(policy.key)
        if chosen is None or item is None:
            return None
        unit = "requests" if policy.spec.signals.concurrency is not None else "tokens/s"
        owners = self._owners.get(policy.key) or {}
        counts = ", ".join(f"{name}: {n}" for name, n in chosen.replicas.items())
        held = ", ".join(f"{o.name}: {o.ready + o.starting}" for o in item.options)
        verdict = ("cheapest mix meeting the demand" if chosen.met
                   else "short of the demand with every room filled")
        parts = [f"variant {counts}; {verdict} of {item.demand:g} {unit} (serves "
                 f"{chosen.capacity:g} at {chosen.cost_hourly:.2f}/h; held {held})"]
        kept = ", ".join(f"{o.name}: {o.keep}" for o in item.options
                         if o.keep and o.name not in owners)
        if kept:  # a batch tier's busy replicas (`record_variants`)
            parts.append(f"kept for unfinished work {kept}")
        for option in item.options:
            count = chosen.replicas[option.name]
            if option.name in owners:
                parts.append(f"{option.name} is scaled by {owners[option.name]}: not "
                             f"patched, its {option.ready + option.starting} held counted")
                continue
            grant = self._grants.get(engine_variants.variant_key(policy.key, option.name))
            pool = self._fleet.pools.get(option.pool or "")
            # A grant's reason says "granted all ..." unless something bound it
            # (`engine.fleet._reason`): only a binding one explains the mix.
            if grant is not None and grant.reason.startswith(("capped", "floors")):
                parts.append(f"{option.name} {grant.reason}")
            elif pool is not None:
                grantable = engine_fleet.fleet_pool(
                    pool, excluded_gpus=self._excluded.get(pool.name, 0)).grantable
                if count and count >= grantable // option.gpus_per_replica:
                    parts.append(f"{option.name} fills pool {pool.name}: "
                                 f"{count * option.gpus_per_replica} of {grantable} GPUs")
        return "; ".join(parts)

    def put_foreign(self, ask: RemoteAsk, *, now: float) -> bool:
        """Another shard's ask for a model arbitrated here; True when arbitration must run
        again (the ask or its pool's excluded GPUs changed). A model not arbitrated here
        is refused with ValueError, as is one older than the last ask kept."""
        policy = self._foreign.get(ask.key)
        if policy is None:
            raise ValueError(f"{ask.key} is not arbitrated here")
        previous = self._foreign_asks.get(ask.key)
        if previous is not None and previous.at > ask.at:
            raise ValueError(f"{ask.key}: an ask older than the last one")
        self._foreign_asks[ask.key] = ask
        pool = policy.spec.node_pool
        excluded_moved = False
        if pool is not None and pool.name in self._fleet.pools:
            excluded_moved = self._excluded.get(pool.name) != ask.excluded_gpus
            self._excluded[pool.name] = ask.excluded_gpus
        arbitrated = engine_fleet.ask_from(policy, desired=ask.desired, current=ask.current,
                                           now=now)
        changed = self._asks.get(ask.key) != arbitrated
        self._asks[ask.key] = arbitrated
        return changed or excluded_moved

    def foreign_grants(self) -> dict[str, engine_fleet.Grant]:
        """The last arbitration's grants of other shards' models, by key."""
        return {key: grant for key, grant in self._grants.items() if key in self._foreign}

    def foreign_policy(self, key: str) -> model.ScalePolicy | None:
        """The policy of another shard's model arbitrated here (None: not one)."""
        return self._foreign.get(key)

    def foreign_demands(self, pool: str) -> tuple[model.ScalePolicy | None,
                                                  list[types.PoolDemand]]:
        """Other shards' models on node pool `pool` arbitrated here: the first of their
        policies by key (its nodePool settings plan the pool when no own model names
        it), and each one's demand from its latest ask."""
        keys = self._foreign_on.get(pool, [])
        first = self._foreign[keys[0]] if keys else None
        demands = []
        for key in keys:
            policy, ask = self._foreign[key], self._foreign_asks.get(key)
            if ask is None:
                continue
            demands.append(types.PoolDemand(
                model=key, gpus_per_replica=policy.spec.resources.gpus_per_replica,
                replicas=ask.replicas, forecast_replicas=ask.forecast_replicas))
        return first, demands

    def put_remote_grant(self, grant: engine_fleet.Grant) -> bool:
        """The arbiter shard's grant for an own model of a split domain; True when its
        cap changed (evaluate it again). A model not arbitrated elsewhere: ValueError."""
        if grant.key not in self._remote:
            raise ValueError(f"{grant.key} is not arbitrated by another shard")
        previous = self._remote_grants.get(grant.key)
        self._remote_grants[grant.key] = grant
        return previous is None or previous.cap_gpus != grant.cap_gpus

    def asks(self) -> list[engine_fleet.Ask]:
        """The latest ask of every model recorded, by key."""
        return [self._asks[key] for key in sorted(self._asks)]

    def grant(self, key: str) -> engine_fleet.Grant | None:
        """The model's grant from the last arbitration (None before one)."""
        return self._grants.get(key)
