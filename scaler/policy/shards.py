"""Which instance evaluates which models: arbitration domains hashed to shards.

One instance evaluates a few thousand models (docs/scaling.md, "The ceiling of one
instance"); past that the models are split across `shards` instances. Arbitration needs
every ask on a pool and under a budget in one place, so the unit a shard owns is a
*domain*: the models linked by a node pool they share (their own or a variant's) or a
budget that covers them, with those pools and budgets. A model on no pool and under no
budget is a domain alone.

Each domain goes to the shard with the highest hash of (shard, domain): rendezvous
hashing. Every instance computes the same owner from the same files with no coordination,
and going from S to S + 1 shards moves only the domains the new shard wins (about
1 / (S + 1) of them); the others keep their engine state.

Example: pools a and b, models m1 and m2 on a, m3 on b, m4 on no pool, and a budget of
tenant t over every pool covering m2 and m3: the domains are {a, b, m1, m2, m3, budget}
(the budget joins a and b) and {m4}.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scaler.policy import fleet as policy_fleet
from scaler.policy import model

# A domain's members by kind; the prefixes order them (pools first), so a domain is named
# after its first pool, which does not change when models join or leave it.
POOL, BUDGET, MODEL = "pool", "budget", "model"
DEFAULT_MAX_DOMAIN_MODELS = 500
"""A larger domain is split by model (`split`): well under the few thousand models one
instance evaluates (docs/scaling.md), so one domain alone never fills a shard."""
_ORDER = {POOL: 0, BUDGET: 1, MODEL: 2}


def member(kind: str, name: str) -> str:
    """A domain member's label: 'pool:h100', 'budget:search', 'model:inference/llama-8b'."""
    return f"{kind}:{name}"


def _pools_of(policy: model.ScalePolicy) -> list[str]:
    """The node pools a policy's replicas run on: its own and its variants'."""
    spec = policy.spec
    pools = [spec.node_pool.name] if spec.node_pool is not None else []
    pools.extend(variant.node_pool for variant in spec.variants)
    return pools


