"""ScalePolicy: the per-model policy file format (DESIGN 4.1), as frozen pydantic models."""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from scaler.core import vocabulary

KIND = "ScalePolicy"

# Kubernetes DNS-1123 label: what Deployment, namespace and pool names must be.
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$|^24:00$")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# An extended resource name: a vendor domain, '/', and a name (nvidia.com/mig-1g.10gb).
_RESOURCE_NAME = re.compile(r"^[a-z0-9.-]+/[a-z0-9][-a-z0-9._]*$")
TENANT_LABEL = "tenant"
COST_CENTER_LABEL = "cost-center"


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


def _resource_name(value: str) -> str:
    if not _RESOURCE_NAME.match(value):
        raise ValueError(f"{value!r} is not an extended resource name like nvidia.com/gpu")
    return value


class Metadata(_Model):
    """Which model this policy is for: `namespace/name` is its key everywhere."""

    name: str = Field(
        description="The model's name (a DNS-1123 label): the key in signal subjects, "
        "/metrics, `scaler explain` and the external metrics API.")
    namespace: str = Field(
        default="default",
        description="Namespace of the model and its target. 'default' is the namespace "
        "Kubernetes itself defaults to.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Free labels; `tenant` and `cost-center` label the cost metrics and "
        "the external metrics API's metricLabels.")

    @field_validator("name", "namespace")
    @classmethod
    def _names(cls, value: str) -> str:
        return _dns_name(value, "name")


