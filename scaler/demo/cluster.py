"""The demo's simulated GPU cluster behind the service's ClusterBackend, and its pods' reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scaler.actuators import base as actuators
from scaler.core import vocabulary
from scaler.engine import types as engine_types
from scaler.policy import model as policy_model
from scaler.service import explain, runner
from scaler.signals import messages, nats_core
from scaler.signals import samples as signal_samples
from scaler.sim import cluster as sim_cluster
from scaler.sim import feed as sim_feed
from scaler.sim import profiles, run, traces

# Replicas report once per virtual second, as the simulator's own scaler strategy assumes
# (vLLM pods exporting through NATS at about that cadence).
REPORT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class ScaleChange:
    """A change of spec.replicas the service made, at simulated time `at_s` (trace seconds)."""

    at_s: float
    previous: int
    desired: int
    winner: str | None
    summary: str  # the engine's one line (Decision.summary), as Events and logs show it
    words: str  # the same decision as a person says it (explain.in_words)
    ready: int = 0  # ready and starting replicas just after the change
    starting: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    """One message a simulated replica (or the gateway) publishes: subject and JSON body."""

    subject: str
    body: bytes


def subject_of(policy: policy_model.ScalePolicy, *, prefix: str) -> str | None:
    """The NATS subject the service listens to for this model, or None without a NATS source."""
    source = policy.spec.sources.nats
    if source is None:
        return None
    return source.subject or nats_core.default_subject(prefix, policy.metadata.namespace,
                                                       policy.metadata.name)


class SimulatedModel:
    """One model's replicas on the simulator's cluster model, stepped to a virtual clock.

    Time is the trace's: 0 is the first request, `epoch(t)` the matching epoch seconds
    (Azure's clock, so warm-floor schedules see the trace's hour). The trace's first
    `warmup_s` are sent before t=0 on the initial replicas (at their times played
    backwards), as `scaler simulate` does (`traces.warmup`), so the service meets a
    cluster in steady state rather than an empty one.
    """

    def __init__(
        self,
        *,
        policy: policy_model.ScalePolicy,
        profile: profiles.ReplicaProfile,
        trace: traces.Trace,
        initial_replicas: int,
        subject: str,
        dt: float = 0.1,
        warmup_s: float = run.WARMUP_S,
    ) -> None:
        self.policy = policy
        self.profile = profile
        self.trace = trace
        self.subject = subject
        self.initial_replicas = initial_replicas
        self.pool = run.pool_for(policy, profile)
        # No longer than the slice (a 60 s slice: 60 s of warm-up).
        self.warmup_s = min(warmup_s, trace.duration_s)
        self.cluster = sim_cluster.SimCluster(
            trace=trace, profile=profile, pool=self.pool, initial_replicas=initial_replicas,
            dt=dt, gpus_per_replica=policy.spec.resources.gpus_per_replica,
            warmup_s=self.warmup_s)
        # What each simulated vLLM pod measures (queue, batch, tokens/s, a latency
        # histogram): the simulator's feed, read here only for its samples, which become
        # NATS messages. It never decides: the real service does, over NATS.
        self.feed = sim_feed.SignalFeed(
            model_key=policy.key, start_epoch_s=trace.start_s,
            latency_metric=policy.spec.latency_metric, interval_s=REPORT_INTERVAL_S)
        self.changes: list[ScaleChange] = []
        self.reports = 0
        # Pods report during the last 10 s of the warm-up too (unpublished), so the first
        # published tokens/s covers a full rate window, as a pod that has been serving for
        # a while reports: from t=0 alone the first rates would span 1 s, 2 s, ... and
        # their noise would look like a trend to the forecast.
        self._next_report = -self.feed.rate_window_s
        self.advance_to(-self.cluster.dt)  # the warm-up, before the service starts

    @property
    def key(self) -> str:
        return self.policy.key

    @property
    def now(self) -> float:
        """Trace time of the next step to run: what the cluster has simulated up to."""
        return self.cluster.time_of_step(self.cluster.step)

    @property
    def finished(self) -> bool:
        """The cluster's preallocated horizon (trace + drain tail) is used up."""
        return self.cluster.step >= self.cluster.steps

    def epoch(self, t: float) -> float:
        return self.trace.start_s + t

    def advance_to(self, t: float, *, max_steps: int | None = None) -> list[Report]:
        """Run steps up to trace time `t` (at most `max_steps`); the reports due meanwhile.

        A step at time s routes the arrivals up to s and serves [s, s + dt); it runs once
        the clock has reached s. Reports are published from t=0 (none during the warm-up).
        """
        cluster = self.cluster
        out: list[Report] = []
        steps = 0
        while self.now <= t + 1e-9 and not self.finished:
            if max_steps is not None and steps >= max_steps:
                break
            now = self.now
            cluster.advance(now)
            if now >= self._next_report - 1e-9:
                reports = self.report(now)
                if now >= -1e-9:
                    out.extend(reports)
                    self.reports += len(reports)
                self._next_report = now + REPORT_INTERVAL_S
            cluster.run_step(now)
            steps += 1
        return out

    def report(self, now: float) -> list[Report]:
        """What every serving replica publishes now, plus the gateway when it matters.

        The samples come from the simulator's feed (queue, running batch, generated
        tokens/s over 10 s, a vLLM-bucket TTFT histogram over 30 s); here they become the
        DESIGN 4.2 messages a real model server would send, one per replica. The gateway
        speaks only while no replica is ready or requests are held at it: its queue is
        then the only sign of demand, which is how a model is activated from zero.
        """
        by_source: dict[str, list[signal_samples.Sample]] = {}
        for sample in self.feed.measure(self.cluster, now=now):
            by_source.setdefault(sample.source, []).append(sample)
        gateway = by_source.pop(sim_feed.GATEWAY_SOURCE, [])
        out = [self._message(source, group) for source, group in sorted(by_source.items())]
        held = next((s.value for s in gateway if s.signal is vocabulary.Signal.QUEUE_DEPTH),
                    None)
        if gateway and (not self.cluster.ready_slots or (held or 0.0) > 0):
            out.append(self._message(sim_feed.GATEWAY_SOURCE, gateway))
        return out

    def _message(self, source: str, samples: Sequence[signal_samples.Sample]) -> Report:
        """One DESIGN 4.2 body for one source's samples, written by the contract's encoder."""
        policy = self.policy
        if source.startswith("pod-"):
            # Pod names as a Deployment's would read: llama-8b-<slot>.
            source = f"{policy.spec.target.name}-{source.removeprefix('pod-')}"
        values: dict[vocabulary.Signal, float] = {
            s.signal: round(s.value, 3) for s in samples
            if s.signal in vocabulary.MESSAGE_SIGNALS and s.value is not None}
        latency = next((s for s in samples if s.histogram is not None), None)
        histogram = None if latency is None else latency.histogram
        p95 = None if histogram is None else histogram.quantile(0.95)
        body = messages.encode(
            model=policy.metadata.name, namespace=policy.metadata.namespace, source=source,
            ts=round(max(s.ts for s in samples), 3), values=values,
            latency_metric=None if latency is None else latency.metric,
            p95_seconds=None if p95 is None else round(p95, 4), latency_histogram=histogram)
        return Report(self.subject, body)

    def drain(self) -> None:
        """After the replay: run on, without arrivals past the slice, until every request
        has finished (or the drain tail ends), so latencies and completions are final."""
        cluster = self.cluster
        total = cluster.arrival.size
        while not self.finished:
            now = self.now
            cluster.advance(now)
            cluster.run_step(now)
            if now > self.trace.duration_s and cluster.completed == total:
                break

    # -- what the service's reader and actuators see and do ----------------------------

    def cluster_state(self) -> engine_types.ClusterState:
        return sim_feed.cluster_state(self.cluster, start_epoch_s=self.trace.start_s,
                                      now=self.now)

    def scale(self, decision: engine_types.Decision) -> actuators.ApplyOutcome:
        """Set spec.replicas as the scale subresource would, with its precondition."""
        cluster = self.cluster
        target = f"{self.policy.metadata.namespace}/{self.policy.spec.target.name}"
        previous = cluster.spec_replicas
        if decision.current != previous:
            # The real actuator patches with the resourceVersion it read; a change since
            # the read is a 409, and the reactor re-reads and re-decides.
            return actuators.ApplyOutcome(actuators.Outcome.CONFLICT, target, previous,
                                          decision.desired, "spec.replicas changed since read")
        if decision.desired == previous:
            return actuators.ApplyOutcome(actuators.Outcome.UNCHANGED, target, previous,
                                          decision.desired, "already at desired replicas")
        cluster.scale_to(decision.desired, now=self.now)
        ready, starting = self.ready_starting()
        self.changes.append(ScaleChange(at_s=self.now, previous=previous,
                                        desired=decision.desired, winner=decision.winner,
                                        summary=decision.summary,
                                        words=explain.in_words(dataclasses.asdict(decision)),
                                        ready=ready,
                                        starting=starting))
        return actuators.ApplyOutcome(actuators.Outcome.APPLIED, target, previous,
                                      decision.desired, f"spec.replicas {previous}->"
                                      f"{decision.desired} in the simulated cluster")

    def hold_placeholders(self, plan: engine_types.NodePlan) -> actuators.ApplyOutcome:
        """Keep the plan's placeholder pods, each holding a whole node (warm headroom)."""
        cluster = self.cluster
        previous = sum(1 for s in cluster.live_slots if cluster.pods[s].placeholder)
        target = f"{plan.pool}-placeholders"
        if previous == plan.placeholder_pods:
            return actuators.ApplyOutcome(actuators.Outcome.UNCHANGED, target, previous,
                                          plan.placeholder_pods, "placeholders in place")
        cluster.set_placeholders(plan.placeholder_pods, now=self.now)
        return actuators.ApplyOutcome(actuators.Outcome.APPLIED, target, previous,
                                      plan.placeholder_pods,
                                      f"placeholder pods {previous}->{plan.placeholder_pods}")

    # -- what the terminal view shows -----------------------------------------------------

    def arrival_rate(self, *, window_s: float = 10.0) -> float:
        """Requests per second over the last `window_s` simulated seconds."""
        cluster = self.cluster
        arrivals = cluster.window(cluster.history.arrivals, start=self.now - window_s,
                                  end=self.now)
        return float(np.sum(arrivals)) / window_s

    def in_system(self) -> tuple[int, int]:
        """(waiting, running) requests at the last recorded step."""
        cluster = self.cluster
        if cluster.step == 0:
            return 0, 0
        i = cluster.step - 1
        return int(cluster.history.waiting[i]), int(cluster.history.running[i])

    def ready_starting(self) -> tuple[int, int]:
        pods = self.cluster.replicas()
        ready = sum(1 for p in pods if p.phase == "ready")
        return ready, len(pods) - ready