class _Union:
    """Union-find over member labels."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def add(self, label: str) -> None:
        self.parent.setdefault(label, label)

    def root(self, label: str) -> str:
        parent = self.parent
        while parent[label] != label:
            parent[label] = parent[parent[label]]
            label = parent[label]
        return label

    def join(self, a: str, b: str) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _sort_key(label: str) -> tuple[int, str]:
    kind, _, name = label.partition(":")
    return _ORDER[kind], name


def domains(policies: Iterable[model.ScalePolicy], fleet: policy_fleet.Fleet
            ) -> dict[str, str]:
    """Every member (`member(kind, name)`) -> the name of its domain, the domain's first
    member by kind (pools, then budgets, then models) and name."""
    union = _Union()
    for name in fleet.pools:
        union.add(member(POOL, name))
    for name in fleet.budgets:
        union.add(member(BUDGET, name))
    for policy in policies:
        label = member(MODEL, policy.key)
        union.add(label)
        for pool in _pools_of(policy):
            union.add(member(POOL, pool))
            union.join(label, member(POOL, pool))
        for name, budget in fleet.budgets.items():
            # A budget on one pool caps only that pool's models; over every pool, the
            # tenant's models on any pool (GpuBudget.covers, Fleet.budgets_of).
            if budget.covers(policy) and (budget.spec.pool is None
                                          or budget.spec.pool in _pools_of(policy)):
                union.join(label, member(BUDGET, name))
    for name, budget in fleet.budgets.items():
        if budget.spec.pool is not None:
            union.add(member(POOL, budget.spec.pool))
            union.join(member(BUDGET, name), member(POOL, budget.spec.pool))
    groups: dict[str, list[str]] = {}
    for label in union.parent:
        groups.setdefault(union.root(label), []).append(label)
    named = {}
    for labels in groups.values():
        first = min(labels, key=_sort_key)
        for label in labels:
            named[label] = first
    return named


def _weight(shard: int, domain: str) -> int:
    """The rendezvous weight of a shard for a domain: stable across processes and
    versions (not Python's salted `hash`)."""
    digest = hashlib.blake2b(f"{shard}\x00{domain}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(domain: str, *, shards: int, besides: int | None = None) -> int:
    """The shard (0 .. shards - 1) that owns `domain` (or a model's key): the highest
    weight wins, among the shards but `besides` when there are others."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    if shards == 1:
        return 0
    return max((shard for shard in range(shards) if shard != besides),
               key=lambda shard: _weight(shard, domain))


@dataclass(frozen=True, slots=True)
class Assignment:
    """This instance's share: shard `shard` of `shards`."""

    shard: int = 0
    shards: int = 1

    def __post_init__(self) -> None:
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ValueError(f"shard {self.shard} of {self.shards}: need 0 <= shard < shards")

    @property
    def sharded(self) -> bool:
        return self.shards > 1


@dataclass(frozen=True, slots=True)
class Share:
    """What one shard does with a set of files.

    models: the model keys it evaluates.
    pools, budgets: the GpuPools and GpuBudgets of the domains it arbitrates (the domain's
      owner arbitrates it); node_pools: every node pool name of those domains (it alone
      plans their nodes).
    remote: models it evaluates in a split domain another shard arbitrates -> that shard
      (their asks go there, their grants come from there).
    foreign: models another shard evaluates in a split domain arbitrated here -> that
      shard (their asks come from there, their grants go there).
    domain_of: every member's domain.
    """

    models: frozenset[str]
    pools: frozenset[str]
    budgets: frozenset[str]
    node_pools: frozenset[str]
    remote: Mapping[str, int]
    foreign: Mapping[str, int]
    domain_of: Mapping[str, str]


def sizes(policies: Iterable[model.ScalePolicy], named: Mapping[str, str]) -> dict[str, int]:
    """Models per domain (`domains`' names), largest first."""
    counts: dict[str, int] = {}
    for policy in policies:
        domain = named[member(MODEL, policy.key)]
        counts[domain] = counts.get(domain, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def split(policies: Iterable[model.ScalePolicy], fleet: policy_fleet.Fleet, *,
          shards: int, max_domain_models: int | None = None) -> list[Share]:
    """Every shard's share, in shard order.

    A domain goes whole to its owner, unless it has more than `max_domain_models` models
    (None: never): then each of its models is evaluated by the owner of the model's own
    key among the other shards, and the domain's owner arbitrates for all of them (one
    arbiter, so one consistent view of the pools and budgets; it evaluates none of them,
    since arbitrating the whole domain is its share of the work). A model with variants
    stays with the arbiter: its mix is settled there.
    """
    policies = list(policies)
    named = domains(policies, fleet)
    arbiter = {domain: owner(domain, shards=shards) for domain in set(named.values())}
    counts = sizes(policies, named)
    evaluator: dict[str, int] = {}
    for policy in policies:
        label = member(MODEL, policy.key)
        domain = named[label]
        large = max_domain_models is not None and counts[domain] > max_domain_models
        evaluator[policy.key] = (owner(label, shards=shards, besides=arbiter[domain])
                                 if large and not policy.spec.variants else arbiter[domain])

    def arbitrated(kind: str, shard: int) -> frozenset[str]:
        prefix = f"{kind}:"
        return frozenset(label[len(prefix):] for label, domain in named.items()
                         if label.startswith(prefix) and arbiter[domain] == shard)

    shares = []
    for shard in range(shards):
        node_pools = arbitrated(POOL, shard)
        shares.append(Share(
            models=frozenset(key for key, at in evaluator.items() if at == shard),
            pools=node_pools & frozenset(fleet.pools),
            budgets=arbitrated(BUDGET, shard) & frozenset(fleet.budgets),
            node_pools=node_pools,
            remote={key: arbiter[named[member(MODEL, key)]] for key, at in evaluator.items()
                    if at == shard and arbiter[named[member(MODEL, key)]] != shard},
            foreign={key: at for key, at in evaluator.items()
                     if at != shard and arbiter[named[member(MODEL, key)]] == shard},
            domain_of=named))
    return shares
