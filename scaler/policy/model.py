"""ScalePolicy: the per-model policy file format (DESIGN 4.1), as frozen pydantic models."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

KIND = "ScalePolicy"

# Kubernetes DNS-1123 label: what Deployment, namespace and pool names must be.
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$|^24:00$")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class _Model(BaseModel):
    """Base: camelCase in files, snake_case in code, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


def _dns_name(value: str, what: str) -> str:
    if len(value) > 63 or not _DNS1123.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid Kubernetes name "
            "(lowercase letters, digits and '-', at most 63 characters)"
        )
    return value


class Metadata(_Model):
    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name", "namespace")
    @classmethod
    def _names(cls, value: str) -> str:
        return _dns_name(value, "name")


class Target(_Model):
    """The object whose scale subresource is patched: any kind with `/scale`."""

    api_version: str = "apps/v1"
    kind: str = "Deployment"
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_name(value, "target name")

    @property
    def group(self) -> str:
        """API group ('' for the core group), e.g. 'apps' from 'apps/v1'."""
        return self.api_version.rpartition("/")[0]


class Replicas(_Model):
    min: int = Field(default=0, ge=0)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


def _parse_days(spec: str) -> frozenset[int]:
    """'Mon-Fri', 'Sat,Sun', 'Mon-Wed,Fri' or '*' -> ISO weekday numbers (Mon=0)."""
    if spec.strip() in ("*", "daily", "Daily"):
        return frozenset(range(7))
    days: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            first, _, last = part.partition("-")
            if first not in _DAYS or last not in _DAYS:
                raise ValueError(f"unknown day range {part!r}; use e.g. Mon-Fri")
            start, end = _DAYS.index(first), _DAYS.index(last)
            # Wraps round the week: Fri-Mon is Fri, Sat, Sun, Mon.
            span = (end - start) % 7
            days.update((start + i) % 7 for i in range(span + 1))
        elif part in _DAYS:
            days.add(_DAYS.index(part))
        else:
            raise ValueError(f"unknown day {part!r}; use Mon, Tue, Wed, Thu, Fri, Sat, Sun")
    return frozenset(days)


