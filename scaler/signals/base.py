"""What every signal source shares: the Sample, the sink it writes to, the source protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar, runtime_checkable

# Signal names a Sample may carry. The first three are summed across sources by the store;
# latency histograms are merged; the rest are per-source gauges kept for /metrics and cost.
QUEUE_DEPTH: Final = "queue_depth"
IN_FLIGHT: Final = "in_flight"
TOKENS_PER_SECOND: Final = "tokens_per_second"
PROMPT_TOKENS_PER_SECOND: Final = "prompt_tokens_per_second"
ARRIVAL_RATE: Final = "arrival_rate"
KV_CACHE_USAGE: Final = "kv_cache_usage"
GPU_ENGINE_ACTIVE: Final = "gpu_engine_active"
GPU_SM_ACTIVE: Final = "gpu_sm_active"
GPU_FB_USED_MIB: Final = "gpu_fb_used_mib"

SUMMED_SIGNALS: Final = frozenset(
    {QUEUE_DEPTH, IN_FLIGHT, TOKENS_PER_SECOND, PROMPT_TOKENS_PER_SECOND, ARRIVAL_RATE}
)
GAUGE_SIGNALS: Final = frozenset(
    {KV_CACHE_USAGE, GPU_ENGINE_ACTIVE, GPU_SM_ACTIVE, GPU_FB_USED_MIB}
)

_Target = TypeVar("_Target", bound=Hashable)

Clock = Callable[[], float]
"""Wall clock in epoch seconds. Sources take one so tests can pin time."""


def wall_clock() -> float:
    """The default clock: epoch seconds (message `ts` fields are epoch seconds too)."""
    return time.time()


def latency_signal(metric: str) -> str:
    """The store's signal name for a latency metric: 'ttft' -> 'latency.ttft'."""
    return f"latency.{metric}"