class Target(_Model):
    """The object whose scale subresource is patched: any kind with `/scale`."""

    api_version: str = Field(
        default="apps/v1", description="API version of the target, e.g. apps/v1 or "
        "leaderworkerset.x-k8s.io/v1. Default: a Deployment's.")
    kind: str = Field(
        default="Deployment", description="Kind of the target: any kind with a scale "
        "subresource (Deployment, StatefulSet, LeaderWorkerSet, a CRD). Default: the usual "
        "way inference servers are deployed.")
    name: str = Field(description="Name of the target object, in metadata.namespace.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_name(value, "target name")

    @property
    def group(self) -> str:
        """API group ('' for the core group), e.g. 'apps' from 'apps/v1'."""
        return self.api_version.rpartition("/")[0]


class Replicas(_Model):
    """Hard bounds on the target's replicas; every other rule works inside them."""

    min: int = Field(
        default=0, ge=0, description="Fewest replicas, whatever the signals say. 0 (with no "
        "warm floor) allows scale to zero: idle GPUs cost the most.")
    max: int = Field(
        ge=1, description="Most replicas, whatever the signals say: the cost ceiling. "
        "Required, because an unbounded GPU scaler is a budget incident.")

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

    days: str = Field(
        default="Mon-Sun", description="Days the window applies: 'Mon-Fri', 'Sat,Sun', "
        "'Fri-Mon' (wraps), or '*'. Default: every day.")
    from_: str = Field(
        alias="from", description="Start, HH:MM (24 h) in time_zone. A window whose `to` is "
        "earlier runs past midnight and belongs to the day it starts.")
    to: str = Field(description="End, HH:MM (24 h) in time_zone, exclusive; 24:00 is "
                    "midnight at the end of the day.")
    time_zone: str = Field(
        default="UTC", description="IANA time zone of from/to, e.g. Europe/Berlin (daylight "
        "saving time is followed). Default: UTC, the one zone without surprises.")
    replicas: int = Field(ge=0, description="Warm floor while the window is active.")

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

    replicas: int = Field(
        default=0, ge=0, description="Replicas kept ready at all times, whatever the "
        "demand (above replicas.min, at most replicas.max). 0: demand alone decides.")
    schedules: tuple[FloorSchedule, ...] = Field(
        default=(), description="Time windows with their own floor, e.g. business hours; "
        "the floor in force is the largest of `replicas` and every active window.")

    def at(self, now: float) -> int:
        """The floor in force at `now`: the largest of the base and every active schedule."""
        active = [s.replicas for s in self.schedules if s.active(now)]
        return max([self.replicas, *active])

    @property
    def highest(self) -> int:
        return max([self.replicas, *(s.replicas for s in self.schedules)])


class ConcurrencySignal(_Model):
    """Capacity in requests: ceil((running + waiting) / targetPerReplica) replicas."""

    target_per_replica: float = Field(
        gt=0, description="Requests (running + waiting) one replica should hold, e.g. the "
        "batch size at which its latency still meets the SLO. No default: it depends on the "
        "model, the GPU and the prompt lengths.")


class QueueDepthSignal(_Model):
    """Queue pressure: waiting beyond the target pushes the recommendation up, never down."""

    target_waiting_per_replica: float = Field(
        gt=0, description="Requests waiting per ready replica before the queue pushes the "
        "recommendation up, in proportion. No default: how long a wait is acceptable "
        "depends on the SLO.")


class TokensPerSecondSignal(_Model):
    """Work in tokens: generated tokens (decode) and, optionally, prompt tokens (prefill).

    A replica's time is shared between the two, so each is a fraction of one replica:
    generated / capacityPerReplica + prompt / promptCapacityPerReplica.
    """

    capacity_per_replica: float = Field(
        gt=0, description="Generated tokens/s one replica sustains when it only decodes "
        "(measure it with a load test). No default: it depends on model and GPU.")
    prompt_capacity_per_replica: float | None = Field(
        default=None, gt=0, description="Prompt tokens/s one replica prefills when it only "
        "prefills; set it for long-prompt workloads, whose load generated tokens miss. "
        "None: prompt tokens are not counted.")
    target_utilization: float = Field(
        default=0.8, gt=0, le=1, description="Share of a replica's token capacity to plan "
        "for (0..1]. 0.8 leaves 20 % headroom for bursts between decisions.")


class KvCacheSignal(_Model):
    """Memory in use: ready replicas x mean KV-cache usage / targetUtilization.

    Long prompts and long answers can run out of KV cache before compute: a 6k-token
    prompt with an 800-token answer holds 6,800 of an 8B H100's ~400k cache tokens for the
    ~20 s it decodes, so 2.5 of them a second fill 85 % of it. vLLM reports
    `vllm:kv_cache_usage_perc`, SGLang `sglang:token_usage`.
    """

    target_utilization: float = Field(
        gt=0, le=1, description="Mean share of the KV cache the ready replicas should use, "
        "0..1. No default: the headroom a burst of long prompts needs depends on the mix.")


class P95LatencySignal(_Model):
    """A guard on the p95 latency: pushes up toward the SLO, never forces a scale-down."""

    metric: vocabulary.LatencyMetric = Field(
        default=vocabulary.DEFAULT_LATENCY_METRIC,
        description="Which latency: ttft (time to first token), e2e (whole request) or itl "
        "(inter-token). Default ttft: it is what queueing delays, so what scaling fixes.")
    slo_seconds: float = Field(
        gt=0, description="The p95 target in seconds; also the simulator's SLO threshold.")


class Signals(_Model):
    """What the replicas are sized from; the recommendation is the max over fresh signals."""

    concurrency: ConcurrencySignal | None = Field(
        default=None, description="Size by running + waiting requests. None: not used.")
    queue_depth: QueueDepthSignal | None = Field(
        default=None, description="Push up on waiting requests. None: not used.")
    tokens_per_second: TokensPerSecondSignal | None = Field(
        default=None, description="Size by token throughput. None: not used.")
    kv_cache: KvCacheSignal | None = Field(
        default=None, description="Size by KV-cache usage (long prompts and answers). "
        "None: not used. Reads ready replicas only, so it cannot scale from zero alone.")
    p95_latency: P95LatencySignal | None = Field(
        default=None, description="Guard on p95 latency (cannot scale on its own). "
        "None: no guard.")

    @model_validator(mode="after")
    def _at_least_one(self) -> Signals:
        if not (self.concurrency or self.queue_depth or self.tokens_per_second):
            raise ValueError(
                "at least one demand signal is needed: concurrency, queueDepth or "
                "tokensPerSecond (p95Latency is a guard and cannot scale on its own)"
            )
        return self


class NatsSource(_Model):
    """Signal messages pushed over NATS (DESIGN 4.2)."""

    subject: str | None = Field(
        default=None, description="NATS subject of this model's signal messages. None: "
        "<prefix>.<namespace>.<name> (prefix from the settings, scaler.signals).")


class JetStreamSource(_Model):
    """A JetStream consumer's lag as the queue: num_pending waiting, num_ack_pending running."""

    stream: str = Field(description="Name of the JetStream stream that holds the requests.")
    consumer: str = Field(description="Durable consumer the model's workers pull from.")
    interval_seconds: float = Field(
        default=2.0, gt=0, description="Seconds between two reads of the consumer's info. "
        "2 s: one cheap API call per model, and lag is seen 7x sooner than KEDA's 15 s poll.")


class PrometheusSource(_Model):
    """Instant queries against Prometheus, from a server preset or custom PromQL."""

    preset: Literal["vllm", "sglang", "tgi", "custom"] = Field(
        default="vllm", description="Metric names of the inference server: vllm, sglang, "
        "tgi, or custom (queries only). Default vllm, the most common server.")
    model_name: str | None = Field(
        default=None, description="Value of the model label that selects this model's "
        "series. None: metadata.name.")
    model_label: str = Field(
        default="model_name", description="Label that carries the model name. Default: "
        "vLLM's `model_name`.")
    interval_seconds: float = Field(
        default=5.0, gt=0, description="Seconds between two polls. 5 s: a third of the "
        "usual 15 s scrape interval, so a new scrape is seen within 5 s of landing.")
    queries: dict[vocabulary.Signal, str] = Field(
        default_factory=dict, description="Custom PromQL per signal (queue_depth, "
        "in_flight, tokens_per_second, ...), overriding the preset's query for that signal.")

    @model_validator(mode="after")
    def _custom_needs_queries(self) -> PrometheusSource:
        if self.preset == "custom" and not self.queries:
            raise ValueError("preset 'custom' needs at least one entry in queries")
        return self


class Sources(_Model):
    """Where the model's signals come from; several may be used at once."""

    nats: NatsSource | None = Field(
        default_factory=NatsSource, description="NATS push, on by default at the default "
        "subject (the low-latency path); null turns it off.")
    jetstream: JetStreamSource | None = Field(
        default=None, description="JetStream consumer lag. None: not read.")
    prometheus: PrometheusSource | None = Field(
        default=None, description="Prometheus polling. None: not polled.")
    shared_queue_sources: tuple[Annotated[str, Field(min_length=1, max_length=253)], ...] = (
        Field(default=(), max_length=64, description="The `source` of signal messages (over "
              "NATS or HTTP) whose queue_depth is one queue every replica takes from, such "
              "as a gateway or router that holds requests until a replica is free: replicas "
              "started now drain it, as they drain a JetStream consumer's pending messages "
              "(always shared). Empty: a message's queue waits at the replica that sent it."))


class ScalingRule(_Model):
    """One HPA-style rate limit: at most `value` pods (or percent) per `periodSeconds`."""

    type: Literal["Pods", "Percent"] = Field(
        description="Pods: `value` replicas; Percent: `value` % of the current replicas.")
    value: int = Field(gt=0, description="How much change the rule allows per period.")
    period_seconds: int = Field(
        gt=0, le=1800, description="Length of the period, seconds (at most 1800, as the HPA).")


class ScalingDirection(_Model):
    """HPA-style behavior of one direction: a stabilization window and rate limits."""

    stabilization_seconds: int = Field(
        ge=0, le=3600, description="Window over which recommendations are remembered, "
        "seconds (at most 3600): up uses the window's minimum, down its maximum.")
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        default="Max", description="With several rules, Max applies the one that allows "
        "the most change, Min the least; Disabled forbids this direction. Default: the "
        "HPA's.")
    policies: tuple[ScalingRule, ...] = Field(
        default=(), description="Rate limits; none = no limit beyond the window.")


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
    """How fast replicas may change, with the HPA's semantics and defaults."""

    scale_up: ScalingDirection = Field(
        default_factory=_default_up, description="Scale-up behavior. Default (the HPA's): "
        "no window; at most max(4 pods, 100 %) per 15 s.")
    scale_down: ScalingDirection = Field(
        default_factory=_default_down, description="Scale-down behavior. Default (the "
        "HPA's): a 300 s window; then up to 100 % per 15 s.")
    restart_aware: bool = Field(
        default=False, description="Weigh a restart before holding idle replicas. Once "
        "the load has come back twice in a row after about the same gap (within 25 %), "
        "and that gap is longer than starting the replicas again plus twice a slack, the "
        "replicas it no longer needs are released after the slack (not the down window) "
        "and the count held before the drop is started again one time-to-ready + the "
        "slack ahead of the expected return. The slack is 3 x how far the returns came "
        "from the learned gap (their jitter), between 20 and 60 s: 60 s until that was "
        "measured. A return that does not come by 1.25 x the gap forgets the pattern. "
        "Dips and irregular loads keep the down window. And once levels of "
        "demand were seen to leave for good (unrecommended through the down window) twice "
        "in the last hour, a fall is held 1.5 x the longest time a level took to come "
        "back, at least one pod start and at most the down window (a first fall, and a "
        "model whose KV cache is the winning reading, keep the window). Off: the HPA's "
        "window.")
    tolerance: float = Field(
        default=0.1, ge=0, lt=1,
        description="A capacity recommendation within this fraction of the current count "
        "changes nothing (the HPA's default tolerance, 10 %), so noise does not flap.")