class FloorSchedule(_Model):
    """A time window with its own warm floor, e.g. business hours in Europe/Berlin."""

    days: str = "Mon-Sun"
    from_: str = Field(alias="from")
    to: str
    time_zone: str = "UTC"
    replicas: int = Field(ge=0)

    @field_validator("days")
    @classmethod
    def _days(cls, value: str) -> str:
        _parse_days(value)
        return value

    @field_validator("from_", "to")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if not _HHMM.match(value):
            raise ValueError(f"time {value!r} is not HH:MM (24 h)")
        return value

    @field_validator("time_zone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value

    @property
    def weekdays(self) -> frozenset[int]:
        return _parse_days(self.days)

    def active(self, now: float) -> bool:
        """Whether the window covers the instant `now` (epoch seconds) in its time zone.

        A window whose `to` is earlier than `from` runs past midnight: 22:00-06:00 on
        Mon covers Mon 22:00 to Tue 06:00, and belongs to Monday.
        """
        local = dt.datetime.fromtimestamp(now, zoneinfo.ZoneInfo(self.time_zone))
        minute = local.hour * 60 + local.minute
        start = _minutes(self.from_)
        end = _minutes(self.to)
        if start < end:
            return local.weekday() in self.weekdays and start <= minute < end
        # Overnight window: the evening part belongs to today, the morning part to yesterday.
        if minute >= start:
            return local.weekday() in self.weekdays
        return minute < end and (local.weekday() - 1) % 7 in self.weekdays


def _minutes(hhmm: str) -> int:
    hours, _, minutes = hhmm.partition(":")
    return int(hours) * 60 + int(minutes)


class WarmFloor(_Model):
    """Replicas kept ready whatever the demand, optionally by schedule."""

    replicas: int = Field(default=0, ge=0)
    schedules: tuple[FloorSchedule, ...] = ()

    def at(self, now: float) -> int:
        """The floor in force at `now`: the largest of the base and every active schedule."""
        active = [s.replicas for s in self.schedules if s.active(now)]
        return max([self.replicas, *active])

    @property
    def highest(self) -> int:
        return max([self.replicas, *(s.replicas for s in self.schedules)])


class ConcurrencySignal(_Model):
    target_per_replica: float = Field(gt=0, description="running + waiting requests per replica")


class QueueDepthSignal(_Model):
    target_waiting_per_replica: float = Field(
        gt=0, description="waiting requests per ready replica before the queue pushes up"
    )


class TokensPerSecondSignal(_Model):
    """Work in tokens: generated tokens (decode) and, optionally, prompt tokens (prefill).

    A replica's time is shared between the two, so each is a fraction of one replica:
    generated / capacityPerReplica + prompt / promptCapacityPerReplica.
    """

    capacity_per_replica: float = Field(gt=0, description="generated tokens/s one replica "
                                        "sustains when it only decodes")
    prompt_capacity_per_replica: float | None = Field(
        default=None, gt=0, description="prompt tokens/s one replica prefills when it only "
        "prefills; set it for long-prompt workloads, whose load generated tokens miss")
    target_utilization: float = Field(default=0.8, gt=0, le=1)


class P95LatencySignal(_Model):
    metric: Literal["ttft", "e2e", "itl"] = "ttft"
    slo_seconds: float = Field(gt=0)


class Signals(_Model):
    concurrency: ConcurrencySignal | None = None
    queue_depth: QueueDepthSignal | None = None
    tokens_per_second: TokensPerSecondSignal | None = None
    p95_latency: P95LatencySignal | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> Signals:
        if not (self.concurrency or self.queue_depth or self.tokens_per_second):
            raise ValueError(
                "at least one demand signal is needed: concurrency, queueDepth or "
                "tokensPerSecond (p95Latency is a guard and cannot scale on its own)"
            )
        return self


class NatsSource(_Model):
    subject: str | None = Field(
        default=None, description="defaults to <prefix>.<namespace>.<model>"
    )


class JetStreamSource(_Model):
    stream: str
    consumer: str
    interval_seconds: float = Field(default=2.0, gt=0)


class PrometheusSource(_Model):
    preset: Literal["vllm", "sglang", "tgi", "custom"] = "vllm"
    model_name: str | None = Field(default=None, description="value of the model label")
    model_label: str = "model_name"
    interval_seconds: float = Field(default=5.0, gt=0)
    queries: dict[
        Literal["queue_depth", "in_flight", "tokens_per_second",
                "prompt_tokens_per_second", "p95_latency", "kv_cache_usage"],
        str,
    ] = Field(default_factory=dict, description="custom PromQL per signal, overriding the preset")

    @model_validator(mode="after")
    def _custom_needs_queries(self) -> PrometheusSource:
        if self.preset == "custom" and not self.queries:
            raise ValueError("preset 'custom' needs at least one entry in queries")
        return self


class Sources(_Model):
    nats: NatsSource | None = Field(default_factory=NatsSource)
    jetstream: JetStreamSource | None = None
    prometheus: PrometheusSource | None = None


class ScalingRule(_Model):
    """One HPA-style rate limit: at most `value` pods (or percent) per `periodSeconds`."""

    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0)
    period_seconds: int = Field(gt=0, le=1800)


class ScalingDirection(_Model):
    stabilization_seconds: int = Field(ge=0, le=3600)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: tuple[ScalingRule, ...] = ()


def _default_up() -> ScalingDirection:
    # The HPA's defaults: no up window; at most max(4 pods, 100 %) per 15 s.
    return ScalingDirection(
        stabilization_seconds=0,
        policies=(
            ScalingRule(type="Pods", value=4, period_seconds=15),
            ScalingRule(type="Percent", value=100, period_seconds=15),
        ),
    )


def _default_down() -> ScalingDirection:
    # The HPA's defaults: 300 s down window; up to 100 % per 15 s after it.
    return ScalingDirection(
        stabilization_seconds=300,
        policies=(ScalingRule(type="Percent", value=100, period_seconds=15),),
    )


class Behavior(_Model):
    scale_up: ScalingDirection = Field(default_factory=_default_up)
    scale_down: ScalingDirection = Field(default_factory=_default_down)
    tolerance: float = Field(
        default=0.1, ge=0, lt=1,
        description="a capacity recommendation within this fraction of the current count "
        "changes nothing (the HPA's default tolerance, 10 %)")


class ColdStart(_Model):
    """The chain a new replica goes through before it serves, in seconds."""

    node_boot_seconds: float = Field(default=300, ge=0, description="only when no GPU is free")
    image_pull_seconds: float = Field(default=60, ge=0)
    model_load_seconds: float = Field(default=60, ge=0)
    readiness_seconds: float = Field(default=15, ge=0)
    learn: bool = True

    @property
    def pod_start_seconds(self) -> float:
        """Time to ready on a node that already has a free GPU."""
        return self.image_pull_seconds + self.model_load_seconds + self.readiness_seconds