class _Models:
    def __init__(self, models: Mapping[str, SimulatedModel]) -> None:
        self.models = models

    def model(self, policy: policy_model.ScalePolicy) -> SimulatedModel:
        found = self.models.get(policy.key)
        if found is None:
            raise LookupError(f"no simulated cluster for {policy.key} (the demo simulates "
                              "the policies it was started with)")
        return found


class SimReader(_Models):
    """ClusterReader: the target's replicas as the simulated pods show them."""

    async def read(self, policy: policy_model.ScalePolicy) -> engine_types.ClusterState:
        return self.model(policy).cluster_state()


class SimReplicaActuator(_Models):
    """ReplicaActuator: writes a decision's replicas to the simulated Deployment."""

    async def apply(self, policy: policy_model.ScalePolicy, decision: engine_types.Decision
                    ) -> actuators.ApplyOutcome:
        return self.model(policy).scale(decision)


class SimPlaceholderActuator:
    """NodePoolActuator ('placeholder'): placeholder pods in the simulated pool.

    Each simulated model has its own nodes; a pool shared by several policies is held by
    the first of them (by key), which is where its placeholder pods live.
    """

    def __init__(self, models: Mapping[str, SimulatedModel]) -> None:
        self.models = models

    async def apply(self, pool: policy_model.NodePool, plan: engine_types.NodePlan
                    ) -> actuators.ApplyOutcome:
        members = sorted(key for key, m in self.models.items()
                         if m.policy.spec.node_pool is not None
                         and m.policy.spec.node_pool.name == pool.name)
        if not members:
            return actuators.ApplyOutcome(actuators.Outcome.FAILED, pool.name, None,
                                          plan.placeholder_pods, "no simulated model on pool")
        return self.models[members[0]].hold_placeholders(plan)


def backend(models: Mapping[str, SimulatedModel]) -> runner.ClusterBackend:
    """The service's ClusterBackend over the simulated models; a single, always-leading replica."""
    return runner.ClusterBackend(
        reader=SimReader(models), actuator=SimReplicaActuator(models),
        leader=actuators.AlwaysLeader("scaler-demo"),
        pool_actuators={"placeholder": SimPlaceholderActuator(models)})