class ColdStart(_Model):
    """The chain a new replica goes through before it serves, in seconds."""

    node_boot_seconds: float = Field(
        default=300, ge=0, description="Seconds for a new GPU node to become schedulable; "
        "counted only when no GPU is free. 300 s: a typical cloud GPU node with its driver.")
    image_pull_seconds: float = Field(
        default=60, ge=0, description="Seconds to pull the serving image on a node without "
        "it. 60 s: a multi-GB image from a registry in the same region.")
    model_load_seconds: float = Field(
        default=60, ge=0, description="Seconds to load the weights onto the GPU. 60 s: an "
        "8B to 70B model from fast storage.")
    readiness_seconds: float = Field(
        default=15, ge=0, description="Seconds from weights loaded to passing readiness "
        "(warm-up, CUDA graphs). 15 s: a vLLM start with graph capture.")
    learn: bool = Field(
        default=True, description="Refine these from observed pod start timelines, so "
        "the look-ahead follows the real cluster. Off: the figures above are used as given.")

    @property
    def pod_start_seconds(self) -> float:
        """Time to ready on a node that already has a free GPU."""
        return self.image_pull_seconds + self.model_load_seconds + self.readiness_seconds


class ForecastSpec(_Model):
    """Cold-start look-ahead: demand is extrapolated over the time a new replica needs."""

    enabled: bool = Field(
        default=True, description="Forecast demand at now + time to ready and cover the "
        "larger of now and then. Off: size for the present only.")
    window_seconds: float = Field(
        default=120, gt=0, le=3600,
        description="Seconds of history the trend is fitted over (at most 3600); longer is "
        "smoother but slower to react. 120 s: about one pod start.",
    )