def model_key(namespace: str, name: str) -> str:
    """'namespace/name': how the store, the service and /metrics name a model."""
    return f"{namespace}/{name}"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative latency histogram (Prometheus style) with finite upper bounds.

    `counts[i]` is the number of observations <= `le[i]`; the total is `counts[-1]`
    (observations above the last bound are not represented).
    """

    le: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def cumulative_at(self, bound: float) -> float:
        """Observations <= `bound`, interpolating linearly inside a bucket.

        The same assumption histogram_quantile makes: observations are spread evenly
        within a bucket, and the first bucket starts at 0. Above the last bound the
        count stays at the total. Example: le=(1, 2), counts=(10, 30): at 1.5 -> 20.
        """
        lower, below = 0.0, 0.0
        for upper, cumulative in zip(self.le, self.counts, strict=True):
            if bound <= upper:
                if bound <= lower or upper <= lower:
                    return below if bound < upper else cumulative
                return below + (cumulative - below) * (bound - lower) / (upper - lower)
            lower, below = upper, cumulative
        return self.total

    def quantile(self, q: float) -> float | None:
        """The q-quantile by linear interpolation within its bucket (histogram_quantile).

        None when the histogram is empty. Worked example: le=(0.5, 1, 2.5),
        counts=(40, 80, 100), q=0.95: rank 95 falls in (1, 2.5] holding 20 observations,
        15 of them below the rank, so 1 + 1.5 * 15/20 = 2.125 s.
        """
        total = self.total
        if total <= 0 or not self.le:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for upper, cumulative in zip(self.le, self.counts, strict=True):
            if cumulative >= rank:
                in_bucket = cumulative - below
                if in_bucket <= 0 or upper <= lower:
                    return upper
                return lower + (upper - lower) * (rank - below) / in_bucket
            lower, below = upper, cumulative
        return self.le[-1]


def merge_histograms(histograms: Sequence[Histogram]) -> Histogram | None:
    """Merge cumulative histograms from several replicas into one.

    Identical bounds: bucket counts are summed. Different bounds: every histogram is
    evaluated at the union of all bounds with `cumulative_at` (linear inside a bucket),
    then summed. Under the linear-in-bucket assumption that histogram_quantile already
    makes, this is exact: a sum of piecewise-linear CDFs is piecewise linear with
    breaks at the union of the bounds. Example: (le 1, 2; counts 10, 20) merged with
    (le 2, 4; counts 4, 8) -> le (1, 2, 4), counts (10+2, 20+4, 20+8) = (12, 24, 28).
    """
    if not histograms:
        return None
    first = histograms[0]
    if all(h.le == first.le for h in histograms):
        counts = [0.0] * len(first.le)
        for histogram in histograms:
            for index, count in enumerate(histogram.counts):
                counts[index] += count
        return Histogram(le=first.le, counts=tuple(counts))
    bounds = tuple(sorted({bound for h in histograms for bound in h.le}))
    merged = tuple(sum(h.cumulative_at(bound) for h in histograms) for bound in bounds)
    return Histogram(le=bounds, counts=merged)


@dataclass(frozen=True, slots=True)
class Sample:
    """One signal's value for one model from one source, at `ts` (epoch seconds).

    `value` None means the source looked and found nothing (an empty Prometheus
    result, NaN or Inf): the store forgets that source's earlier value, so missing
    data is never read as zero. Latency samples carry a `histogram`, a `value`
    (a p95 computed upstream), or both.
    """

    model: str
    signal: str
    source: str
    ts: float
    value: float | None = None
    histogram: Histogram | None = None

    @property
    def missing(self) -> bool:
        return self.value is None and self.histogram is None


class SampleSink(Protocol):
    """Where sources put samples: the signal store, or a list in tests."""

    def put(self, samples: Sequence[Sample]) -> None:
        """Record samples; must not block (it runs on the event loop)."""
        ...


@runtime_checkable
class SignalSource(Protocol):
    """A signal source: reads one kind of input and emits samples; decides nothing.

    `run` works until cancelled: transient failures (lost connections, timeouts,
    errors from the backend) are counted and retried, never raised. Cancelling the
    task stops it and releases its connections.
    """

    @property
    def name(self) -> str: ...

    async def run(self, sink: SampleSink) -> None: ...


@dataclass(slots=True)
class SourceStats:
    """Runtime counters of one source (mutable on purpose: the service exports them).

    accepted: messages (or polls) that were accepted; dropped: messages refused, by
    reason; errors: failed polls or connection errors, by kind; reconnects: NATS
    reconnections.
    """

    accepted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class PollSchedule(Generic[_Target]):
    """When each polled target is due next, on the event loop's clock (seconds).

    Shared by the polling sources (JetStream, Prometheus): a target is polled at once
    when first seen, then every `interval`; targets no longer configured are forgotten.
    """

    def __init__(self) -> None:
        self._due: dict[_Target, float] = {}

    def take_due(self, targets: Sequence[tuple[_Target, float]], now: float) -> list[_Target]:
        """The targets due at `now` (target, interval pairs); each is rescheduled."""
        wanted = {target for target, _ in targets}
        for gone in [t for t in self._due if t not in wanted]:
            del self._due[gone]
        due: list[_Target] = []
        for target, interval in targets:
            if self._due.setdefault(target, now) <= now:
                self._due[target] = now + interval
                due.append(target)
        return due

    def wait_s(self, now: float, *, idle_s: float = 3600.0) -> float:
        """Seconds until the next target is due (idle_s when there is none)."""
        return max(0.0, min((due - now for due in self._due.values()), default=idle_s))


class Poller(Generic[_Target]):
    """The loop of a polling source: poll what is due, sleep until the next is due.

    `wake()` (after a config update) re-reads the targets at once, so a new target is
    polled immediately and a removed one is no longer waited for.
    """

    def __init__(self) -> None:
        self._schedule: PollSchedule[_Target] = PollSchedule()
        self._changed = asyncio.Event()

    def wake(self) -> None:
        self._changed.set()

    async def run(
        self,
        targets: Callable[[], Sequence[tuple[_Target, float]]],
        poll_due: Callable[[list[_Target]], Awaitable[None]],
    ) -> None:
        """Until cancelled: `targets()` gives (target, interval s) pairs; `poll_due`
        polls the due ones and must not raise."""
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            due = self._schedule.take_due(targets(), loop.time())
            if due:
                await poll_due(due)
            wait = self._schedule.wait_s(loop.time())
            if wait > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=wait)
                except TimeoutError:
                    pass
