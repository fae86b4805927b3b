"""The signal store: per model and signal, the latest sample of each source, and snapshots."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from scaler.core import histogram, vocabulary
from scaler.engine import types
from scaler.signals import samples

log = logging.getLogger(__name__)

Listener = Callable[[str], None]
"""Called with a model key ('inference/llama-70b') after samples for it were stored."""

SeriesKey = tuple[vocabulary.Signal, vocabulary.LatencyMetric | None]
"""A signal, and for latency the metric it measures: (P95_LATENCY, TTFT)."""

SOURCES_FULL = "sources_full"
"""Refusal reason: a new source for a model whose series already holds `max_sources`."""

_SNAPSHOT_SERIES: dict[vocabulary.LatencyMetric,
                       tuple[tuple[vocabulary.Signal, str, SeriesKey], ...]] = {
    metric: tuple((signal, signal.value,
                   (signal, metric if signal is vocabulary.Signal.P95_LATENCY else None))
                  for signal in vocabulary.DEMAND_SIGNALS)
    for metric in vocabulary.LatencyMetric}
"""Per latency metric, each demand signal, its `SignalSnapshot` field (named by its value,
`vocabulary.DEMAND_SIGNALS`) and the series a snapshot reads it from (latency from its
metric's series), built once rather than per snapshot."""

_QUEUE_SERIES: SeriesKey = (vocabulary.Signal.QUEUE_DEPTH, None)
_SHARED = vocabulary.SHARED_QUEUE_SOURCE_PREFIX


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Memory bounds of the store.

    ttl_s: a source's latest value is deleted this long after its timestamp (300 s: long
      past the policies' staleAfterSeconds, so a replica that went away stops costing
      memory; stale values are kept until then so `snapshot` can report their age). The
      service raises it to twice the largest staleAfterSeconds in force.
    max_sources: sources kept per model and signal: 4,096 replicas of one model is well
      past any real deployment. When full, a *new* source is refused (and counted), never
      a known one evicted: a publisher inventing a `source` per message must not push out
      the real replicas' reports.
    quantile: the latency quantile computed from merged histograms (0.95 -> p95).
    """

    ttl_s: float = 300.0
    max_sources: int = 4096
    quantile: float = 0.95


def combine(
    signal: vocabulary.Signal,
    values: Iterable[samples.Sample],
    *,
    now: float,
    stale_after_s: float,
    quantile: float = 0.95,
) -> types.SignalValue | None:
    """Combine one signal's samples from several sources into the value the engine reads.

    How is the signal's `Combine` rule: summed (each replica reports its own queue), the
    quantile of merged histograms (`histogram.merge_histograms`; sources that send only
    a p95 contribute by max, a guard should err high), or the mean. The age is that of
    the newest contributing sample; freshness is decided here, once. None when no sample
    has a value.
    """
    # One pass over the samples (four series a snapshot, one snapshot an evaluation), not
    # a list per step; `Sample.missing` spelled out (a property call a sample).
    quantile_rule = signal.combine is vocabulary.Combine.QUANTILE
    valued = 0
    newest = -math.inf
    numbers: list[float] = []  # latency: the values of p95-only sources; else every value
    shapes: list[histogram.Histogram] = []  # latency: the histograms
    for sample in values:
        value, shape = sample.value, sample.histogram
        if value is None and shape is None:
            continue
        valued += 1
        if sample.ts > newest:
            newest = sample.ts
        if quantile_rule and shape is not None:
            shapes.append(shape)
        elif value is not None:
            numbers.append(value)
    if not valued:
        return None
    combined: float
    merged: histogram.Histogram | None = None
    if quantile_rule:
        merged = histogram.merge_histograms(shapes)
        from_histogram = None if merged is None else merged.quantile(quantile)
        if from_histogram is None:
            merged = None
        elif numbers and max(numbers) > from_histogram:
            merged = None  # a p95-only source is worse: the buckets do not tell its story
        candidates = numbers + ([] if from_histogram is None else [from_histogram])
        if not candidates:
            return None
        combined = max(candidates)
    else:
        if not numbers:
            return None
        combined = math.fsum(numbers)
        if signal.combine is vocabulary.Combine.MEAN:
            combined /= len(numbers)
    return types.SignalValue.assess(combined, age_s=max(0.0, now - newest),
                                    stale_after_s=stale_after_s, sources=valued,
                                    histogram=merged)


class SignalStore:
    """Latest values per model, signal and source.

    Not thread-safe: it lives on the event loop with the sources that feed it.
    `refused` counts samples refused by reason (`SOURCES_FULL`).
    """

    def __init__(self, *, limits: StoreLimits = StoreLimits()) -> None:
        self.limits = limits
        self._models: dict[str, dict[SeriesKey, dict[str, samples.Sample]]] = {}
        self._listeners: list[Listener] = []
        self.refused: dict[str, int] = {}

    # -- writing ------------------------------------------------------------------------

    def put(self, batch: Sequence[samples.Sample]) -> None:
        """Store samples, then tell listeners once per model that got one."""
        # The hot path of ingestion (50,000 messages/s): locals, no per-sample allocation
        # beyond the series a new model or signal needs.
        models = self._models
        touched: list[str] = []
        last: str | None = None
        for sample in batch:
            key = sample.model
            series_by_signal = models.get(key)
            if series_by_signal is None:
                series_by_signal = models[key] = {}
            series_key = (sample.signal, sample.metric)
            latest = series_by_signal.get(series_key)
            if latest is None:
                latest = series_by_signal[series_key] = {}
            self._record(sample, latest)
            if key != last:
                touched.append(key)
                last = key
        if not self._listeners:
            return
        for key in touched if len(touched) == 1 else dict.fromkeys(touched):
            self._notify(key)

    def _record(self, sample: samples.Sample, latest: dict[str, samples.Sample]) -> None:
        previous = latest.get(sample.source)
        if previous is not None and previous.ts > sample.ts:
            return  # out of order: the newer value from this source stands
        if sample.missing:
            latest.pop(sample.source, None)
            return
        if previous is None and len(latest) >= self.limits.max_sources:
            # Make room only from sources past their TTL, then refuse the newcomer.
            self._expire_sources(latest, sample.ts)
            if len(latest) >= self.limits.max_sources:
                self.refused[SOURCES_FULL] = self.refused.get(SOURCES_FULL, 0) + 1
                return
        latest[sample.source] = sample

    # -- listening ----------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(model_key)` after each put that touched the model.

        Returns a function that removes the listener. Listeners run synchronously in
        `put`: they should only schedule work (set an event, mark a model dirty); the
        reactor coalesces bursts.
        """
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def _notify(self, key: str) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(key)
            except Exception:  # a listener's bug must not stop ingestion
                log.exception("signal store listener failed for %s", key)

    # -- reading ------------------------------------------------------------------------

    def models(self) -> tuple[str, ...]:
        return tuple(self._models)

    def value(
        self,
        model: str,
        signal: vocabulary.Signal,
        *,
        now: float,
        stale_after_s: float,
        metric: vocabulary.LatencyMetric | None = None,
    ) -> types.SignalValue | None:
        """One signal combined over the sources fresh at `now`, with its age.

        When no source is fresh but some are retained (younger than ttl_s), the value
        combines the sources within `stale_after_s` of the newest one and is marked stale:
        the engine sees a stale value (hold) rather than none.
        """
        latest = self._models.get(model, {}).get((signal, metric))
        return self._combined(signal, latest, now=now, stale_after_s=stale_after_s)

    def _combined(self, signal: vocabulary.Signal, latest: dict[str, samples.Sample] | None,
                  *, now: float, stale_after_s: float) -> types.SignalValue | None:
        """`value` of one series (its latest sample by source), None when never stored."""
        if latest is None:
            return None
        # One pass finds the fresh samples and whether any is past its TTL (rarely: the
        # expiry then runs), seven series a snapshot, one snapshot an evaluation.
        cutoff = now - self.limits.ttl_s
        fresh = []
        expired = False
        for sample in latest.values():
            ts = sample.ts
            if ts < cutoff:
                expired = True
            elif now - ts <= stale_after_s and ts <= now:
                fresh.append(sample)
        if expired:
            self._expire_sources(latest, now)
        quantile = self.limits.quantile
        value = combine(signal, fresh, now=now, stale_after_s=stale_after_s, quantile=quantile)
        if value is not None or not latest:
            return value
        newest = max(s.ts for s in latest.values())
        return combine(signal, [s for s in latest.values() if s.ts >= newest - stale_after_s],
                       now=now, stale_after_s=stale_after_s, quantile=quantile)

    def per_source(self, model: str, signal: vocabulary.Signal, *, now: float,
                   stale_after_s: float) -> dict[str, float]:
        """Each source's own value of one signal, fresh at `now` (within `stale_after_s`).

        What `value` combines, before combining: with DESIGN 4.2's `source` the replica's
        pod name, this is each replica's queue or in-flight count (the work a scale-down
        would cut). Stale sources are left out: their work is not known.
        """
        latest = self._models.get(model, {}).get((signal, None))
        if latest is None:
            return {}
        return {source: s.value for source, s in latest.items()
                if s.value is not None and 0 <= now - s.ts <= stale_after_s}

    def snapshot(
        self,
        model: str,
        *,
        now: float,
        stale_after_s: float,
        latency_metric: vocabulary.LatencyMetric = vocabulary.DEFAULT_LATENCY_METRIC,
        shared_sources: Collection[str] = (),
    ) -> types.SignalSnapshot:
        """What the engine sees for `model` at `now`: each demand signal with its age.

        `shared_waiting` is the part of queue_depth that waits in one queue every replica
        takes from: fresh sources under `vocabulary.SHARED_QUEUE_SOURCE_PREFIX` (a
        JetStream consumer) and those in `shared_sources` (a policy's
        `sharedQueueSources`, as `messages.shared_queue_keys` spells them).
        """
        # The model's series looked up once, and only the series it has combined (four of
        # eight in bench/fleet_scale.py: one snapshot an evaluation, 10,000 a cycle); an
        # empty series combines to None, the snapshot's default.
        series = self._models.get(model)
        if series is None:
            return types.SignalSnapshot()  # nothing stored: every signal missing
        values: dict[str, types.SignalValue] = {}
        for signal, name, series_key in _SNAPSHOT_SERIES[latency_metric]:
            latest = series.get(series_key)
            if latest:
                value = self._combined(signal, latest, now=now, stale_after_s=stale_after_s)
                if value is not None:
                    values[name] = value
        queue = series.get(_QUEUE_SERIES)
        if queue and "queue_depth" in values:
            shared = [s for source, s in queue.items()
                      if (source.startswith(_SHARED) or source in shared_sources)
                      and s.value is not None and 0 <= now - s.ts <= stale_after_s]
            value = combine(vocabulary.Signal.QUEUE_DEPTH, shared, now=now,
                            stale_after_s=stale_after_s) if shared else None
            if value is not None:
                values["shared_waiting"] = value
        return types.SignalSnapshot(**values)

    # -- housekeeping -------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Delete values older than ttl_s and models left with nothing (the backstop tick)."""
        for key in tuple(self._models):
            series_by_signal = self._models[key]
            for series_key in tuple(series_by_signal):
                latest = series_by_signal[series_key]
                self._expire_sources(latest, now)
                if not latest:
                    del series_by_signal[series_key]
            if not series_by_signal:
                del self._models[key]

    def _expire_sources(self, latest: dict[str, samples.Sample], now: float) -> None:
        cutoff = now - self.limits.ttl_s
        for source in [source for source, s in latest.items() if s.ts < cutoff]:
            del latest[source]

    def forget(self, model: str) -> None:
        """Drop everything about a model (its policy was deleted)."""
        self._models.pop(model, None)