class Headroom(_Model):
    """Spare capacity held beyond what the load needs: the price of meeting the SLO within
    one cold start of a step, which no reactive scaler can otherwise meet."""

    replicas: int = Field(
        default=0, ge=0, description="Replicas kept beyond the capacity demand (and its "
        "forecast). 0: none. One spare replica absorbs a step of one replica's load while "
        "the next one starts.")
    fraction: float = Field(
        default=0.0, ge=0, le=10, description="Capacity demand is multiplied by 1 + fraction "
        "before rounding up (0.25: a quarter more than the load needs). 0: none.")


class Resources(_Model):
    """What one replica needs, for node planning, budgets and cost."""

    gpus_per_replica: int = Field(
        default=1, ge=1, description="GPUs one replica uses (the tensor-parallel size: 8 "
        "for a 70B model at TP8). Default: one GPU.")
    resource_name: str = Field(
        default="nvidia.com/gpu", description="Extended resource of those GPUs, including "
        "MIG profiles such as nvidia.com/mig-1g.10gb. Default: a whole NVIDIA GPU.")
    device_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, description="DeviceClass "
        "(resource.k8s.io/v1) whose devices the replicas claim through "
        "ResourceClaimTemplates (DRA), instead of the extended resource: pool capacity is "
        "then the devices of this class in the nodes' ResourceSlices, use their allocated "
        "ResourceClaims. None: GPUs are the extended resource `resourceName`.")

    @field_validator("resource_name")
    @classmethod
    def _resource(cls, value: str) -> str:
        return _resource_name(value)


class Toleration(_Model):
    """A Kubernetes toleration (core/v1), for the pool's taints."""

    key: str | None = Field(
        default=None, description="Taint key to tolerate. None with Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Equal: the taint's value must be `value`; Exists: any "
        "value. Default Equal, as in Kubernetes.")
    value: str | None = Field(default=None, description="Taint value, for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate. None: every effect.")

    def manifest(self) -> dict[str, str]:
        """As the API spells it, without unset fields."""
        return {k: v for k, v in self.model_dump(by_alias=True).items() if v is not None}


