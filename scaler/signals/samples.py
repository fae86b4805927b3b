"""What sources emit: timestamped samples, the sink they go to, and a source's counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scaler.core import histogram as histograms
from scaler.core import vocabulary

Clock = Callable[[], float]
"""Wall clock in epoch seconds. Sources take one so tests can pin time."""


def wall_clock() -> float:
    """The default clock: epoch seconds (message `ts` fields are epoch seconds too)."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Sample:
    """One signal's value for one model from one source, at `ts` (epoch seconds).

    `value` None means the source looked and found nothing (an empty Prometheus
    result, NaN or Inf): the store forgets that source's earlier value, so missing
    data is never read as zero. Latency samples (`Signal.P95_LATENCY`) name their
    `metric` and carry a `histogram`, a `value` (a p95 computed upstream), or both.
    """

    model: str
    signal: vocabulary.Signal
    source: str
    ts: float
    value: float | None = None
    histogram: histograms.Histogram | None = None
    metric: vocabulary.LatencyMetric | None = None

    @property
    def missing(self) -> bool:
        return self.value is None and self.histogram is None


class SampleSink(Protocol):
    """Where sources put samples: the signal store, or a list in tests."""

    def put(self, samples: Sequence[Sample]) -> None:
        """Record samples; must not block (it runs on the event loop)."""
        ...


@dataclass(slots=True)
class SourceStats:
    """Runtime counters of one source (mutable on purpose: the service exports them).

    accepted: messages (or polls) that were accepted; dropped: messages refused, by
    reason; errors: failed polls or connection errors, by kind; reconnects: NATS
    reconnections; connected: whether the source's NATS connection is up now (None for a
    source that holds no connection); failing: targets (model keys, consumers) whose
    latest poll failed.
    """

    accepted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    connected: bool | None = None
    failing: set[str] = field(default_factory=set)

    @property
    def up(self) -> bool:
        """Connected (if it holds a connection) and no target's latest poll failed."""
        return self.connected is not False and not self.failing

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())