class ForecastSpec(_Model):
    """Cold-start look-ahead: demand is extrapolated over the time a new replica needs."""

    enabled: bool = True
    window_seconds: float = Field(
        default=120, gt=0, le=3600,
        description="history the trend is fitted over; longer is smoother but slower to react",
    )


class Resources(_Model):
    gpus_per_replica: int = Field(default=1, ge=1)
    resource_name: str = "nvidia.com/gpu"

    @field_validator("resource_name")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not re.match(r"^[a-z0-9.-]+/[a-z0-9][-a-z0-9._]*$", value):
            raise ValueError(f"{value!r} is not an extended resource name like nvidia.com/gpu")
        return value


class Toleration(_Model):
    """A Kubernetes toleration (core/v1), for the pool's taints."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        """As the API spells it, without unset fields."""
        return {k: v for k, v in self.model_dump(by_alias=True).items() if v is not None}


class NodePool(_Model):
    name: str
    gpus_per_node: int = Field(default=8, ge=1)
    warm_nodes: int = Field(default=0, ge=0, description="static floor of spare nodes")
    max_nodes: int | None = Field(default=None, ge=1)
    actuator: Literal["placeholder", "clusterapi", "none"] = "placeholder"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] | None = Field(
        default=None, description="tolerations of the pool's taints for placeholder pods; "
        "None = the service-wide default (nvidia.com/gpu Exists NoSchedule)")
    machine_deployment: str | None = Field(default=None, description="for actuator clusterapi")
    scale_down: bool = Field(default=False, description="let the scaler remove nodes")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_name(value, "node pool name")

    @model_validator(mode="after")
    def _capi(self) -> NodePool:
        if self.actuator == "clusterapi" and not self.machine_deployment:
            raise ValueError("actuator 'clusterapi' needs machineDeployment")
        return self


class Budget(_Model):
    """GPU budget: the most GPUs this model may hold at once."""

    max_gpus: int = Field(ge=1)


class Cost(_Model):
    gpu_hourly: float = Field(default=2.5, ge=0, description="price of one GPU for one hour")


class ScalePolicySpec(_Model):
    target: Target
    replicas: Replicas
    warm_floor: WarmFloor = Field(default_factory=WarmFloor)
    signals: Signals
    sources: Sources = Field(default_factory=Sources)
    behavior: Behavior = Field(default_factory=Behavior)
    cold_start: ColdStart = Field(default_factory=ColdStart)
    forecast: ForecastSpec = Field(default_factory=ForecastSpec)
    resources: Resources = Field(default_factory=Resources)
    node_pool: NodePool | None = None
    budget: Budget | None = None
    stale_after_seconds: float = Field(default=30, gt=0)
    cost: Cost = Field(default_factory=Cost)
    profile: str | None = Field(default=None, description="replica performance profile (sim)")

    @model_validator(mode="after")
    def _cross(self) -> ScalePolicySpec:
        floor = self.warm_floor.highest
        if floor > self.replicas.max:
            raise ValueError(
                f"warmFloor ({floor}) is above replicas.max ({self.replicas.max})"
            )
        if self.node_pool and self.resources.gpus_per_replica > self.node_pool.gpus_per_node:
            raise ValueError(
                f"resources.gpusPerReplica ({self.resources.gpus_per_replica}) is more than "
                f"nodePool.gpusPerNode ({self.node_pool.gpus_per_node}): "
                "a replica must fit on one node"
            )
        if self.budget:
            need = max(self.replicas.min, floor) * self.resources.gpus_per_replica
            if need > self.budget.max_gpus:
                raise ValueError(
                    f"budget.maxGpus ({self.budget.max_gpus}) cannot hold the floor of "
                    f"{max(self.replicas.min, floor)} replicas x "
                    f"{self.resources.gpus_per_replica} GPUs"
                )
        return self


class ScalePolicy(_Model):
    api_version: Literal["scaler.io/v1alpha1"]
    kind: Literal["ScalePolicy"]
    metadata: Metadata
    spec: ScalePolicySpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def key(self) -> str:
        """'namespace/name': how the service, store and metrics name a model."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

