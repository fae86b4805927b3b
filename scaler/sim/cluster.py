"""The simulated GPU cluster: continuous-batching replicas, pod start chains, node pools."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from scaler.engine import spare as engine_spare
from scaler.engine import types as engine_types
from scaler.sim import profiles, traces

PodPhase = Literal["pending", "starting", "ready", "draining", "gone"]
# How a model's requests reach its replicas (`SimCluster.dispatch`, the fleet file's
# `dispatch`):
# - "push": a Kubernetes Service (or gateway) in front of vLLM. Each request is sent at
#   arrival to the least-loaded ready replica and waits in that replica's own queue; a
#   replica removed by a scale-down keeps its queue and is killed with it at the end of
#   its grace period.
# - "queue": a work queue the replicas pull from, as batch inference fed from a NATS
#   JetStream work-queue stream: one pull consumer shared by the replicas, which hands out
#   messages in stream order, each replica fetching one only when it can start it now
#   (one per free batch slot: at most max_batch unacknowledged at a replica, 256 for the
#   8B profile, so 12 replicas hold at most 3,072, within a consumer MaxAckPending of at
#   least that; everything beyond waits in the stream, the consumer's num_pending, and a
#   message is acknowledged when its answer is done). Arrivals wait in the model's one
#   shared FIFO queue (`SimCluster.gateway`); a ready replica takes its head only when
#   `_admit`'s rules admit it at once (a batch slot, KV room, prefill backlog below one
#   step), so nothing waits at a replica. A removed replica fetches nothing more and
#   holds only the answers it started: at its grace period's end only those are cut, and
#   the queue it never took stays for the others. Example: 4 replicas running 30 each
#   with 200 waiting, one removed: push keeps the ~50 of the 200 queued at it and loses
#   up to 80 at the kill (its 30 and those 50); queue loses at most its 30, and the 200
#   go to the other three. (JetStream would redeliver a cut message after its AckWait;
#   the simulator counts it cut and retries nothing, as in push mode.)
Dispatch = Literal["push", "queue"]
DISPATCH_MODES: tuple[Dispatch, ...] = ("push", "queue")

# The Kubernetes cluster autoscaler removes a node that has been unneeded this long
# (--scale-down-unneeded-time default 10 min).
NODE_UNNEEDED_S = 600.0
# After the trace ends, in-flight requests get this long to finish before the run stops.
DRAIN_TAIL_S = 600.0
# A removed replica's requests get this long to finish: Kubernetes' default
# terminationGracePeriodSeconds. The simulator assumes a server that drains on SIGTERM
# (vLLM with --shutdown-timeout at least this, SGLang by default): it takes no new
# requests (its endpoint is removed at once), keeps serving what is running and queued
# at it, and is killed at the end of the grace period; what it still holds then is cut
# (`SimCluster.interrupted`). vLLM's default --shutdown-timeout 0 aborts at SIGTERM:
# grace_s=0. 8B profile, a batch of 100: ~18 ms a token, so a 1,500-token answer needs
# ~27 s and one of 3,000 is cut halfway (docs/simulation.md, "Scale-down"). A model's own
# value: the fleet file's terminationGracePeriodSeconds, --termination-grace-period.
TERMINATION_GRACE_S = 30.0
# The longest grace period a run accepts: a day. Kubernetes sets no bound (int64 seconds),
# but a removed replica that may drain for more than a day is a unit slip (milliseconds
# written as seconds: 30000), and no replayed slice needs it.
MAX_GRACE_S = 86_400

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The node pool a model's replicas land on."""

    gpus_per_node: int
    node_boot_s: float
    max_nodes: int | None = None


@dataclass(slots=True)
class Pod:
    """A replica pod (or a placeholder holding a whole node). Mutable simulation state."""

    slot: int
    created_at: float
    gpus: int
    placeholder: bool = False
    node: int | None = None
    scheduled_at: float | None = None
    ready_at: float | None = None
    phase: PodPhase = "pending"
    gone_at: float | None = None
    # controller.kubernetes.io/pod-deletion-cost as last written (0: none, as Kubernetes
    # reads an absent annotation), and when a scale-down removed the pod (its SIGTERM).
    deletion_cost: int = 0
    removed_at: float | None = None


@dataclass(slots=True)
class Node:
    node_id: int
    ready_at: float
    gpus: int
    used: int = 0
    empty_since: float | None = None
    gone: bool = False


