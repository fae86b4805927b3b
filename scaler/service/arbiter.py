"""The fleet step in the service: every model's latest ask, arbitrated, and each one's cap.

The reactor decides each model alone; this keeps what each decision asked
(`engine.fleet.ask_of`), re-arbitrates the whole fleet when an ask changed, and gives
each next decision its cap as `ClusterState.budget_gpus` with the reason. One event loop
owns it, so no locks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from scaler.engine import fleet as engine_fleet
from scaler.engine import spec as engine_spec
from scaler.engine import types
from scaler.policy import fleet as policy_fleet
from scaler.policy import model

AWAITING = "awaiting the fleet's first arbitration: held at what it has"


class Arbiter:
    """Asks by model, the last arbitration's grants, and the pools and budgets in force."""

    def __init__(self) -> None:
        self._fleet = policy_fleet.Fleet()
        self._budgets: tuple[engine_fleet.BudgetRule, ...] = ()
        self._excluded: dict[str, int] = {}  # pool -> GPUs the latest read excluded
        self._asks: dict[str, engine_fleet.Ask] = {}
        self._grants: dict[str, engine_fleet.Grant] = {}
        self.arbitrations = 0

    @property
    def active(self) -> bool:
        """Whether any GpuPool or GpuBudget is in force (else every model passes through)."""
        return bool(self._fleet.pools or self._budgets)

    def set_fleet(self, fleet: policy_fleet.Fleet, *, keys: Collection[str]) -> None:
        """The pools and budgets in force, and the models that remain (others are forgotten)."""
        self._fleet = fleet
        self._budgets = tuple(engine_fleet.budget_rule(b) for _, b in sorted(fleet.budgets.items()))
        self._excluded = {name: n for name, n in self._excluded.items() if name in fleet.pools}
        self._asks = {key: ask for key, ask in self._asks.items() if key in keys}
        self._grants = {key: g for key, g in self._grants.items() if key in keys}

    def capped(self, policy: model.ScalePolicy, cluster: types.ClusterState, *, now: float
               ) -> types.ClusterState:
        """The cluster state with the model's cap from the last arbitration.

        Never below the floor now (a warm floor that just rose is not cut while the
        fleet catches up). A model the fleet covers but has not arbitrated yet is held at
        what it has: on a start, 1,000 models deciding alone would each take the pool.
        """
        if not self.active:
            return cluster
        grant = self._grants.get(policy.key)
        spec = engine_spec.resolve(policy)
        floor_gpus = spec.floor_at(now)[0] * spec.gpus_per_replica
        if grant is None:
            if self._fleet.pool_of(policy) is None and not self._fleet.budgets_of(policy):
                return cluster
            cap, reason = max(cluster.current * spec.gpus_per_replica, floor_gpus), AWAITING
        elif grant.cap_gpus is None:
            return cluster
        else:
            cap, reason = max(grant.cap_gpus, floor_gpus), grant.reason
        return dataclasses.replace(cluster, budget_gpus=cap, budget_reason=reason)

    def record(self, policy: model.ScalePolicy, decision: types.Decision,
               cluster: types.ClusterState, *, now: float) -> bool:
        """Keep a decision's ask; True when it differs from the last one (re-arbitrate)."""
        if not self.active:
            return False
        pool = policy.spec.node_pool
        if pool is not None and pool.name in self._fleet.pools:
            self._excluded[pool.name] = cluster.excluded_gpus
        ask = engine_fleet.ask_of(policy, decision, now=now)
        changed = self._asks.get(policy.key) != ask
        self._asks[policy.key] = ask
        return changed

    def arbitrate(self) -> list[str]:
        """Arbitrate the latest asks; the keys whose cap changed, to evaluate again."""
        if not self.active:
            return []
        pools = [engine_fleet.pool_capacity(pool, excluded_gpus=self._excluded.get(name, 0))
                 for name, pool in self._fleet.pools.items()]
        grants = engine_fleet.arbitrate(pools, self._budgets, self._asks.values())
        self.arbitrations += 1
        moved = sorted(key for key, grant in grants.items()
                       if key not in self._grants
                       or self._grants[key].cap_gpus != grant.cap_gpus)
        self._grants = grants
        return moved

    def asks(self) -> list[engine_fleet.Ask]:
        """The latest ask of every model recorded, by key."""
        return [self._asks[key] for key in sorted(self._asks)]

    def grant(self, key: str) -> engine_fleet.Grant | None:
        """The model's grant from the last arbitration (None before one)."""
        return self._grants.get(key)