class NodePool(_Model):
    """The GPU node pool the model runs on: nodes are prepared before pods need them."""

    name: str = Field(description="Pool name (a DNS-1123 label); models naming the same "
                      "pool are planned together.")
    gpus_per_node: int = Field(
        default=8, ge=1, description="GPUs (of resources.resourceName) per node. 8: the "
        "usual H100/A100 server.")
    warm_nodes: int = Field(
        default=0, ge=0, description="Static floor of spare nodes kept beyond what the "
        "forecast needs. 0: headroom from the forecast only.")
    max_nodes: int | None = Field(
        default=None, ge=1, description="Most nodes the pool may have. None: no cap here "
        "(the cloud's quota or the MachineDeployment's max still applies).")
    actuator: Literal["placeholder", "clusterapi", "capacitybuffer", "none"] = Field(
        default="placeholder", description="How spare nodes are made: placeholder (pause "
        "pods the cluster autoscaler makes room for), clusterapi (scale a "
        "MachineDeployment), capacitybuffer (a Cluster Autoscaler CapacityBuffer of "
        "node-sized chunks, CA 1.34+), none (plan only). Default: works with any cluster "
        "autoscaler.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels that pick the pool's nodes, also "
        "given to placeholder pods. Empty: any node with the GPU resource.")
    tolerations: tuple[Toleration, ...] | None = Field(
        default=None, description="Tolerations of the pool's taints for placeholder pods. "
        "None: the service-wide default (nvidia.com/gpu Exists NoSchedule).")
    machine_deployment: str | None = Field(
        default=None, description="MachineDeployment to scale, for actuator clusterapi "
        "(required there).")
    scale_down: bool = Field(
        default=False, description="Let the scaler remove nodes too. Off: it only adds, "
        "and leaves removal to the cluster autoscaler, which knows what runs where.")

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

    max_gpus: int = Field(
        ge=1, description="Most GPUs (replicas x gpusPerReplica) the model may hold; must "
        "hold the floor.")


class Cost(_Model):
    """Prices for cost reports and /metrics."""

    gpu_hourly: float = Field(
        default=2.5, ge=0, description="Price of one GPU for one hour, in your currency. "
        "2.5: a typical on-demand H100 hour in 2025.")


MAX_VARIANTS = 4
"""Most variants of one model: `engine.variants.mix` searches their counts exactly, and a
handful of hardware types is what a fleet offers (H100, A100, L40S, a MIG slice)."""


