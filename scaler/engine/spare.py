"""Scale-down that spares work: a replica's deletion cost from its work, and the replicas
a batch tier keeps while they have unfinished work (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scaler.engine import types

INT32_MAX = 2**31 - 1
"""The largest pod-deletion-cost: the annotation must parse as an int32 (the API server
refuses anything else with 422 "must be a 32bit integer")."""


@dataclass(frozen=True, slots=True)
class PodWork:
    """What one replica (a message's `source`, its pod name: DESIGN 4.2) reports it holds:
    requests running (`in_flight`) and waiting at it (`queue_depth`), fresh values only."""

    in_flight: float = 0.0
    queue_depth: float = 0.0

    @property
    def unfinished(self) -> bool:
        """Work that a deletion would cut or throw away: anything running or queued."""
        return self.in_flight > 0 or self.queue_depth > 0


def work_by_source(*, in_flight: Mapping[str, float], queue_depth: Mapping[str, float]
                   ) -> dict[str, PodWork]:
    """Each source's work from its fresh per-source values of the two signals; a source
    that reports only one of them has 0 for the other."""
    return {source: PodWork(in_flight=in_flight.get(source, 0.0),
                            queue_depth=queue_depth.get(source, 0.0))
            for source in sorted({*in_flight, *queue_depth})}


def deletion_cost(work: PodWork) -> int:
    """Requests a deletion would cut: running + waiting, rounded up, within 0..INT32_MAX.

    Rounded up so that any work at all (0.5 from an averaging reporter) ranks above an idle
    pod. Example: 30 running + 12 waiting -> 42; a value of 1e12 (never past the parser's
    bounds, but the annotation must stay an int32) -> 2147483647.
    """
    total = work.in_flight + work.queue_depth
    if not total > 0:  # 0, negative or NaN: nothing known to cut
        return 0
    return INT32_MAX if total >= INT32_MAX else math.ceil(total)


def neutral_cost(reported: Iterable[int]) -> int:
    """The cost of a pod with no fresh report: the median (lower middle) of the reporting
    pods' costs, 0 when none reports.

    A pod whose work is unknown is taken for a typical pod: deleted after the pods known to
    be idler, before those known to be busier. Not 0 while others report, as a pod whose
    reporter lags may be mid-generation; not the highest, as a broken reporter would then
    pin its pod forever. With no report at all the cost is Kubernetes' own default for a
    pod without the annotation (0), so the ReplicaSet controller ranks it as it would
    without scaler. Example: reported 0, 3, 40 -> a silent pod costs 3.
    """
    costs = sorted(reported)
    return statistics.median_low(costs) if costs else 0


def costs(pods: Iterable[str], work: Mapping[str, PodWork]) -> dict[str, int]:
    """Each pod's deletion cost: from its own report, or the neutral cost without one.
    Sources that are no pod of the target (a gateway's shared queue) are ignored."""
    names = list(pods)
    reported = {name: deletion_cost(work[name]) for name in names if name in work}
    neutral = neutral_cost(reported.values())
    return {name: reported.get(name, neutral) for name in names}


PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}
"""A pod's phase as the ReplicaSet controller ranks it for removal (an unknown phase
ranks as Pending)."""

RemovalRank = tuple[bool, int, bool, int, float, int, float]


def removal_rank(*, scheduled: bool, phase: str, ready: bool, cost: int,
                 ready_at: float | None, restarts: int, created_at: float | None
                 ) -> RemovalRank:
    """The order in which a ReplicaSet removes pods on scale-down: sort by this, first
    removed first. One rule for the emulator's controller and the simulator.

    The ReplicaSet controller's `getPodsToDelete` sorts by `ActivePodsWithRanks.Less`
    (kubernetes pkg/controller/controller_utils.go, read with the search tool):
    unscheduled before scheduled; Pending < Unknown < Running; not ready before ready;
    the lower `controller.kubernetes.io/pod-deletion-cost` (`cost`; absent or invalid =
    0); then, left out here, pods doubled up on a node; the most recently ready; the most
    restarted; the newest. Times are exact here, not the LogarithmicScaleDown buckets.
    Example: two ready pods, costs 9 and 0 -> the one at 0 goes first, whichever is newer;
    at equal cost the one ready last goes first.
    """
    return (scheduled, PHASE_RANK.get(phase, 0), ready, cost,
            # A missing time ranks first ("empty time < less time"), then the latest.
            -(ready_at if ready and ready_at is not None else float("inf")),
            -restarts, -(created_at if created_at is not None else float("inf")))


def busy_replicas(work: Mapping[str, PodWork]) -> int:
    """How many sources report unfinished work (fresh in_flight > 0 or queue > 0)."""
    return sum(1 for each in work.values() if each.unfinished)


def busy_floor(cluster: types.ClusterState) -> int:
    """The replicas a scale-down must keep for the work they hold: the busy ones, never
    more than the target has (this rule only stops removals, it never adds a replica).

    0 when the cluster reader set no busy count (not a batch tier). The caps that follow
    it in the engine (max, the policy's and the tenant's or pool's GPU budget) still win:
    a model over its budget gives up busy replicas down to the budget, and no further.
    Example: 6 replicas, 4 busy, demand for 2 -> 4; the same with a budget of 3 replicas'
    GPUs -> 3.
    """
    if cluster.busy_replicas is None:
        return 0
    return max(0, min(cluster.busy_replicas, cluster.current))
