"""Typed, frozen inputs and outputs of the decision engine.

Times are epoch seconds (floats) from an injected clock: the service passes the wall
clock, the simulator its virtual clock. Durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SignalValue:
    """One signal's current value for a model, as the signal store combined it.

    `age_s` is the age of the newest sample that contributed (0 = just now);
    `sources` counts the fresh sources summed (queue, in-flight, tokens/s) or merged
    (latency histograms).
    """

    value: float
    age_s: float = 0.0
    sources: int = 1


@dataclass(frozen=True, slots=True)
class SignalSnapshot:
    """What is known about a model's demand at `now`. `None` means missing.

    queue_depth: requests waiting to start (summed over sources).
    in_flight: requests being processed (summed over sources).
    tokens_per_second: generated tokens per second (summed over sources).
    prompt_tokens_per_second: prompt tokens prefilled per second (summed over sources).
    p95_latency_s: p95 of the policy's latency metric, from merged histograms.
    arrival_rate: requests per second arriving (e.g. JetStream sequence rate); optional.
    """

    queue_depth: SignalValue | None = None
    in_flight: SignalValue | None = None
    tokens_per_second: SignalValue | None = None
    prompt_tokens_per_second: SignalValue | None = None
    p95_latency_s: SignalValue | None = None
    arrival_rate: SignalValue | None = None


@dataclass(frozen=True, slots=True)
class ColdStartObservation:
    """A pod's observed start: created at `created_at`, ready at `ready_at`.

    `node_boot_s` is the part spent waiting for a node (0 when it landed on a free GPU).
    """

    created_at: float
    ready_at: float
    node_boot_s: float = 0.0

    @property
    def pod_start_s(self) -> float:
        return max(0.0, self.ready_at - self.created_at - self.node_boot_s)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """The target's replicas as the cluster reports them.

    current: the scale subresource's spec.replicas (what was last asked for).
    ready: replicas passing readiness.
    starting: creation times of replicas that exist but are not ready yet.
    free_replica_slots: how many more replicas fit on GPUs already free in the pool
      (None = unknown: assume a node must boot).
    observations: recent pod start timelines, for learning time to ready.
    budget_gpus: an external cap on the GPUs this model may hold in all (from a tenant or
      pool budget), on top of the policy's own `budget`; None = no external cap.
    """

    current: int
    ready: int
    starting: tuple[float, ...] = ()
    free_replica_slots: int | None = None
    observations: tuple[ColdStartObservation, ...] = ()
    budget_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A time-stamped recommendation kept for stabilization windows."""

    at: float
    replicas: int


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """A change the engine decided, kept for rate-limit periods."""

    at: float
    delta: int


@dataclass(frozen=True, slots=True)
class DemandSample:
    """Demand, in the capacity unit of concurrency (requests), at a time."""

    at: float
    demand: float


@dataclass(frozen=True, slots=True)
class EngineState:
    """Everything the engine remembers between decisions. Immutable; `decide` returns a new one.

    recommendations: raw recommendations within the longest stabilization window.
    events: scale changes within the longest rate-limit period.
    demand: demand samples within the forecast window (for the trend).
    learned_pod_start_s / learned_node_boot_s: smoothed observed start times (None until
      observed); last_observation_at: the newest observation already learned from.
    replicas_per_request_rate: smoothed load of one request per second, in replicas,
      learned from the arrival rate while the model is not saturated (None until seen).
    last_desired: the last decided replicas (None before the first decision).
    """

    recommendations: tuple[Recommendation, ...] = ()
    events: tuple[ScaleEvent, ...] = ()
    demand: tuple[DemandSample, ...] = ()
    learned_pod_start_s: float | None = None
    learned_node_boot_s: float | None = None
    last_observation_at: float = float("-inf")
    replicas_per_request_rate: float | None = None
    last_desired: int | None = None


@dataclass(frozen=True, slots=True)
class SignalReason:
    """One signal's part in a decision."""

    name: str
    value: float | None
    age_s: float | None
    fresh: bool
    recommendation: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class Clamp:
    """A bound or rule that changed the replica count from `before` to `after`."""

    name: str
    before: int
    after: int
    detail: str


@dataclass(frozen=True, slots=True)
class Forecast:
    """The cold-start look-ahead used by a decision. Demand is in replicas (fractional).

    demand_now: the fitted demand now; slope_per_s: its trend (never negative: the
    look-ahead only adds); demand_at_ready: demand_now + slope * time_to_ready_s;
    replicas_at_node_ready: the forecast one node boot further, for node headroom.
    """

    time_to_ready_s: float
    needs_node: bool
    demand_now: float
    slope_per_s: float
    demand_at_ready: float
    replicas_at_ready: int
    replicas_at_node_ready: int


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer for one model at one time, with every reason."""

    model: str
    at: float
    current: int
    desired: int
    recommendation: int | None
    winner: str | None
    signals: tuple[SignalReason, ...]
    clamps: tuple[Clamp, ...] = ()
    forecast: Forecast | None = None
    held: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return self.desired != self.current

    @property
    def summary(self) -> str:
        """One line, for Kubernetes Events and logs."""
        verb = "hold" if not self.changed else ("scale up" if self.desired > self.current else
                                                 "scale down")
        why = self.winner or "no fresh signal"
        parts = [f"{verb} {self.current}->{self.desired} ({why})"]
        parts.extend(f"{c.name}: {c.before}->{c.after}" for c in self.clamps)
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class PoolDemand:
    """One model's GPU demand on a node pool, for node planning."""

    model: str
    gpus_per_replica: int
    replicas: int
    forecast_replicas: int


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What a node pool needs: nodes for the decided replicas plus warm headroom.

    nodes_for_replicas: nodes the bin-packing of desired replicas needs.
    headroom_nodes: spare nodes to keep booted (forecast within one node boot + static floor).
    nodes_wanted: nodes_for_replicas + headroom_nodes, capped by the pool's max.
    placeholder_pods / placeholder_gpus: the placeholder actuator's Deployment size: one pod
      per headroom node, each requesting a whole node's GPUs, so real replicas preempt them.
    """

    pool: str
    resource_name: str
    gpus_per_node: int
    nodes_for_replicas: int
    headroom_nodes: int
    nodes_wanted: int
    placeholder_pods: int
    placeholder_gpus: int
    reasons: tuple[str, ...] = ()
