"""The signal vocabulary, defined once: names, how sources combine, which the engine reads.

Every layer iterates these enums instead of spelling names out: the message contract's
fields (DESIGN 4.2), the signal store's series, the engine's `SignalSnapshot` fields,
`/metrics` labels, `scaler explain`, the external metrics API and the Prometheus query
keys of a ScalePolicy.
"""

from __future__ import annotations

import enum
from typing import Final


class Combine(enum.Enum):
    """How the samples of several sources (replicas) of one model become one value."""

    SUM = "sum"
    """Each replica reports its own share (its queue, its running batch, its tokens/s)."""
    QUANTILE = "quantile"
    """Latency: histograms merged, the quantile taken from the merge (percentiles cannot
    be averaged); sources that send only a p95 contribute by max (a guard errs high)."""
    MEAN = "mean"
    """Per-replica ratios and gauges (KV-cache usage, GPU activity)."""


class Signal(enum.StrEnum):
    """A measured signal of one model. The value is its name everywhere."""

    QUEUE_DEPTH = "queue_depth"
    """Requests waiting to start (summed over sources)."""
    IN_FLIGHT = "in_flight"
    """Requests being processed, the running batch (summed over sources)."""
    TOKENS_PER_SECOND = "tokens_per_second"
    """Generated tokens per second (summed over sources)."""
    PROMPT_TOKENS_PER_SECOND = "prompt_tokens_per_second"
    """Prompt tokens prefilled per second (summed over sources)."""
    ARRIVAL_RATE = "arrival_rate"
    """Requests per second arriving, from a gateway or a stream's sequence numbers."""
    COMPLETION_RATE = "completion_rate"
    """Requests per second finished (summed over replicas): with the backlog's growth it
    gives the arrival rate where no gateway reports one (flow balance)."""
    P95_LATENCY = "p95_latency"
    """p95 of the policy's latency metric in seconds, from merged histograms."""
    KV_CACHE_USAGE = "kv_cache_usage"
    """Fraction of the KV cache in use, 0..1 (mean over replicas)."""
    GPU_ENGINE_ACTIVE = "gpu_engine_active"
    """DCGM graphics-engine activity, 0..1 (mean over GPUs)."""
    GPU_SM_ACTIVE = "gpu_sm_active"
    """DCGM SM activity, 0..1 (mean over GPUs): the useful-GPU-time ratio."""
    GPU_FB_USED_MIB = "gpu_fb_used_mib"
    """DCGM framebuffer memory used, MiB (mean over GPUs)."""

    @property
    def combine(self) -> Combine:
        return _COMBINE[self]

    @property
    def plausible_max(self) -> float:
        """The largest value one source can report and be believed: orders of magnitude
        past any real deployment (a vLLM replica runs at most a few hundred sequences and
        a few 10^5 tokens/s), so a larger value is a bug or an attack and is dropped at
        the parser, never summed. Example: in_flight 1e12 from one pod is refused."""
        return _PLAUSIBLE_MAX[self]

    @property
    def unit(self) -> str:
        """The unit suffix of metric names ('' for counts and rates)."""
        return "seconds" if self is Signal.P95_LATENCY else ""

    @property
    def metric_name(self) -> str:
        """Its name as an external metric: 'scaler_queue_depth', 'scaler_p95_latency_seconds'."""
        return "_".join(part for part in ("scaler", self.value, self.unit) if part)


_COMBINE: Final = {
    Signal.QUEUE_DEPTH: Combine.SUM,
    Signal.IN_FLIGHT: Combine.SUM,
    Signal.TOKENS_PER_SECOND: Combine.SUM,
    Signal.PROMPT_TOKENS_PER_SECOND: Combine.SUM,
    Signal.ARRIVAL_RATE: Combine.SUM,
    Signal.COMPLETION_RATE: Combine.SUM,
    Signal.P95_LATENCY: Combine.QUANTILE,
    Signal.KV_CACHE_USAGE: Combine.MEAN,
    Signal.GPU_ENGINE_ACTIVE: Combine.MEAN,
    Signal.GPU_SM_ACTIVE: Combine.MEAN,
    Signal.GPU_FB_USED_MIB: Combine.MEAN,
}

_PLAUSIBLE_MAX: Final = {
    Signal.QUEUE_DEPTH: 1e7,               # waiting requests at one gateway or stream
    Signal.IN_FLIGHT: 1e6,                 # running requests (a stream's unacked messages)
    Signal.TOKENS_PER_SECOND: 1e8,         # generated tokens/s
    Signal.PROMPT_TOKENS_PER_SECOND: 1e9,  # prefilled tokens/s
    Signal.ARRIVAL_RATE: 1e7,              # requests/s
    Signal.COMPLETION_RATE: 1e7,           # requests/s
    Signal.P95_LATENCY: 1e6,               # seconds (11 days)
    Signal.KV_CACHE_USAGE: 1.0,            # a fraction
    Signal.GPU_ENGINE_ACTIVE: 1.0,         # a fraction
    Signal.GPU_SM_ACTIVE: 1.0,             # a fraction
    Signal.GPU_FB_USED_MIB: 1e7,           # MiB over a model's GPUs
}

SHARED_QUEUE_SOURCE_PREFIX: Final = "jetstream/"
"""Sources whose `queue_depth` waits in one queue every replica takes from: a JetStream
consumer's pending messages ('jetstream/<stream>/<consumer>'). Replicas started now drain
that queue; a replica's own waiting requests (vLLM's, pushed to it) stay with it."""

DEMAND_SIGNALS: Final = (
    Signal.QUEUE_DEPTH,
    Signal.IN_FLIGHT,
    Signal.TOKENS_PER_SECOND,
    Signal.PROMPT_TOKENS_PER_SECOND,
    Signal.P95_LATENCY,
    Signal.ARRIVAL_RATE,
    Signal.COMPLETION_RATE,
    Signal.KV_CACHE_USAGE,
)
"""The signals the engine reads: exactly the fields of `engine.types.SignalSnapshot`."""

MESSAGE_SIGNALS: Final = (
    Signal.QUEUE_DEPTH,
    Signal.IN_FLIGHT,
    Signal.TOKENS_PER_SECOND,
    Signal.PROMPT_TOKENS_PER_SECOND,
    Signal.COMPLETION_RATE,
    Signal.KV_CACHE_USAGE,
)
"""The numeric top-level fields of a signal message (DESIGN 4.2); latency has its own body."""


class LatencyMetric(enum.StrEnum):
    """Which latency a histogram or p95 measures."""

    TTFT = "ttft"
    """Time to first token: queueing plus prefill."""
    E2E = "e2e"
    """End-to-end request latency."""
    ITL = "itl"
    """Inter-token latency (time per output token)."""


DEFAULT_LATENCY_METRIC: Final = LatencyMetric.TTFT
"""The latency metric of a policy that names none, and of a message that names none."""


class Tier(enum.StrEnum):
    """A model's priority on a shared GPU pool (a ScalePolicy's `spec.tier`), first served
    first: online before batch before dev, guarantees and floors aside."""

    ONLINE = "online"
    """Interactive traffic with a latency SLO."""
    BATCH = "batch"
    """Offline inference: absorbs a shortfall, keeps replicas with unfinished work."""
    DEV = "dev"
    """Experiments and development: gets what is left."""


DEFAULT_TIER: Final = Tier.ONLINE
"""The tier of a policy that names none: a model serves users unless it says otherwise."""


def model_key(namespace: str, name: str) -> str:
    """'namespace/name': how the store, the service and /metrics name a model."""
    return f"{namespace}/{name}"
