"""The oracles: `oracle` (a tested lower bound on GPU-hours) and `oracle-rate` (the old estimate).

`oracle` knows the future. For each 60 s window it searches the least number of ready
replicas whose simulated p95 meets the SLO when the window's requests are served alone
from an idle cluster (the most favourable state any schedule can be in), then picks the
cheapest per-window schedule above those needs, counting what a replica costs to start.
That cost is a lower bound on the GPU-hours of every schedule whose ready replicas change
only at window boundaries and that meets the same windows (docs/simulation.md states the
proof and its assumption; tests/sim/test_oracle_bound.py checks it). The schedule is then
replayed on the same simulated cluster, replicas created one pod start ahead and nodes
booted one node boot ahead, and repaired where carry-over between windows made it miss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles, scoring, traces
from scaler.sim.strategies import bounds

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Replays of the schedule that may each add a replica to the windows it still missed:
# carry-over from the window before (a queue, long decodes) is what the idle-start search
# cannot see, so a replay can miss a window the search said its count meets.
REPAIR_ROUNDS = 4


def oracle_need(
    trace: traces.Trace,
    profile: profiles.ReplicaProfile,
    *,
    interval_s: float = scoring.SLO_WINDOW_S,
    bucket_s: float = 10.0,
    utilization: float = 0.85,
) -> IntArray:
    """`oracle-rate`'s replicas for each `interval_s`, from the arrival rate and mean lengths.

    Per 10 s bucket: arrival rate / (saturation rate of a replica for the bucket's mean
    lengths x utilization); per interval, the largest bucket. Example, Azure conv x 10:
    a bucket with 60 req/s of 1,155 in / 211 out, saturation 13.5 req/s at 0.85 ->
    ceil(60 / 11.5) = 6 replicas. Not a bound: on mixed lengths it can miss the SLO.
    """
    buckets = int(math.ceil((trace.duration_s + 1e-9) / bucket_s)) + 1
    index = (trace.arrival_s // bucket_s).astype(np.int64)
    count = np.bincount(index, minlength=buckets).astype(np.float64)
    inputs = np.bincount(index, weights=trace.input_tokens.astype(np.float64), minlength=buckets)
    outputs = np.bincount(index, weights=trace.output_tokens.astype(np.float64),
                          minlength=buckets)
    need = np.zeros(buckets)
    for b in np.flatnonzero(count).tolist():
        rate = count[b] / bucket_s
        capacity = profile.saturation_rate(input_tokens=inputs[b] / count[b],
                                           output_tokens=outputs[b] / count[b])
        need[b] = rate / (capacity * utilization)
    per_interval = int(round(interval_s / bucket_s))
    intervals = int(math.ceil(buckets / per_interval))
    padded = np.zeros(intervals * per_interval)
    padded[:buckets] = need
    peaks: FloatArray = padded.reshape(intervals, per_interval).max(axis=1)
    return np.ceil(peaks - 1e-9).astype(np.int64)


@dataclass(slots=True)
class RateOracle:
    """`oracle-rate`: each interval gets the replicas `oracle_need` estimates, ready on time.

    A replica needed from interval start s is created at s - pod start (the pod chain on
    a free GPU); nodes it will need are booted one node boot earlier by placeholder
    pods, which count as allocated GPUs while they hold a node. The yardstick before the
    search-based `oracle`: kept to show how far a rate estimate is from a bound.
    """

    policy: policy_model.ScalePolicy
    need: npt.NDArray[np.int64]
    profile: profiles.ReplicaProfile
    gpus_per_node: int
    gpus_per_replica: int
    interval_s: float = 60.0
    period_s: float = 1.0
    name: str = "oracle-rate"

    def _need_over(self, start: float, end: float) -> int:
        lo = max(int(start // self.interval_s), 0)
        hi = min(int(end // self.interval_s), self.need.size - 1)
        if hi < lo:
            return bounds.bounded(self.policy, 0)
        return bounds.bounded(self.policy, int(self.need[lo:hi + 1].max()))

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        pod_start = self.profile.cold_start.pod_start_seconds
        boot = cluster.pool.node_boot_s
        replicas = self._need_over(now, now + pod_start)
        ahead = self._need_over(now, now + pod_start + boot)
        per_node = self.gpus_per_node // self.gpus_per_replica
        nodes_ahead = math.ceil(ahead / per_node)
        nodes_now = math.ceil(replicas / per_node)
        cluster.set_placeholders(max(0, nodes_ahead - max(nodes_now, _nodes_holding(cluster))),
                                 now=now)
        return replicas


def _nodes_holding(cluster: sim_cluster.SimCluster) -> int:
    """Live nodes with at least one real replica on them."""
    used = {p.node for p in cluster.replicas() if p.node is not None}
    return len(used)


@dataclass(frozen=True, slots=True)
class Problem:
    """One trace on one simulated cluster under one SLO: what the oracle's search needs."""

    trace: traces.Trace
    profile: profiles.ReplicaProfile
    pool: sim_cluster.PoolConfig
    policy: policy_model.ScalePolicy
    metric: str
    threshold_s: float
    dt: float = 0.1
    # A removed replica's terminationGracePeriodSeconds (SimCluster.grace_s): the oracle
    # replays its schedules on the same cluster as the strategies it bounds.
    grace_s: float = sim_cluster.TERMINATION_GRACE_S
    # How requests reach the replicas (SimCluster.dispatch): the window searches and the
    # replays use the strategies' own.
    dispatch: sim_cluster.Dispatch = "push"

    @property
    def gpus_per_replica(self) -> int:
        return self.policy.spec.resources.gpus_per_replica

    @property
    def per_node(self) -> int:
        return max(1, self.pool.gpus_per_node // self.gpus_per_replica)

    @property
    def windows(self) -> int:
        """Windows from t=0 to the last arrival (the last one may be partial)."""
        return int(self.trace.duration_s // scoring.SLO_WINDOW_S) + 1 if self.trace.requests else 0

    @property
    def early_windows(self) -> int:
        """Windows that start before a pod created at t=0 is ready (8B, 105 s: 2)."""
        return int(math.ceil(self.profile.cold_start.pod_start_seconds / scoring.SLO_WINDOW_S))

    @property
    def cap(self) -> int:
        """Most replicas any schedule may have: the policy's max, and the pool's size."""
        cap = self.policy.spec.replicas.max
        if self.pool.max_nodes is not None:
            cap = min(cap, self.pool.max_nodes * self.per_node)
        return cap

    def window_lengths(self) -> FloatArray:
        """Seconds of each window that are billed (GPU-hours count until the last arrival)."""
        starts = np.arange(self.windows) * scoring.SLO_WINDOW_S
        return np.clip(self.trace.duration_s - starts, 0.0, scoring.SLO_WINDOW_S)

    def accepted(self) -> npt.NDArray[np.bool_]:
        """Requests within the profile's context (the others are rejected by everyone)."""
        return self.profile.accepts(input_tokens=self.trace.input_tokens,
                                    output_tokens=self.trace.output_tokens)


def window_meets(problem: Problem, *, requests: IntArray, start_s: float, replicas: int) -> bool:
    """Do `replicas` ready, idle replicas meet the SLO's p95 for these requests alone?

    The requests (one window's) replay on a fresh cluster from `start_s`; the run stops
    as soon as the answer is certain: enough requests are certain to miss (a request
    still unanswered `threshold` after it arrived will miss), or so few are left that the
    p95 meets even if they all miss. 200 requests (p95 at rank 189.05): the 11th certain
    miss ends the run, and so does the moment all but 9 have met the threshold
    (`scoring.misses_failing`, `scoring.misses_harmless`).
    """
    if replicas <= 0:
        return requests.size == 0
    trace = problem.trace
    window = traces.Trace(trace.path, trace.arrival_s[requests] - start_s,
                          trace.input_tokens[requests], trace.output_tokens[requests])
    sim = sim_cluster.SimCluster(
        trace=window, profile=problem.profile,
        pool=sim_cluster.PoolConfig(gpus_per_node=problem.pool.gpus_per_node,
                                    node_boot_s=problem.pool.node_boot_s),
        initial_replicas=replicas, dt=problem.dt, gpus_per_replica=problem.gpus_per_replica,
        dispatch=problem.dispatch)
    failing = scoring.misses_failing(requests.size)
    harmless = scoring.misses_harmless(requests.size)
    threshold = problem.threshold_s + scoring.EPSILON_S
    # An unanswered TTFT or e2e request past the threshold will miss; an ITL cannot tell.
    censorable = problem.metric != "itl"
    check_every = max(1, int(round(1.0 / sim.dt)))
    for step in range(sim.steps):
        now = sim.time_of_step(step)
        sim.advance(now)
        sim.run_step(now)
        if step % check_every and step != sim.steps - 1:
            continue
        values = scoring.judged(sim, problem.metric)
        reached = np.isfinite(values)
        misses = int(np.count_nonzero(values[reached] > threshold))
        late = int(np.count_nonzero(~reached & (now + sim.dt - sim.arrival > threshold))
                   ) if censorable else 0
        if misses + late >= failing:
            return False
        if misses + int(np.count_nonzero(~reached)) <= harmless:
            return True
        if reached.all():
            break
    return scoring.p95_within(scoring.judged(sim, problem.metric), problem.threshold_s)


def window_need(problem: Problem, *, requests: IntArray, start_s: float, guess: int) -> int | None:
    """The least replicas that meet the window from an idle start; None above the cap.

    Searched from `guess` (the rate estimate) down while it still meets and up while it
    does not, so two or three short replays per window; the walk relies on the window's
    p95 not rising with more replicas (a property tests/sim/test_oracle_bound.py checks).
    """
    if requests.size == 0:
        return 0
    cap = problem.cap
    replicas = min(max(guess, 1), cap)

    def meets(count: int) -> bool:
        return window_meets(problem, requests=requests, start_s=start_s, replicas=count)

    if meets(replicas):
        while replicas > 1 and meets(replicas - 1):
            replicas -= 1
        return replicas
    while replicas < cap:
        replicas += 1
        if meets(replicas):
            return replicas
    return None


def least_cost_schedule(
    need: IntArray, *, lengths: FloatArray, initial: int, start_cost_s: float,
) -> tuple[IntArray, float]:
    """The cheapest ready-replica count per window with `schedule >= need`, and its cost.

    Cost in replica-seconds: a replica costs each second it is ready, plus `start_cost_s`
    (the pod start, billed before it is ready, from t=0 at the earliest) each time one
    becomes ready after t=0; the `initial` replicas are ready at t=0. Level by level (the
    k-th replica is held in a window where need >= k): between two windows that need it,
    keep it idle through the gap or stop it and start it again, whichever costs less.
    8B profile (pod start 105 s): a one-window dip (60 s) is held, a two-window dip
    (120 s > 105 s) is not.
    """
    windows = need.size
    starts = np.arange(windows) * scoring.SLO_WINDOW_S
    schedule = np.zeros(windows, dtype=np.int64)
    total = 0.0
    top = int(need.max()) if windows else 0
    for level in range(1, top + 1):
        required = np.flatnonzero(need >= level)
        alive = np.zeros(windows, dtype=bool)
        alive[required] = True
        total += float(lengths[required].sum())
        first = int(required[0])
        restart = min(start_cost_s, float(starts[first]))
        if level <= initial and float(lengths[:first].sum()) <= restart:
            alive[:first] = True
            total += float(lengths[:first].sum())
        else:
            total += restart
        for before, after in zip(required[:-1].tolist(), required[1:].tolist(), strict=True):
            if after == before + 1:
                continue
            hold = float(lengths[before + 1:after].sum())
            restart = min(start_cost_s, float(starts[after]))
            if hold <= restart:
                alive[before + 1:after] = True
                total += hold
            else:
                total += restart
        schedule += alive
    return schedule, total


@dataclass(slots=True)
class Scheduled:
    """Replays a per-window schedule of ready replicas, ready when each window starts.

    A replica is created one pod start before the window that needs it; if it will need
    a node the pool does not have, one node boot earlier still (its pending pod makes the
    cluster autoscaler boot the node in time, and bills only its own GPUs meanwhile).
    Replicas go at the start of the first window that does not need them. Used for the
    oracle's schedule and for any hand-made one.
    """

    policy: policy_model.ScalePolicy
    schedule: IntArray
    pod_start_s: float
    node_boot_s: float
    per_node: int
    period_s: float = 1.0
    name: str = "oracle"

    def _need_over(self, start: float, end: float) -> int:
        lo = max(int(start // scoring.SLO_WINDOW_S), 0)
        hi = min(int((end + 1e-6) // scoring.SLO_WINDOW_S), self.schedule.size - 1)
        if hi < lo:
            return 0
        return int(self.schedule[lo:hi + 1].max())

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        # Decisions come every period: a start that falls between two is made at the
        # earlier one (ready up to one period early: 105 s is a whole number of them).
        lead = math.ceil(self.pod_start_s / self.period_s - 1e-9) * self.period_s
        ready_in_time = self._need_over(now, now + lead)
        with_a_node_boot = self._need_over(now, now + lead + self.node_boot_s)
        capacity = cluster.live_node_count * self.per_node
        # Only the replicas beyond what the live nodes hold start a node boot earlier.
        early = max(0, with_a_node_boot - max(ready_in_time, capacity))
        return bounds.bounded(self.policy, ready_in_time + early)


# Replays a strategy from `initial` ready replicas on a trace, on the problem's cluster
# (run.run_strategy).
Runner = Callable[[Scheduled, int, traces.Trace], sim_cluster.SimCluster]


@dataclass(frozen=True, slots=True)
class Plan:
    """The oracle's plan for one trace.

    targets: feasible windows (each request alone on an idle replica meets the SLO) that
      some schedule within the policy's and pool's bounds can meet.
    need: per window, the least replicas meeting it from an idle start (the policy's
      min outside targets): every schedule of the bounded class needs at least these.
    schedule: the replayed ready replicas per window (need, repaired for carry-over,
      with the rate estimate outside targets so their traffic is still carried).
    initial: replicas ready at t=0 for every strategy (what the windows before the first
      possible pod start need).
    lower_bound_gpu_hours: the cheapest cost of any schedule >= need (the proven bound).
    replayed: the replay of `schedule` (the oracle's run), when the plan replayed it.
    """

    targets: frozenset[int]
    need: IntArray
    schedule: IntArray
    initial: int
    lower_bound_gpu_hours: float
    replayed: sim_cluster.SimCluster | None = None

    @property
    def peak(self) -> int:
        return int(self.schedule.max()) if self.schedule.size else 0


def _rate_guess(problem: Problem, *, utilization: float = 0.85) -> IntArray:
    """`oracle_need` per window (0.85: `oracle-rate`'s headroom; 1.0: the search's guess)."""
    guess = oracle_need(problem.trace, problem.profile, utilization=utilization)
    out = np.zeros(problem.windows, dtype=np.int64)
    size = min(out.size, guess.size)
    out[:size] = guess[:size]
    return out


def search_needs(problem: Problem, *, feasible: set[int], below: int | None = None
                 ) -> tuple[IntArray, frozenset[int]]:
    """Per window the least replicas that meet it from an idle start, and the targets
    (feasible windows met within the bounds); only windows before `below` if given."""
    accepted = np.flatnonzero(problem.accepted())
    windows = scoring.windows_of(problem.trace.arrival_s[accepted])
    order = np.argsort(windows, kind="stable")
    splits = np.flatnonzero(np.diff(windows[order])) + 1
    # The formula at saturation is usually the need or one above it (mixed lengths
    # saturate below it): one below it, the walk mostly takes two replays, one fewer than
    # the need failing (early, so cheaply) and the need meeting.
    guess = _rate_guess(problem, utilization=1.0) - 1
    need = np.zeros(problem.windows, dtype=np.int64)
    targets: set[int] = set()
    for group in np.split(order, splits):
        if not group.size:
            continue
        window = int(windows[group[0]])
        if window not in feasible or (below is not None and window >= below):
            continue
        found = window_need(problem, requests=accepted[group],
                            start_s=window * scoring.SLO_WINDOW_S, guess=int(guess[window]))
        if found is not None:
            need[window] = found
            targets.add(window)
    return need, frozenset(targets)


def initial_replicas(problem: Problem, *, feasible: set[int], run: Runner | None = None) -> int:
    """Replicas ready at t=0 for every strategy: enough for the windows that start before
    a pod created at t=0 could serve (8B: pod start 105 s, so windows 0 and 1).

    First their need from an idle start; then, with `run`, as many more as a replay of
    the trace's first minutes needs to meet them: the warm-up traffic before t=0 (see
    `SimCluster`) leaves a backlog an idle start does not have. The replay keeps one
    window more than it judges, whose arrivals share the replicas' batches.
    """
    early = problem.early_windows
    need, targets = search_needs(problem, feasible=feasible, below=early)
    initial = bounds.bounded(problem.policy, max(int(need.max(initial=0)), 1))
    if run is None or not targets:
        return initial
    trace = problem.trace
    kept = trace.arrival_s < (early + 1) * scoring.SLO_WINDOW_S
    first = dataclasses.replace(problem, trace=traces.Trace(
        trace.path, trace.arrival_s[kept], trace.input_tokens[kept], trace.output_tokens[kept],
        start_s=trace.start_s))
    while initial < problem.cap:
        held = np.full(first.windows, initial, dtype=np.int64)
        if targets <= replay_met(first, run(scheduled(first, held), initial, first.trace)):
            break
        initial += 1
    return initial


def replay_met(problem: Problem, cluster: sim_cluster.SimCluster) -> set[int]:
    """Windows whose p95 met the SLO in a replay (rejected requests are nobody's miss)."""
    judged = scoring.judged(cluster, problem.metric)
    windows = scoring.windows_of(problem.trace.arrival_s)
    keep = problem.accepted()
    met = scoring.window_met(judged[keep], windows[keep], problem.threshold_s)
    return {w for w, ok in met.items() if ok}


def scheduled(problem: Problem, schedule: IntArray, *, name: str = "oracle") -> Scheduled:
    """The replay strategy of a per-window schedule on the problem's cluster."""
    return Scheduled(policy=problem.policy, schedule=schedule,
                     pod_start_s=problem.profile.cold_start.pod_start_seconds,
                     node_boot_s=problem.pool.node_boot_s, per_node=problem.per_node,
                     name=name)


def make_plan(
    problem: Problem, *, feasible: set[int], initial: int | None = None,
    run: Runner | None = None,
) -> Plan:
    """Search the needs, schedule above them, replay and repair (see the module docstring).

    `initial` defaults to `initial_replicas`. `run(strategy, initial, trace)` replays a
    schedule on the cluster; without it the plan is the needs' cheapest schedule,
    unrepaired.
    """
    need, targets = search_needs(problem, feasible=feasible)
    spec = problem.policy.spec
    pod_start = problem.profile.cold_start.pod_start_seconds
    lengths = problem.window_lengths()
    floor = bounds.bounded(problem.policy, 0)
    bound_need = np.maximum(need, floor)
    if initial is None:
        initial = initial_replicas(problem, feasible=feasible, run=run)
    _, bound_s = least_cost_schedule(bound_need, lengths=lengths, initial=initial,
                                     start_cost_s=pod_start)
    outside = np.array([w not in targets for w in range(problem.windows)], dtype=bool)
    run_need = np.where(outside, np.minimum(np.maximum(_rate_guess(problem), floor),
                                            spec.replicas.max), bound_need)
    # The start was sized for the windows before a first pod could serve: hold it there.
    early = problem.early_windows
    run_need[:early] = np.maximum(run_need[:early], initial)
    schedule, _ = least_cost_schedule(run_need, lengths=lengths, initial=initial,
                                      start_cost_s=pod_start)
    replayed: sim_cluster.SimCluster | None = None
    for repair in range(REPAIR_ROUNDS + 1 if run is not None else 0):
        assert run is not None
        replayed = run(scheduled(problem, schedule), initial, problem.trace)
        missed = [w for w in sorted(targets - replay_met(problem, replayed))
                  if run_need[w] < problem.cap]
        if not missed or repair == REPAIR_ROUNDS:
            break
        run_need[missed] += 1
        schedule, _ = least_cost_schedule(run_need, lengths=lengths, initial=initial,
                                          start_cost_s=pod_start)
    return Plan(targets=targets, need=bound_need, schedule=schedule, initial=initial,
                lower_bound_gpu_hours=bound_s * problem.gpus_per_replica / 3600.0,
                replayed=replayed)