class Variant(_Model):
    """One deployment of the model on one kind of hardware (an H100, A100 or L40S
    Deployment of the same weights), with what one replica of it serves."""

    name: str = Field(description="The variant's name (a DNS-1123 label), unique in the "
                      "policy: the key ns/model#name in arbitration and explanations.")
    target: Target = Field(description="The variant's own object with a scale subresource, "
                           "patched with its replica count.")
    node_pool: str = Field(description="Name of the GpuPool its replicas run on; it must "
                           "exist when GpuPools are loaded (checked by `scaler validate`).")
    resources: Resources = Field(
        default_factory=Resources, description="GPUs per replica and their resource name "
        "on this hardware. Default: one nvidia.com/gpu.")
    capacity: float = Field(
        gt=0, description="What one replica serves, in the policy's unit: requests as "
        "signals.concurrency.targetPerReplica when that is set, else generated tokens/s as "
        "signals.tokensPerSecond.capacityPerReplica. No default: measure it per hardware "
        "(a profile run, bench/).")
    gpu_hourly: float | None = Field(
        default=None, ge=0, description="Price of one of its GPUs for one hour. None: its "
        "GpuPool's gpuHourly, else spec.cost.gpuHourly.")
    pod_start_seconds: float | None = Field(
        default=None, ge=0, description="Seconds from a new replica on a free GPU to ready "
        "(image pull + weights + readiness) on this hardware. None: spec.coldStart's.")
    profile: str | None = Field(
        default=None, description="Replica performance profile on this hardware for the "
        "simulator (e.g. llama-3.1-8b-l40s). None: spec.profile.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_name(value, "variant name")

    @field_validator("node_pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        return _dns_name(value, "node pool name")


class ScalePolicySpec(_Model):
    """How one model scales."""

    target: Target = Field(description="The object whose scale subresource is patched.")
    replicas: Replicas = Field(description="Hard bounds on replicas.")
    warm_floor: WarmFloor = Field(
        default_factory=WarmFloor, description="Replicas kept whatever the demand, "
        "optionally by schedule. Default: none.")
    signals: Signals = Field(description="What replicas are sized from; at least one of "
                             "concurrency, queueDepth, tokensPerSecond.")
    sources: Sources = Field(
        default_factory=Sources, description="Where the signals come from. Default: NATS "
        "push at the default subject.")
    behavior: Behavior = Field(
        default_factory=Behavior, description="Stabilization windows, rate limits and "
        "tolerance. Default: the HPA's.")
    cold_start: ColdStart = Field(
        default_factory=ColdStart, description="How long a new replica takes to serve, for "
        "the look-ahead.")
    headroom: Headroom = Field(
        default_factory=Headroom, description="Spare capacity beyond the load, for steps "
        "faster than a cold start. Default: none (size for the load and its forecast).")
    forecast: ForecastSpec = Field(
        default_factory=ForecastSpec, description="The cold-start look-ahead.")
    resources: Resources = Field(
        default_factory=Resources, description="GPUs per replica and their resource name.")
    node_pool: NodePool | None = Field(
        default=None, description="GPU node pool to prepare nodes in. None: nodes are left "
        "to the cluster autoscaler.")
    budget: Budget | None = Field(default=None, description="GPU budget. None: replicas.max "
                                  "is the only cap.")
    stale_after_seconds: float = Field(
        default=30, gt=0, description="A signal older than this many seconds is stale: it "
        "cannot scale down (a fresh one may still scale up). 30 s: two missed scrapes at "
        "Prometheus's usual 15 s interval.")
    cost: Cost = Field(default_factory=Cost, description="Prices for cost reports.")
    profile: str | None = Field(
        default=None, description="Replica performance profile used by the simulator and "
        "demo (e.g. llama-3.1-8b-h100). None: the simulator's default profile.")
    tier: vocabulary.Tier = Field(
        default=vocabulary.DEFAULT_TIER, description="Priority on a shared GPU pool: online "
        "(users waiting) before batch (offline work, absorbs a shortfall) before dev. "
        "Default online: a model serves users unless it says otherwise.")
    variants: tuple[Variant, ...] = Field(
        default=(), max_length=MAX_VARIANTS, description="Deployments of the same model on "
        "different hardware (at most 4); the fleet step serves the demand with the "
        "cheapest mix of them, keeping ready replicas first. Empty: spec.target alone.")

    @model_validator(mode="after")
    def _cross(self) -> ScalePolicySpec:
        self._check_variants()
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

    def _check_variants(self) -> None:
        if not self.variants:
            return
        names = [v.name for v in self.variants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"variants: {', '.join(twice)} named more than once")
        targets = [(v.target.kind, v.target.name) for v in self.variants]
        shared = sorted({f"{kind} {name}" for kind, name in targets
                         if targets.count((kind, name)) > 1})
        if shared:
            raise ValueError(f"variants: {', '.join(shared)} is the target of several "
                             "variants (each variant scales its own)")
        if self.signals.concurrency is None and self.signals.tokens_per_second is None:
            raise ValueError("variants need a capacity unit: signals.concurrency or "
                             "signals.tokensPerSecond (a queue target has no per-replica "
                             "capacity to compare hardware by)")

    @property
    def latency_metric(self) -> vocabulary.LatencyMetric:
        """The latency metric the policy's guard reads, and so the one the store reports."""
        guard = self.signals.p95_latency
        return guard.metric if guard is not None else vocabulary.DEFAULT_LATENCY_METRIC


class ScalePolicy(_Model):
    """One model's scaling policy (DESIGN 4.1)."""

    api_version: Literal["scaler.io/v1alpha1"] = Field(description="Always scaler.io/v1alpha1.")
    kind: Literal["ScalePolicy"] = Field(description="Always ScalePolicy.")
    metadata: Metadata = Field(description="The model's name, namespace and labels.")
    spec: ScalePolicySpec = Field(description="How the model scales.")

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def key(self) -> str:
        """'namespace/name': how the service, store and metrics name a model."""
        return vocabulary.model_key(self.metadata.namespace, self.metadata.name)

    @property
    def tenant(self) -> str | None:
        """The `tenant` label: whose model this is, for GpuBudgets and cost reports."""
        return self.metadata.labels.get(TENANT_LABEL)

    @property
    def cost_center(self) -> str | None:
        """The `cost-center` label: who pays, for GpuBudgets and cost reports."""
        return self.metadata.labels.get(COST_CENTER_LABEL)

