"""The reactor: evaluate a model as soon as a sample for it arrives, coalesced, plus a backstop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Protocol

from scaler.actuators import base as actuators
from scaler.core import vocabulary
from scaler.engine import decide as engine
from scaler.engine import nodes, types
from scaler.policy import fleet as policy_fleet
from scaler.policy import model
from scaler.service import arbiter as fleet_arbiter
from scaler.service import audit as audit_log
from scaler.service import explain
from scaler.service import learned as service_learned
from scaler.service import state as service_state
from scaler.service import variants as service_variants
from scaler.signals import messages

log = logging.getLogger(__name__)

# Outcomes after which the engine's new state is kept. After CONFLICT or FAILED the old
# state stays and the model is decided again, as decide.py asks of its caller.
_KEEP_STATE = frozenset({
    actuators.Outcome.APPLIED, actuators.Outcome.UNCHANGED, actuators.Outcome.DRY_RUN,
    actuators.Outcome.NOT_LEADER, actuators.Outcome.SKIPPED_HPA_OWNED,
})

# Asks that change within this window are arbitrated together: a capped scale-up waits
# at most 0.1 s more than a decision alone.
FLEET_COALESCE_S = 0.1
# Arbitrating 1,000 models takes 14 to 31 ms of CPU, 10,000 0.24 to 0.58 s
# (docs/scaling.md): after each run the fleet rests 4x as long as the run took, so
# arbitration never takes more than a fifth of the core, however fast asks change.
FLEET_MAX_CPU_SHARE = 0.2

# A model's engine state before its first decision: frozen, so one serves every model (an
# EngineState of 21 fields built per evaluation and thrown away when the model has one).
_FIRST_STATE = types.EngineState()


class SnapshotSource(Protocol):
    """The part of the signal store the reactor reads."""

    def snapshot(
        self, model: str, *, now: float, stale_after_s: float,
        latency_metric: vocabulary.LatencyMetric = vocabulary.DEFAULT_LATENCY_METRIC,
        shared_sources: Collection[str] = (),
    ) -> types.SignalSnapshot: ...


Work = Callable[[str], Awaitable[None]]


class Coalescer:
    """Per key, at most one run of `work` in flight and at most one more queued behind it.

    `poke(key)` starts a run after `delay_s` (0 = the next loop iteration, so pokes
    already queued on the loop join it) or, if one is running, asks for exactly one more
    when it ends. So 500 pokes in a burst give one or two runs, never 500.
    """

    def __init__(self, work: Work, *, delay_s: float, task_prefix: str) -> None:
        self._work = work
        self._delay_s = delay_s
        self._prefix = task_prefix
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self.accepting = True

    def poke(self, key: str) -> None:
        if not self.accepting:
            return
        if key in self._running:
            self._again.add(key)
            return
        loop = asyncio.get_running_loop()
        self._running[key] = loop.create_task(self._run(key), name=f"{self._prefix}:{key}")

    async def _run(self, key: str) -> None:
        try:
            await asyncio.sleep(self._delay_s)
            while True:
                self._again.discard(key)
                await self._work(key)
                if key not in self._again or not self.accepting:
                    break
        except Exception:  # one key's failure must not stop the others
            log.exception("%s %s failed", self._prefix, key)
        finally:
            self._running.pop(key, None)

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        return set(self._running.values())

    def stop_accepting(self) -> None:
        self.accepting = False
        self._again.clear()


class Reactor:
    """Per model: at most one evaluation running, and at most one more queued behind it.

    `notify(key)` (the signal store's listener) marks a model dirty. If no evaluation of
    it runs, one starts on the next loop iteration (after `coalesce_s`); if one runs, the
    model is re-evaluated once when it ends. So a burst of 500 samples for a model gives
    one or two evaluations, never 500, and different models proceed in parallel up to
    `max_concurrent` (each evaluation waits on the API server for a read and a patch).
    The backstop tick marks every model dirty every `backstop_s` for effects of time
    alone (windows expire, signals go stale).
    """

    def __init__(
        self,
        *,
        state: service_state.ServiceState,
        store: SnapshotSource,
        reader: actuators.ClusterReader,
        actuator: actuators.ReplicaActuator,
        wall_clock: Callable[[], float],
        backstop_s: float,
        coalesce_s: float = 0.0,
        max_concurrent: int = 64,
        max_conflict_retries: int = 3,
        audit: audit_log.AuditLog | None = None,
        pool_actuators: Mapping[str, actuators.NodePoolActuator] | None = None,
    ) -> None:
        self.state = state
        self.store = store
        self.reader = reader
        self.actuator = actuator
        self.wall_clock = wall_clock
        self.backstop_s = backstop_s
        self.coalesce_s = coalesce_s
        self.max_conflict_retries = max_conflict_retries
        self.audit = audit
        self.evaluations = 0
        self._policies: dict[str, model.ScalePolicy] = {}
        self._engine: dict[str, types.EngineState] = {}
        # What an earlier instance learned, taken as each model is next evaluated (at start:
        # its first evaluation; on taking over in a queue group: onto its windows).
        self.resume: service_learned.Resume | None = None
        # Models whose down window starts again at their current count at their next
        # evaluation (`take_over_from_a_share`).
        self._reseed: set[str] = set()
        self._limit = asyncio.Semaphore(max_concurrent)
        self._models = Coalescer(self._evaluate_with_retries, delay_s=coalesce_s,
                                 task_prefix="evaluate")
        # Node pools: actuator per NodePool.actuator kind ('placeholder', 'clusterapi').
        self.pool_actuators = dict(pool_actuators or {})
        self._pools = Coalescer(self._plan, delay_s=coalesce_s, task_prefix="pool")
        # With several shards, the node pools this shard plans (its arbitration domains');
        # None: every pool its models name.
        self.planned_pools: frozenset[str] | None = None
        self._pool_applied: dict[str, tuple[types.NodePlan, float]] = {}
        # The fleet: one arbitration over every model's latest ask (scaler.service.arbiter).
        self.arbiter = fleet_arbiter.Arbiter()
        self._fleet = Coalescer(self._arbitrate, delay_s=FLEET_COALESCE_S,
                                task_prefix="fleet")

    # -- inputs -------------------------------------------------------------------------

    def set_policies(self, policies: Mapping[str, model.ScalePolicy], *,
                     fleet: policy_fleet.Fleet | None = None, remote: Collection[str] = (),
                     foreign: Mapping[str, model.ScalePolicy] | None = None) -> None:
        """Swap the policy set (and the GpuPools and GpuBudgets in force); models whose
        policy changed or appeared are evaluated. With several shards: `remote`, own
        models another shard arbitrates; `foreign`, other shards' models arbitrated here
        (`Arbiter.set_fleet`).

        Engine state survives a policy edit (the windows are still evidence); a removed
        model's state goes.
        """
        previous = self._policies
        self._policies = dict(policies)
        self.arbiter.set_fleet(fleet or policy_fleet.Fleet(), keys=self._policies,
                               remote=remote, foreign=foreign)
        if self.arbiter.active:
            self._fleet.poke("fleet")
        for key in list(self._engine):
            if key not in self._policies:
                del self._engine[key]
        for key, policy in self._policies.items():
            if previous.get(key) != policy:
                self.notify(key)

    def notify(self, key: str) -> None:
        """A sample for `key` arrived (or time passed): evaluate it soon. Never blocks."""
        if key in self._policies:
            self._models.poke(key)

    def notify_all(self) -> None:
        for key in list(self._policies):
            self.notify(key)

    def foreign_asked(self, policy: model.ScalePolicy) -> None:
        """Another shard's model arbitrated here asked anew (`service.relay`): arbitrate
        again, and plan its node pool again (when an actuator of its kind runs)."""
        self._fleet.poke("fleet")
        for pool_name in service_variants.planned_pools(policy,
                                                        actuators_by_kind=self.pool_actuators):
            if self._plans(pool_name):
                self._pools.poke(pool_name)

    def _plans(self, pool: str) -> bool:
        """Whether this shard plans the node pool (every pool, with one shard)."""
        return self.planned_pools is None or pool in self.planned_pools

    # -- evaluation ---------------------------------------------------------------------

    async def _evaluate_with_retries(self, key: str) -> None:
        for _ in range(1 + self.max_conflict_retries):
            async with self._limit:
                started = time.perf_counter()
                outcome = await self.evaluate(key)
                self.state.record_evaluation_seconds(time.perf_counter() - started)
            if outcome is not actuators.Outcome.CONFLICT or not self._models.accepting:
                return
            # The cluster changed under us: re-read and re-decide.

    async def evaluate(self, key: str) -> actuators.Outcome | None:
        """Read, decide, apply and record one model once; returns the apply outcome."""
        policy = self._policies.get(key)
        if policy is None:
            return None
        # A model with variants reads every variant's target and decides on their sum.
        targets = (service_variants.views(policy, pools=self.arbiter.fleet.pools)
                   if policy.spec.variants else ())
        reading = None
        try:
            if targets:
                reading = await service_variants.read(self.reader, policy, targets)
                cluster = reading.equivalent
            else:
                cluster = await self.reader.read(policy)
        except Exception as error:  # API down or slow: no decision without the cluster state
            log.warning("%s: cannot read the cluster: %s", key, error, extra={"model": key})
            self.state.record_patch(key, "read_failed")
            return actuators.Outcome.FAILED
        now = self.wall_clock()
        cluster = self.arbiter.capped(policy, cluster, now=now)
        spec = policy.spec
        engine_state = self._engine.get(key)
        if self.resume is not None and key in self.resume.records:
            engine_state = self._resumed(self.resume, policy, engine_state, now=now)
        elif engine_state is None:
            engine_state = _FIRST_STATE
        if key in self._reseed and engine_state.last_desired is not None:
            # Its windows were built from a share of the signals: the down window starts
            # at the current count, as after a restart (`decide.stabilize_count`).
            engine_state = dataclasses.replace(engine_state, last_desired=None)
        try:
            snapshot = self.store.snapshot(
                key, now=now, stale_after_s=spec.stale_after_seconds,
                latency_metric=spec.latency_metric,
                shared_sources=messages.shared_queue_keys(spec.sources.shared_queue_sources))
            decision, new_state = engine.decide(policy, snapshot=snapshot, cluster=cluster,
                                                state=engine_state, now=now)
        except Exception:  # a bug or an input the engine cannot take: hold, count, go on
            log.exception("%s: evaluation failed; keeping %d replicas", key, cluster.current,
                          extra={"model": key})
            self.state.record_evaluation_error(key)
            return actuators.Outcome.FAILED
        if reading is not None:
            decision, outcome, reason = await self._apply_mix(policy, decision,
                                                              reading=reading, targets=targets)
        elif decision.changed:
            applied = await self.actuator.apply(policy, decision)
            outcome = applied.outcome
            reason = applied.reason
        else:
            # Nothing to write: skip the actuator's reads of /scale and of HPA owners.
            outcome = actuators.Outcome.UNCHANGED
            reason = "already at desired replicas"
        if outcome in _KEEP_STATE and self._policies.get(key) is policy:
            self._engine[key] = new_state
            self._reseed.discard(key)  # its seeded window is kept (else seeded again)
        else:
            new_state = engine_state  # not applied: the model is decided from it again
        self.evaluations += 1
        observation = service_state.Observation(
            decision=decision, snapshot=snapshot, cluster=cluster, at=now,
            variants=() if reading is None else service_variants.observed(
                reading, mix=self.arbiter.mix(key), owners=self.arbiter.owners(key)),
            engine=new_state)
        self.state.record(key, observation, outcome=str(outcome), apply_reason=reason)
        if (self.arbiter.record(policy, decision, cluster, now=now) if reading is None else
                self.arbiter.record_variants(policy, decision, held=reading.held,
                                             excluded_gpus=reading.excluded_gpus,
                                             busy=reading.busy)):
            self._fleet.poke("fleet")
        self.state.record_patch(key, str(outcome))
        # Guarded: the summary and the extra fields are built before log.info can drop
        # them, for every changed decision (a third of 10,000 a cycle in the benchmark).
        if decision.changed and log.isEnabledFor(logging.INFO):
            log.info("%s: %s -> %s", key, decision.summary, outcome,
                     extra={"model": key, "desired": decision.desired,
                            "current": decision.current, "outcome": str(outcome),
                            "reason": reason})
        for pool_name in service_variants.planned_pools(policy,
                                                        actuators_by_kind=self.pool_actuators):
            if self._plans(pool_name):
                self._pools.poke(pool_name)
        if self.audit is not None:
            status = self.state.status(key)
            if status is not None:
                document = explain.decision_document(status, observation)
                document["apply"] = {"outcome": str(outcome), "reason": reason}
                self.audit.write(document)
        return outcome

    def _resumed(self, resume: service_learned.Resume, policy: model.ScalePolicy,
                 state: types.EngineState | None, *, now: float) -> types.EngineState:
        """The model's engine state with what the record in `resume` holds: a first state
        that starts from it, or (a record read on taking over) the model's windows with
        it. A record refused (logged and counted) leaves the state as it was."""
        resumed = resume.take(policy, now=now)
        if resumed is None:
            return _FIRST_STATE if state is None else state
        learned, written_at = resumed
        state = learned.state() if state is None else learned.onto(state)
        # Kept at once: a decision that is not applied must not lose it.
        self._engine[policy.key] = state
        self.state.record_resumed(policy.key, written_at)
        return state

    def take_over_from_a_share(self) -> None:
        """This instance leads now, having received only a share of the signals (a NATS
        queue group): its windows hold recommendations from partial data, lower than the
        leader's, so each model's down window starts again at its current count, as after
        a restart: taking over never scales down before a full window of its own."""
        self._reseed = set(self._engine)
        self.notify_all()

    def learned(self) -> dict[str, types.Learned]:
        """What the engine has learned of every model it evaluated (for `learned.payload`)."""
        return {key: types.Learned.of(state) for key, state in self._engine.items()}

    async def _apply_mix(self, policy: model.ScalePolicy, decision: types.Decision, *,
                         reading: service_variants.Reading,
                         targets: tuple[model.ScalePolicy, ...]
                         ) -> tuple[types.Decision, actuators.Outcome, str]:
        """A model with variants: the last arbitration's mix written to every variant's
        target, and the decision with the mix in words among its notes. A half-applied
        mix is logged and counted (patches{outcome="partial"}) and decided again."""
        key = policy.key
        mix = self.arbiter.mix(key)
        note = self.arbiter.describe_mix(policy)
        if (mix is None or note is None
                or set(mix.replicas) != {v.name for v in policy.spec.variants}):
            return (decision, actuators.Outcome.UNCHANGED,
                    "awaiting the fleet's first mix of the variants")
        decision = dataclasses.replace(decision, notes=(*decision.notes, note))
        owners = self.arbiter.owners(key)
        items = service_variants.parts(reading, targets, mix=mix, decision=decision, note=note,
                                       owners=owners)
        now = self.wall_clock()  # owners are re-checked once per OWNER_RECHECK_S
        if not service_variants.pending(items, owners=owners, now=now,
                                        checked_at=self.arbiter.owners_checked_at(key)):
            return decision, actuators.Outcome.UNCHANGED, "every variant already at the mix"
        outcomes = await service_variants.apply(self.actuator, items)
        if self.arbiter.record_owners(key, service_variants.owners_after(
                policy, outcomes, before=owners), checked_at=now if
                service_variants.every_owner_checked(policy, outcomes) else None):
            self._fleet.poke("fleet")  # an HPA's variant is mixed at what it holds
        applied = service_variants.combined(outcomes)
        if applied.partial:
            log.warning("%s: %s", key, applied.reason, extra={"model": key})
            self.state.record_patch(key, "partial")
        return decision, applied.outcome, applied.reason

    # -- node pools ---------------------------------------------------------------------

    async def _plan(self, name: str) -> None:
        await self.plan_pool(name)

    async def plan_pool(self, name: str) -> actuators.Outcome | None:
        """Bin-pack the latest decisions of the pool's models and apply the node plan.

        The pool's settings come from the first of its policies by key (policies naming
        the same pool should agree). An unchanged plan is re-applied at most once per
        backstop interval: often enough to repair drift (a deleted placeholder
        Deployment), rarely enough not to read the API on every sample.
        """
        # Each model's demand, a model with variants by each variant on this pool, and
        # those of other shards' models this shard arbitrates (their latest asks).
        members = service_variants.pool_members(self.state.statuses(), name,
                                                pools=self.arbiter.fleet.pools)
        named, foreign = self.arbiter.foreign_demands(name)
        if foreign and named is not None and named.spec.node_pool is not None:
            if members is None:
                members = service_variants.PoolMembers(
                    pool=named.spec.node_pool,
                    resource_name=named.spec.resources.resource_name, demands=())
            members = dataclasses.replace(members, demands=tuple(sorted(
                [*members.demands, *foreign], key=lambda demand: demand.model)))
        if members is None:
            return None
        pool = members.pool
        actuator = self.pool_actuators.get(pool.actuator)
        if actuator is None:
            return None
        plan = nodes.plan_pool(pool, resource_name=members.resource_name,
                               demands=members.demands)
        loop_now = asyncio.get_running_loop().time()
        applied = self._pool_applied.get(name)
        if applied is not None and applied[0] == plan and loop_now - applied[1] < self.backstop_s:
            return actuators.Outcome.UNCHANGED
        result = await actuator.apply(pool, plan)
        if result.outcome in _KEEP_STATE:
            self._pool_applied[name] = (plan, loop_now)
        else:
            self._pool_applied.pop(name, None)
        self.state.record_pool(plan, outcome=str(result.outcome), reason=result.reason,
                               at=self.wall_clock())
        if result.outcome is actuators.Outcome.APPLIED:
            log.info("node pool %s: %d nodes wanted (%d headroom)", name, plan.nodes_wanted,
                     plan.headroom_nodes, extra={"pool": name, "reasons": list(plan.reasons)})
        return result.outcome

    async def _arbitrate(self, _: str) -> None:
        """Arbitrate the fleet and evaluate again each model whose cap moved: a borrower
        cut for an owner that asked, an owner given its guarantee back."""
        started = time.perf_counter()
        moved = self.arbiter.arbitrate()
        spent = time.perf_counter() - started
        for key in moved:
            self.notify(key)
        await asyncio.sleep(spent * (1.0 / FLEET_MAX_CPU_SHARE - 1.0))

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self) -> None:
        """The backstop tick, until cancelled (event-driven work runs from `notify`).

        Each model is ticked once per `backstop_s`, at its own phase: with 1,000 models
        and 5 s, one model every 5 ms rather than 1,000 at once, so a tick never queues
        a burst of 1,000 API reads in front of a model whose demand just changed.
        """
        while True:
            keys = list(self._policies)
            if not keys:
                await asyncio.sleep(self.backstop_s)
                continue
            pause = self.backstop_s / len(keys)
            for key in keys:
                await asyncio.sleep(pause)
                self.notify(key)

    @property
    def busy(self) -> int:
        """Evaluations running or scheduled now."""
        return len(self._models.tasks) + len(self._pools.tasks) + len(self._fleet.tasks)

    async def drain(self, *, timeout_s: float) -> bool:
        """Stop taking new work and let running evaluations (and their patches) finish.

        True when all finished in time; the rest are cancelled.
        """
        self._models.stop_accepting()
        self._pools.stop_accepting()
        self._fleet.stop_accepting()
        pending = self._models.tasks | self._pools.tasks | self._fleet.tasks
        if not pending:
            return True
        done, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)
            log.warning("%d evaluations did not finish within %.1f s", len(late), timeout_s)
        return not late

    async def idle(self) -> None:
        """Until no evaluation runs or is scheduled (tests and benchmarks use it)."""
        while pending := self._models.tasks | self._pools.tasks | self._fleet.tasks:
            await asyncio.wait(pending)
