"""Scaling strategies that drive the simulated cluster, one module each, and their registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, traces
from scaler.sim.strategies import hpa, keda, kpa, oracle, scaler, static_peak


class Strategy(Protocol):
    """Decides spec.replicas every `period_s` from what it can observe of the cluster."""

    @property
    def name(self) -> str: ...

    @property
    def period_s(self) -> float: ...

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int: ...


@dataclass(slots=True)
class Context:
    """What constructors may use: the run's policy, profile, trace and pool, the rate
    estimate (`oracle-rate`), the oracle's plan, computed once when first asked for, and
    whether `scaler` writes pod-deletion-costs (`deletion_cost`, `--no-deletion-cost`)."""

    policy: policy_model.ScalePolicy
    profile: profiles.ReplicaProfile
    trace: traces.Trace
    pool: sim_cluster.PoolConfig
    rate_need: npt.NDArray[np.int64]
    planner: Callable[[], oracle.Plan]
    _plan: oracle.Plan | None = field(default=None, repr=False)
    deletion_cost: bool = True
    # What `scaler` starts having learned (`run.learned_on`: a model that has run before);
    # None: nothing, a model's first run.
    learned: engine_types.Learned | None = None

    def plan(self) -> oracle.Plan:
        if self._plan is None:
            self._plan = self.planner()
        return self._plan

    @property
    def per_node(self) -> int:
        return max(1, self.pool.gpus_per_node // self.policy.spec.resources.gpus_per_replica)


def _oracle(context: Context) -> Strategy:
    return oracle.Scheduled(
        policy=context.policy, schedule=context.plan().schedule,
        pod_start_s=context.profile.cold_start.pod_start_seconds,
        node_boot_s=context.pool.node_boot_s, per_node=context.per_node)


def _oracle_rate(context: Context) -> Strategy:
    return oracle.RateOracle(
        policy=context.policy, need=context.rate_need, profile=context.profile,
        gpus_per_node=context.pool.gpus_per_node,
        gpus_per_replica=context.policy.spec.resources.gpus_per_replica)


# One place that maps a strategy's name (CLI, JSON keys) to its constructor.
REGISTRY: dict[str, Callable[[Context], Strategy]] = {
    "scaler": lambda c: scaler.ScalerStrategy(
        c.policy, start_epoch_s=c.trace.start_s, deletion_cost=c.deletion_cost,
        state=engine_types.EngineState() if c.learned is None else c.learned.state()),
    "hpa": lambda c: hpa.Hpa(c.policy),
    "keda": lambda c: keda.Keda(c.policy),
    "kpa": lambda c: kpa.Kpa(c.policy),
    "oracle": _oracle,
    "static-peak": lambda c: static_peak.StaticPeak(c.plan().peak),
    "oracle-rate": _oracle_rate,
}
# What `scaler simulate` runs by default; every registered name is accepted.
STRATEGIES: tuple[str, ...] = ("scaler", "hpa", "keda", "kpa", "oracle", "static-peak")
NAMES: tuple[str, ...] = tuple(REGISTRY)


def make(name: str, context: Context) -> Strategy:
    """The named strategy; ValueError naming the choices for an unknown name."""
    try:
        build = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(NAMES)}") from None
    return build(context)