@dataclass(slots=True)
class History:
    """Per-step series (one entry per `dt`), preallocated for the run's horizon."""

    steps: int
    waiting: IntArray = field(init=False)
    running: IntArray = field(init=False)
    ready: IntArray = field(init=False)
    starting: IntArray = field(init=False)
    nodes: IntArray = field(init=False)
    spec: IntArray = field(init=False)
    tokens: FloatArray = field(init=False)
    busy_ready: FloatArray = field(init=False)
    arrivals: IntArray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("waiting", "running", "ready", "starting", "nodes", "spec", "arrivals"):
            setattr(self, name, np.zeros(self.steps, dtype=np.int64))
        self.tokens = np.zeros(self.steps)
        self.busy_ready = np.zeros(self.steps)


class SimCluster:
    """One model's replicas on one node pool, serving one trace, on a virtual clock.

    Time advances in fixed steps of `dt` seconds. Within a step each replica is a fluid
    continuous-batching server (see `_serve`); arrivals are routed at step boundaries to
    the least-loaded ready replica, so a request waits on average dt/2 before its
    replica sees it (0.05 s at the default 0.1 s step). `dispatch="queue"`: arrivals wait
    in one shared queue that the replicas pull from when they have room (`Dispatch`).
    """

    def __init__(
        self,
        *,
        trace: traces.Trace,
        profile: profiles.ReplicaProfile,
        pool: PoolConfig,
        initial_replicas: int,
        dt: float = 0.1,
        gpus_per_replica: int | None = None,
        warmup_s: float = 0.0,
        grace_s: float = TERMINATION_GRACE_S,
        dispatch: Dispatch = "push",
    ) -> None:
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {', '.join(DISPATCH_MODES)}, "
                             f"not {dispatch!r}")
        self.trace = trace
        self.grace_s = grace_s
        self.dispatch: Dispatch = dispatch
        self.profile = profile
        self.pool = pool
        self.dt = dt
        self.gpus_per_replica = gpus_per_replica or profile.gpus_per_replica
        self.pod_start_s = profile.cold_start.pod_start_seconds
        # Warm-up (`traces.warmup`): the requests of the trace's first `warmup_s` seconds,
        # at those seconds' times played backwards before t=0, so at t=0 the replicas are
        # busy as in the load's first seconds instead of empty (an empty start looks like
        # a ramp from zero to anything that fits a trend). Requests with index < `first`
        # are warm-up traffic: served, never scored; time starts at t0 < 0.
        sent, repeats = traces.warmup(trace.arrival_s, warmup_s)
        self.first = warm = int(sent.size)
        self.t0 = -float(warmup_s) if warm else 0.0
        self.arrival = np.concatenate((sent + self.t0, trace.arrival_s))
        inputs = np.concatenate((trace.input_tokens[repeats], trace.input_tokens))
        outputs = np.concatenate((trace.output_tokens[repeats], trace.output_tokens))
        n = self.arrival.size
        self.input_tokens = np.maximum(inputs, 1).astype(np.float64)
        self.output_tokens = np.maximum(outputs, 1).astype(np.float64)
        # KV reserved at admission: prompt + all output tokens. A request longer than the
        # context (maxModelLen, never more than the cache) is rejected as vLLM's API server
        # does (HTTP 400, "maximum context length is ... tokens"): never routed, never
        # served. 8B profile: a 120,000-token prompt asking for 20,000 tokens exceeds 131,072.
        self.kv_need = self.input_tokens + self.output_tokens
        self.rejected = ~profile.accepts(input_tokens=inputs, output_tokens=outputs)
        self.accepted = int(n - np.count_nonzero(self.rejected))
        self.prefill_left = self.input_tokens.copy()
        # The prefill step emits the first token; the rest are decode steps.
        self.decode_left = self.output_tokens - 1.0
        self.replica = np.full(n, -1, dtype=np.int64)
        self.first_token = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        self.next_arrival = 0
        # Push dispatch: requests held while no replica is ready (an activator's buffer),
        # routed when one is. Queue dispatch: the model's shared work queue, FIFO.
        self.gateway: deque[int] = deque()
        self.active: IntArray = np.zeros(0, dtype=np.int64)
        self.completed = 0
        # Requests cut when their replica was killed at the end of its grace period
        # (warm-up included; `interrupted_count` counts them).
        self.interrupted = np.zeros(n, dtype=bool)
        self.interrupted_count = 0
        # Per replica slot (slots are never reused, so arrays only grow).
        self.pods: list[Pod] = []
        self.queues: list[deque[int]] = []
        self.running: list[int] = []
        self.kv_used: list[float] = []
        self.load: list[int] = []
        # Prompt tokens admitted but not yet prefilled, per slot (after the last step).
        self.prefill_backlog: list[float] = []
        self.ready_slots: list[int] = []
        self.serving_slots: set[int] = set()
        # Slots of pods not yet gone, and of real pods not yet ready: kept as sets so a
        # step costs O(live pods), not O(every pod ever created in the run).
        self.live_slots: set[int] = set()
        self.not_ready: set[int] = set()
        self.nodes: list[Node] = []
        self.live_node_count = 0
        self.spec_replicas = 0
        self.scale_events = 0
        self.max_spec = 0
        self.observations: list[engine_types.ColdStartObservation] = []
        self.useful_gpu_s = 0.0
        # Horizon: the trace plus a drain tail, in steps.
        self.steps = int(math.ceil((trace.duration_s + DRAIN_TAIL_S - self.t0) / dt)) + 1
        self.history = History(self.steps)
        # Per step: requests that got their first token, and requests that finished (ids),
        # so a per-replica metrics feed can build latency histograms for any window.
        self.first_ids_by_step: list[IntArray] = []
        self.done_ids_by_step: list[IntArray] = []
        # Generated tokens per replica slot, cumulative (a Prometheus-style counter).
        self.tokens_by_slot: FloatArray = np.zeros(16)
        # Prompt tokens prefilled per slot (vLLM's prompt_tokens_total, per pod).
        self.prompt_tokens_by_slot: FloatArray = np.zeros(16)
        self._step_first: IntArray = np.zeros(0, dtype=np.int64)
        self._step_done: IntArray = np.zeros(0, dtype=np.int64)
        self.step = 0
        self._bootstrap(initial_replicas)

    # ----- lifecycle -------------------------------------------------------------------

    def _bootstrap(self, replicas: int) -> None:
        """Start with `replicas` ready at t=0 on booted nodes (a cluster in steady state)."""
        per_node = self.pool.gpus_per_node // self.gpus_per_replica
        t0 = self.t0
        for _ in range(math.ceil(replicas / per_node) if replicas else 0):
            self._add_node(ready_at=t0)
        for _ in range(replicas):
            pod = self._new_pod(now=t0)
            self._place(pod, now=t0)
            pod.ready_at = t0
        self.spec_replicas = replicas
        self.max_spec = replicas
        self.advance(t0)

    def _add_node(self, *, ready_at: float) -> Node:
        node = Node(len(self.nodes), ready_at, self.pool.gpus_per_node)
        self.nodes.append(node)
        self.live_node_count += 1
        return node

    def _new_pod(self, *, now: float, placeholder: bool = False) -> Pod:
        gpus = self.pool.gpus_per_node if placeholder else self.gpus_per_replica
        pod = Pod(len(self.pods), now, gpus, placeholder=placeholder)
        self.pods.append(pod)
        self.live_slots.add(pod.slot)
        if not placeholder:
            self.not_ready.add(pod.slot)
        self.queues.append(deque())
        self.running.append(0)
        self.kv_used.append(0.0)
        self.load.append(0)
        self.prefill_backlog.append(0.0)
        if pod.slot >= self.tokens_by_slot.size:
            size = max(16, 2 * self.tokens_by_slot.size)
            self.tokens_by_slot = _grown(self.tokens_by_slot, size)
            self.prompt_tokens_by_slot = _grown(self.prompt_tokens_by_slot, size)
        return pod

    def _place(self, pod: Pod, *, now: float) -> bool:
        """Bind a pod to a node with room (ready first, then booting); else leave it pending.

        A pod on a booting node is scheduled when the node is ready: its start chain
        (pull, load, readiness) begins then.
        """
        candidates = sorted((n for n in self.nodes if not n.gone and n.gpus - n.used >= pod.gpus),
                            key=lambda n: (n.ready_at > now, n.ready_at, n.node_id))
        if not candidates:
            return False
        node = candidates[0]
        node.used += pod.gpus
        node.empty_since = None
        pod.node = node.node_id
        pod.scheduled_at = max(now, node.ready_at)
        pod.ready_at = pod.scheduled_at + (0.0 if pod.placeholder else self.pod_start_s)
        pod.phase = "starting"
        return True

    def _release(self, pod: Pod, *, now: float) -> None:
        if pod.node is not None:
            node = self.nodes[pod.node]
            node.used -= pod.gpus
            if node.used == 0:
                node.empty_since = now
        pod.phase = "gone"
        pod.gone_at = now
        self.serving_slots.discard(pod.slot)
        self.live_slots.discard(pod.slot)
        self.not_ready.discard(pod.slot)

    def _autoscale_nodes(self, *, now: float) -> None:
        """Cluster autoscaler: boot nodes for unplaced pods; remove nodes unneeded for 10 min."""
        unplaced = sorted((self.pods[s] for s in self.live_slots
                           if self.pods[s].phase == "pending"), key=lambda p: p.slot)
        for pod in unplaced:
            if self._place(pod, now=now):
                continue
            if self.pool.max_nodes is not None and self.live_node_count >= self.pool.max_nodes:
                break
            self._add_node(ready_at=now + self.pool.node_boot_s)
            self._place(pod, now=now)
        for node in self.nodes:
            if (not node.gone and node.used == 0 and node.empty_since is not None
                    and now - node.empty_since >= NODE_UNNEEDED_S):
                node.gone = True
                self.live_node_count -= 1

    def advance(self, now: float) -> None:
        """Pods become ready, drained pods go, pending pods get nodes."""
        became_ready = False
        for slot in list(self.starting_slots()):
            pod = self.pods[slot]
            if pod.ready_at is not None and pod.ready_at <= now + 1e-9:
                pod.phase = "ready"
                self.not_ready.discard(slot)
                if pod.placeholder:
                    continue
                self.ready_slots.append(slot)
                self.serving_slots.add(slot)
                became_ready = True
                if pod.created_at < pod.ready_at:
                    boot = (pod.scheduled_at or pod.created_at) - pod.created_at
                    self.observations.append(engine_types.ColdStartObservation(
                        created_at=pod.created_at, ready_at=pod.ready_at, node_boot_s=boot))
        for slot in list(self.serving_slots):
            pod = self.pods[slot]
            if pod.phase != "draining":
                continue
            if not self.queues[slot] and not self.running[slot]:
                self._release(pod, now=now)
            elif pod.removed_at is not None and now - pod.removed_at >= self.grace_s - 1e-9:
                self._cut(slot)
                self._release(pod, now=now)
        self._autoscale_nodes(now=now)
        if became_ready and self.gateway and self.dispatch == "push":
            held = list(self.gateway)
            self.gateway.clear()
            for request in held:
                self._route(request)

    def _cut(self, slot: int) -> None:
        """Kill a draining replica: the requests running and queued at it are lost (with
        queue dispatch nothing is queued at a replica: only its running ones)."""
        held = self.active[self.replica[self.active] == slot]
        queued = np.fromiter(self.queues[slot], dtype=np.int64, count=len(self.queues[slot]))
        lost = np.concatenate((held, queued))
        self.interrupted[lost] = True
        self.interrupted_count += int(lost.size)
        self.active = self.active[self.replica[self.active] != slot]
        self.queues[slot].clear()
        self.running[slot] = self.load[slot] = 0
        self.kv_used[slot] = self.prefill_backlog[slot] = 0.0

    @property
    def drained(self) -> bool:
        """Every accepted request (warm-up included) has finished or was cut."""
        return self.completed + self.interrupted_count == self.accepted

    def starting_slots(self) -> list[int]:
        return sorted(s for s in self.live_slots if self.pods[s].phase == "starting")

    def replicas(self) -> list[Pod]:
        """Real (not placeholder) pods that count towards spec.replicas."""
        pods = (self.pods[s] for s in sorted(self.live_slots))
        return [p for p in pods if not p.placeholder and p.phase in ("pending", "starting",
                                                                     "ready")]

    def removal_order(self, *, now: float) -> list[Pod]:
        """The replicas in the order a ReplicaSet removes them (`spare.removal_rank`):
        unscheduled (pending, or bound to a node still booting) first, then not ready,
        then the lowest deletion cost, then the latest ready. A pod's phase is Running
        once scheduled (its start is mostly the model's load, after the container runs)."""

        def rank(pod: Pod) -> engine_spare.RemovalRank:
            scheduled = pod.scheduled_at is not None and pod.scheduled_at <= now + 1e-9
            return engine_spare.removal_rank(
                scheduled=scheduled, phase="Running" if scheduled else "Pending",
                ready=pod.phase == "ready", cost=pod.deletion_cost, ready_at=pod.ready_at,
                restarts=0, created_at=pod.created_at)

        return sorted(self.replicas(), key=rank)

    def scale_to(self, desired: int, *, now: float) -> None:
        """Set spec.replicas: create pods, or remove them as a ReplicaSet would.

        Removal order follows the ReplicaSet controller (`removal_order`). A removed ready
        pod drains: it takes no new requests and goes (releasing its GPUs) when its queue
        and batch are empty, or is killed `grace_s` after its removal, cutting what it
        still holds.
        """
        desired = max(0, desired)
        if desired != self.spec_replicas:
            self.scale_events += 1
        self.spec_replicas = desired
        self.max_spec = max(self.max_spec, desired)
        pods = self.replicas()
        if len(pods) < desired:
            for _ in range(desired - len(pods)):
                pod = self._new_pod(now=now)
                if not self._place_preempting(pod, now=now):
                    self._autoscale_nodes(now=now)
        elif len(pods) > desired:
            for pod in self.removal_order(now=now)[: len(pods) - desired]:
                if pod.phase == "ready":
                    pod.phase = "draining"
                    pod.removed_at = now
                    self.ready_slots.remove(pod.slot)
                    if self.grace_s <= 0:
                        self._cut(pod.slot)
                    if not self.queues[pod.slot] and not self.running[pod.slot]:
                        self._release(pod, now=now)
                else:
                    self._release(pod, now=now)

    def _place_preempting(self, pod: Pod, *, now: float) -> bool:
        """Place a real pod; if no room, preempt a placeholder (lower priority) first."""
        if self._place(pod, now=now):
            return True
        for holder in (self.pods[s] for s in sorted(self.live_slots)):
            if holder.placeholder and holder.phase in ("starting", "ready"):
                self._release(holder, now=now)
                return self._place(pod, now=now)
        return False

    def set_placeholders(self, count: int, *, now: float) -> None:
        """Keep `count` placeholder pods, each holding a whole node (warm headroom)."""
        holders = [self.pods[s] for s in sorted(self.live_slots) if self.pods[s].placeholder]
        for _ in range(count - len(holders)):
            pod = self._new_pod(now=now, placeholder=True)
            if not self._place(pod, now=now):
                self._autoscale_nodes(now=now)
        for pod in sorted(holders, key=lambda p: -p.created_at)[: max(0, len(holders) - count)]:
            self._release(pod, now=now)

    def free_replica_slots(self, *, now: float) -> int:
        """Replicas that fit now on ready nodes: free GPUs plus GPUs held by placeholders
        (a real pod preempts a placeholder at once, so those GPUs are free to it)."""
        held: dict[int, int] = {}
        for slot in self.live_slots:
            pod = self.pods[slot]
            if pod.placeholder and pod.node is not None:
                held[pod.node] = held.get(pod.node, 0) + pod.gpus
        return sum((n.gpus - n.used + held.get(n.node_id, 0)) // self.gpus_per_replica
                   for n in self.nodes if not n.gone and n.ready_at <= now)

    # ----- requests --------------------------------------------------------------------

    def _route(self, request: int) -> None:
        """Send a request to the least-loaded ready replica (queued + running), or hold it;
        with queue dispatch, put it at the end of the shared queue."""
        if self.dispatch == "queue" or not self.ready_slots:
            self.gateway.append(request)
            return
        load = self.load
        slot = min(self.ready_slots, key=load.__getitem__)
        self.queues[slot].append(request)
        load[slot] += 1

    def _admit(self) -> None:
        """Continuous batching: each replica schedules from its queue while batch and KV fit.

        As in vLLM's scheduler, a request leaves the waiting queue only when its prefill
        is scheduled: a replica takes new prompts while its backlog of admitted prompt
        tokens is below one step of prefill (25,000 tok/s x 0.1 s = 2,500 tokens for the
        8B profile). So `waiting` is what vLLM reports as num_requests_waiting, and a
        burst of 700 long prompts shows up as a queue, not as 700 running requests.
        With queue dispatch the replicas take from the shared queue instead (`_pull`), by
        the same rule (a batch slot, KV room, prefill backlog below one step). The rule is
        spelled out in both loops, not in a shared helper, because they run every step for
        every replica: a helper call per check (tried 2026-12-02) made the cluster's
        stepping 8 to 17 % slower under push and 3 to 6 % under queue (min of 8
        interleaved runs, Azure conv x9, 300 s, 5 and 16 replicas), past the 3 % such a
        refactor may cost.
        """
        profile = self.profile
        cap = float(profile.kv_cache_tokens)
        step_prefill = profile.prefill_tokens_per_second * self.dt
        admitted: list[int] = []
        need = self.kv_need
        prompt = self.input_tokens
        if self.dispatch == "queue":
            admitted = self._pull(cap=cap, step_prefill=step_prefill)
        else:
            for slot in self.serving_slots:
                queue = self.queues[slot]
                if not queue:
                    continue
                running = self.running[slot]
                used = self.kv_used[slot]
                backlog = self.prefill_backlog[slot]
                while queue and running < profile.max_batch and backlog < step_prefill:
                    request = queue[0]
                    if used + need[request] > cap + 1e-6:
                        break
                    queue.popleft()
                    running += 1
                    used += need[request]
                    backlog += prompt[request]
                    self.replica[request] = slot
                    admitted.append(request)
                self.running[slot] = running
                self.kv_used[slot] = used
                self.prefill_backlog[slot] = backlog
        if admitted:
            self.active = np.concatenate((self.active, np.asarray(admitted, dtype=np.int64)))

    def _pull(self, *, cap: float, step_prefill: float) -> list[int]:
        """Queue dispatch: while the shared queue's head fits a ready replica now (a batch
        slot, KV room for its prompt and answer, a prefill backlog below one step: the
        rule `_admit` applies to a replica's own queue, inlined in both for speed, see
        there), that replica takes it; FIFO, so a head that fits nowhere waits and so
        does everything behind it. A draining replica is not ready: it takes nothing.

        Of the replicas it fits, the one running fewest takes it (ties: the first ready),
        so equal replicas share the queue as least-outstanding routing shares arrivals.
        Example (8B profile, one step of prefill 2,500 tokens): replicas running 40 and 10
        -> the one running 10; if that one still has 2,600 prompt tokens to prefill, the
        one running 40; both running 256 (max_batch) -> the head waits for a finish.
        """
        queue = self.gateway
        takers = self.ready_slots
        if not queue or not takers:
            return []
        max_batch = self.profile.max_batch
        running, used, backlog, load = self.running, self.kv_used, self.prefill_backlog, self.load
        admitted: list[int] = []
        while queue:
            request = queue[0]
            room = cap + 1e-6 - float(self.kv_need[request])
            best, fewest = -1, max_batch
            for slot in takers:
                if running[slot] < fewest and backlog[slot] < step_prefill and (
                        used[slot] <= room):
                    best, fewest = slot, running[slot]
            if best < 0:
                break
            queue.popleft()
            running[best] += 1
            load[best] += 1
            used[best] += float(self.kv_need[request])
            backlog[best] += float(self.input_tokens[request])
            self.replica[request] = best
            admitted.append(request)
        return admitted

    def _serve(self, now: float) -> tuple[float, float]:
        """Advance every replica's batch by one step of dt; return tokens and busy replicas.

        Fluid continuous batching (chunked prefill, as vLLM's default scheduler): each
        iteration decodes one token for each of the B decoding requests and prefills a
        chunk of C = max_batched_tokens - B prompt tokens, FIFO across the replica's
        admitted requests. An iteration takes T1 = a + b*B + C/prefill_rate while prompt
        tokens are pending and T0 = a + b*B once they are done. 8B profile, B = 100
        decoding and 20,000 prompt tokens pending: C = 8,092, T1 = 8 + 10 + 324 ms, so
        20,000/8,092 = 2.5 iterations (0.84 s) finish the prompts and the decoders get
        2.5 tokens meanwhile. A request's first token comes when its own prompt is done;
        from then it decodes in the remaining iterations of the step.
        """
        ids = self.active
        dt = self.dt
        if ids.size == 0:
            return 0.0, 0.0
        profile = self.profile
        a = profile.decode_step.base_seconds
        b = profile.decode_step.per_sequence_seconds
        slots = len(self.pods)
        rep = self.replica[ids]
        prefill = self.prefill_left[ids]
        pre = prefill > 0
        dec = ~pre
        batch = np.bincount(rep[dec], minlength=slots).astype(np.float64)
        pending = np.bincount(rep[pre], weights=prefill[pre], minlength=slots)
        chunk = np.maximum(profile.max_batched_tokens - batch, 1.0)
        t_mixed_iter = a + b * batch + chunk / profile.prefill_tokens_per_second
        t_mixed = np.minimum(pending / chunk * t_mixed_iter, dt)
        n_mixed = t_mixed / t_mixed_iter
        prefilled = n_mixed * chunk

        # Prompts in FIFO order within each replica: cumulative tokens up to each request.
        pidx = np.flatnonzero(pre)
        finished = np.zeros(0, dtype=bool)
        if pidx.size:
            prep = rep[pidx]
            order = np.argsort(prep, kind="stable")
            pidx = pidx[order]
            prep = prep[order]
            tokens = prefill[pidx]
            cum = np.cumsum(tokens)
            first = np.empty(pidx.size, dtype=bool)
            first[0] = True
            np.not_equal(prep[1:], prep[:-1], out=first[1:])
            base = (cum - tokens)[first]
            cum_in = cum - base[np.cumsum(first) - 1]
            finished = cum_in <= prefilled[prep] * (1 + 1e-12) + 1e-6
            joined = np.bincount(prep[finished], minlength=slots)
        else:
            joined = np.zeros(slots, dtype=np.int64)
        batch_after = batch + joined
        t_decode_iter = a + b * np.maximum(batch_after, 1.0)
        n_rest = np.where(batch_after > 0, (dt - t_mixed) / t_decode_iter, 0.0)
        n_total = n_mixed + n_rest

        def time_of(iteration: FloatArray, where: IntArray) -> FloatArray:
            """Time within the step at which `iteration` (fractional) ends on replica `where`."""
            nm = n_mixed[where]
            return np.where(iteration <= nm, iteration * t_mixed_iter[where],
                            t_mixed[where] + (iteration - nm) * t_decode_iter[where])

        done_mask = np.zeros(ids.size, dtype=bool)
        generated = 0.0
        # Requests that were decoding for the whole step.
        didx = np.flatnonzero(dec)
        if didx.size:
            drep = rep[didx]
            left = self.decode_left[ids[didx]]
            steps = n_total[drep]
            fin = left <= steps + 1e-9
            made = np.minimum(left, steps)
            generated += float(made.sum())
            self._count_tokens(drep, made)
            self.decode_left[ids[didx]] = np.where(fin, 0.0, left - steps)
            if fin.any():
                done_ids = ids[didx[fin]]
                self.done[done_ids] = now + time_of(left[fin], drep[fin])
                done_mask[didx[fin]] = True
        if pidx.size:
            # Requests still in prefill: progress in FIFO order.
            nf = ~finished
            if nf.any():
                got = np.clip(prefilled[prep[nf]] - (cum_in[nf] - tokens[nf]), 0.0, tokens[nf])
                self.prefill_left[ids[pidx[nf]]] = tokens[nf] - got
            if finished.any():
                frep = prep[finished]
                fids = ids[pidx[finished]]
                start = cum_in[finished] / chunk[frep]
                first_at = now + time_of(start, frep)
                self.first_token[fids] = first_at
                self.prefill_left[fids] = 0.0
                left = self.decode_left[fids]
                steps = np.maximum(n_total[frep] - start, 0.0)
                fin = left <= steps + 1e-9
                made = 1.0 + np.minimum(left, steps)
                generated += float(made.sum())
                self._count_tokens(frep, made)
                self._step_first = fids
                self.decode_left[fids] = np.where(fin, 0.0, left - steps)
                if fin.any():
                    self.done[fids[fin]] = now + time_of(start[fin] + left[fin], frep[fin])
                    done_mask[pidx[finished][fin]] = True
        left = pending - prefilled
        done_prompt = np.minimum(pending, prefilled)
        self.prompt_tokens_by_slot[: done_prompt.size] += done_prompt
        for slot in np.flatnonzero(pending).tolist():
            self.prefill_backlog[slot] = max(0.0, float(left[slot]))
        # GPU busy fraction per replica: 1 while anything decodes, else the prefill time.
        busy = np.where(batch_after > 0, 1.0, t_mixed / dt)
        ready = self.ready_slots
        busy_ready = float(busy[ready].sum()) if ready else 0.0
        if 0.0 <= now < self.trace.duration_s:
            # Useful GPU time (the SM-active part, DESIGN 1): the time this step's work
            # would take at full efficiency, i.e. prompt tokens at the prefill rate and
            # generated tokens at the per-token cost of a full batch, a/max_batch + b.
            # A replica decoding one request is ~100 % "utilised" to DCGM but ~2 %
            # useful here: (8/256 + 0.1) / (8 + 0.1) ms for the 8B profile.
            prompt_done = float(done_prompt.sum())
            per_token = a / profile.max_batch + b
            useful = prompt_done / profile.prefill_tokens_per_second + generated * per_token
            self.useful_gpu_s += min(useful, float(busy.sum()) * dt) * self.gpus_per_replica
        if done_mask.any():
            done_ids = ids[done_mask]
            self._step_done = done_ids
            drep = rep[done_mask]
            counts = np.bincount(drep, minlength=slots)
            freed = np.bincount(drep, weights=self.kv_need[done_ids], minlength=slots)
            for slot in np.flatnonzero(counts).tolist():
                count = int(counts[slot])
                self.running[slot] -= count
                self.load[slot] -= count
                self.kv_used[slot] = max(0.0, self.kv_used[slot] - float(freed[slot]))
            self.completed += int(done_ids.size)
            self.active = ids[~done_mask]
        return generated, busy_ready

    def _count_tokens(self, slots: IntArray, tokens: FloatArray) -> None:
        counts = np.bincount(slots, weights=tokens)
        self.tokens_by_slot[: counts.size] += counts

    def run_step(self, now: float) -> None:
        """Route arrivals up to `now`, admit, serve [now, now + dt), record the step."""
        end = int(np.searchsorted(self.arrival, now, side="right"))
        start = self.next_arrival
        arrivals: range | list[int] = range(start, end)
        if self.accepted < self.arrival.size and end > start:
            arrivals = (np.flatnonzero(~self.rejected[start:end]) + start).tolist()
        for request in arrivals:
            self._route(request)
        routed = len(arrivals)
        self.next_arrival = end
        self._admit()
        generated, busy_ready = self._serve(now)
        self._record(arrivals=routed, generated=generated, busy_ready=busy_ready)

    def _record(self, *, arrivals: int, generated: float, busy_ready: float) -> None:
        h = self.history
        i = self.step
        queued = sum(len(self.queues[s]) for s in self.serving_slots) + len(self.gateway)
        h.waiting[i] = queued
        h.running[i] = int(self.active.size)
        h.ready[i] = len(self.ready_slots)
        h.starting[i] = len(self.not_ready)
        h.nodes[i] = self.live_node_count
        h.spec[i] = self.spec_replicas
        h.tokens[i] = generated
        h.busy_ready[i] = busy_ready
        h.arrivals[i] = arrivals
        self.first_ids_by_step.append(self._step_first)
        self.done_ids_by_step.append(self._step_done)
        self._step_first = self._step_done = np.zeros(0, dtype=np.int64)
        self.step += 1

    # ----- what observers see ----------------------------------------------------------

    def time_of_step(self, step: int) -> float:
        return self.t0 + step * self.dt

    def _step_at(self, t: float) -> int:
        return int(round((t - self.t0) / self.dt, 6))

    def index(self, t: float) -> int:
        """The step index covering time t, clipped to recorded steps."""
        return min(max(self._step_at(t), 0), max(self.step - 1, 0))

    def window(self, series: npt.NDArray[np.generic], *, start: float, end: float
               ) -> npt.NDArray[np.generic]:
        lo = min(max(self._step_at(start), 0), self.step)
        hi = min(max(self._step_at(end), lo + 1), self.step)
        return series[lo:hi]

    def mean(self, series: npt.NDArray[np.generic], *, start: float, end: float) -> float:
        """Mean of a per-step series over [start, end); 0.0 before anything was recorded."""
        values = self.window(series, start=start, end=end)
        return float(values.mean()) if values.size else 0.0

    def gpu_seconds(self, *, until: float) -> float:
        """Allocated GPU-seconds: each pod from creation (or t=0) until gone (or `until`).

        A pod waiting for its node counts: the booting node is billed from its boot.
        """
        total = 0.0
        for pod in self.pods:
            end = pod.gone_at if pod.gone_at is not None else until
            total += max(0.0, min(end, until) - max(pod.created_at, 0.0)) * pod.gpus
        return total


def _grown(values: FloatArray, size: int) -> FloatArray:
    """A copy of `values` zero-padded to `size` (per-slot counters grow with the pods)."""
    out = np.zeros(size)
    out[: values.size] = values
    return out
