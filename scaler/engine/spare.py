"""Scale-down that spares work: a replica's deletion cost from its work, and the replicas
a batch tier keeps while they have unfinished work (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scaler.core import vocabulary
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


def silent_cost(reported: Iterable[int], *, tier: vocabulary.Tier) -> int:
    """The deletion cost of a pod that sends no fresh report, from the costs of the
    target's pods that do (`reported`, `deletion_cost`: 0 idle, >= 1 any work).

    Its work is unknown, so it is never removed before a pod known to be idle: while any
    pod reports, it costs at least 1, above an idle pod's 0 (at equal cost the ReplicaSet
    removes the most recently ready first, which may well be the silent one). Beyond that:
    - online and dev tiers: a typical pod, the median (lower middle) of the reports,
      removed after the idler pods and before the busier ones; not the highest, or a
      broken reporter would pin its pod. Reported 0, 40 -> 1 (the median, 0, would tie
      with the idle pod); 0, 3, 40 -> 3.
    - batch tier (a replica with unfinished work is never removed unless its budget is
      exceeded): possibly busy, so a typical busy pod, the median of the busy reports (1
      when none is busy). The busy floor keeps it as it keeps the busy ones
      (`possibly_busy`); when a budget cuts below the floor, it goes after the busy pods
      holding less than the median busy one. Reported 0 (idle), 5 (busy) -> 5: the idle
      pod goes first and the silent one is kept beside the busy one; 0, 0, 0, 40 -> 40,
      where an online tier says 1.
    With no report at all, 0: no pod is known to be idle, and the ReplicaSet ranks them
    by Kubernetes' default for a pod without the annotation, as it would without scaler.
    """
    costs = sorted(reported)
    if not costs:
        return 0
    if tier is vocabulary.Tier.BATCH:
        costs = [cost for cost in costs if cost > 0] or [1]
    return max(1, statistics.median_low(costs))


def costs(pods: Iterable[str], work: Mapping[str, PodWork], *, tier: vocabulary.Tier
          ) -> dict[str, int]:
    """Each pod's deletion cost: from its own report, or `silent_cost` without one.
    Sources that are no pod of the target (a gateway's shared queue) are ignored."""
    names = list(pods)
    reported = {name: deletion_cost(work[name]) for name in names if name in work}
    silent = silent_cost(reported.values(), tier=tier)
    return {name: reported.get(name, silent) for name in names}


def answer_seconds(snapshot: types.SignalSnapshot) -> float | None:
    """How long a request stays running at its replica on average, by Little's law:
    requests running / requests finished per second (fresh readings only; None without
    both or with nothing finishing). Example: 400 running while 4 finish a second: 100 s,
    a reasoning model's 4,000-token answers at ~25 ms a token."""
    running, finished = snapshot.in_flight, snapshot.completion_rate
    if (running is None or not running.fresh or finished is None or not finished.fresh
            or not finished.value > 0 or not running.value > 0):
        return None
    seconds = running.value / finished.value
    return seconds if math.isfinite(seconds) else None


def cut_warning(*, snapshot: types.SignalSnapshot, cluster: types.ClusterState,
                desired: int) -> str | None:
    """Why a scale-down to `desired` kills answers still running, or None.

    A removed pod gets its terminationGracePeriodSeconds to finish (a server that drains
    on SIGTERM serves what it holds, then is killed): answers that need longer are cut,
    their GPU time wasted and their users served an error. Deletion costs pick the idlest
    replicas, but under a steady load every replica runs some. When answers last longer
    on average (`answer_seconds`) than the pods' grace period, most of what a removed
    replica runs is cut. Example: 100 s answers against Kubernetes' default 30 s. The
    remedy is the Deployment's, not the count's: a grace period above the answers' time.
    """
    grace = cluster.grace_period_s
    if desired >= cluster.current or grace is None:
        return None
    seconds = answer_seconds(snapshot)
    if seconds is None or seconds <= grace:
        return None
    return (f"answers run {seconds:.0f} s at a replica on average (running / finished per "
            f"second), longer than the pods' terminationGracePeriodSeconds of {grace:g} s: "
            "a replica removed by this scale-down is killed with the answers it still "
            "runs. Set the Deployment's grace period above the answers' time, with a "
            "server that drains on SIGTERM")


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


def possibly_busy(work: Mapping[str, PodWork], *, pods: frozenset[str] | None,
                  ready: frozenset[str] | None) -> int:
    """A batch tier's replicas that may hold unfinished work (`ClusterState.busy_replicas`):
    the sources in `work` reporting some (`busy_replicas`), plus the target's ready pods
    (`ready`) that send no report while another of its live pods (`pods`) does.

    A silent pod's reporter may lag, or have died with the generation still running:
    removing it could cut a job, which a batch tier never does unless over budget, so it
    counts as busy. Example: pods a (reports nothing in flight), b (5 in flight) and c
    (silent, ready): 1 + 1 = 2, so a scale-down to 1 is held at 2 and only a goes
    (`silent_cost` ranks c with b). Not counted:
    - a pod not ready: it holds no work yet, and the ReplicaSet removes not-ready pods
      before ready ones whatever their cost, so counting it would only stop a scale-up
      from being called off;
    - any pod while none of the target's pods reports (or the reader cannot name them,
      `pods` None): the model's signals then come from Prometheus or a gateway, no
      pod's work is known, and counting every pod would stop the model from ever
      scaling down. The floor is what the reports say, as without this rule; if the pods
      are the signals' only sources, their silence makes the signals stale, and stale
      signals hold the replicas anyway (DESIGN 3.5).
    """
    busy = busy_replicas(work)
    if pods is None or ready is None or not any(name in work for name in pods):
        return busy
    return busy + sum(1 for name in ready if name not in work)


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
