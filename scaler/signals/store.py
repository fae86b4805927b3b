"""The signal store: per model and signal, per-source latest values, windows and snapshots."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from scaler.engine import types
from scaler.signals import base

log = logging.getLogger(__name__)

Listener = Callable[[str], None]
"""Called with a model key ('inference/llama-70b') after samples for it were stored."""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Memory and freshness bounds of the store.

    ttl_s: a source's latest value is deleted this long after its timestamp (300 s:
      long past any policy's staleAfterSeconds, so a replica that went away stops
      costing memory; stale values are kept until then so `snapshot` can report their age).
    window_s / resolution_s: the history kept per model and signal, one point per
      resolution step: 600 s at 1 s is at most 601 points x 16 bytes ~ 10 KiB per signal.
    window_fresh_s: sources older than this are left out of the combined value recorded
      in the window (30 s, the policies' default staleAfterSeconds).
    max_sources: sources kept per model and signal (oldest evicted first): 4096 replicas
      of one model is well past any real deployment and bounds a misbehaving publisher
      that invents a new `source` per message.
    quantile: the latency quantile computed from merged histograms (0.95 -> p95).
    """

    ttl_s: float = 300.0
    window_s: float = 600.0
    resolution_s: float = 1.0
    window_fresh_s: float = 30.0
    max_sources: int = 4096
    quantile: float = 0.95


@dataclass(frozen=True, slots=True)
class Combined:
    """A signal's value combined over sources, with the newest timestamp that contributed."""

    value: float
    newest_ts: float
    sources: int


@dataclass(slots=True)
class _Series:
    """One model's one signal: latest sample per source plus the time-keyed window."""

    latest: dict[str, base.Sample] = field(default_factory=dict)
    window: deque[tuple[float, float]] = field(default_factory=deque)
    open_bucket: float | None = None


def combine(
    signal: str,
    samples: Iterable[base.Sample],
    *,
    quantile: float = 0.95,
) -> Combined | None:
    """Combine the samples of one signal from several sources (a pure function).

    queue_depth, in_flight, tokens_per_second, arrival_rate: summed (each replica reports
    its own queue). Latency: histograms merged (`base.merge_histograms`) and the quantile
    taken from the merge, because percentiles cannot be averaged; sources that send only
    a p95 contribute by max (a guard should err high). Other gauges (KV-cache usage, GPU
    activity): the mean over sources. None when no sample has a value.
    """
    valued = [s for s in samples if not s.missing]
    if not valued:
        return None
    newest = max(s.ts for s in valued)
    if signal.startswith("latency."):
        histograms = [s.histogram for s in valued if s.histogram is not None]
        p95_only = [s.value for s in valued if s.histogram is None and s.value is not None]
        candidates: list[float] = list(p95_only)
        merged = base.merge_histograms(histograms)
        if merged is not None:
            from_histogram = merged.quantile(quantile)
            if from_histogram is not None:
                candidates.append(from_histogram)
        if not candidates:
            return None
        return Combined(max(candidates), newest, len(valued))
    values = [s.value for s in valued if s.value is not None]
    if not values:
        return None
    if signal in base.SUMMED_SIGNALS:
        return Combined(math.fsum(values), newest, len(values))
    return Combined(math.fsum(values) / len(values), newest, len(values))


class SignalStore:
    """Latest values per model, signal and source; windows for history and trend.

    Not thread-safe: it lives on the event loop with the sources that feed it.
    """

    def __init__(self, *, limits: StoreLimits = StoreLimits()) -> None:
        self.limits = limits
        self._models: dict[str, dict[str, _Series]] = {}
        self._listeners: list[Listener] = []
        # At most window_s / resolution_s points, plus the open bucket.
        self._window_points = int(math.ceil(limits.window_s / limits.resolution_s)) + 1

    # -- writing ------------------------------------------------------------------------

    def put(self, samples: Sequence[base.Sample]) -> None:
        """Store samples, then tell listeners once per model that got one."""
        # The hot path of ingestion (50,000 messages/s): locals, no per-sample allocation
        # beyond the series a new model or signal needs.
        models = self._models
        touched: list[str] = []
        last: str | None = None
        for sample in samples:
            key = sample.model
            series_by_signal = models.get(key)
            if series_by_signal is None:
                series_by_signal = models[key] = {}
            series = series_by_signal.get(sample.signal)
            if series is None:
                series = series_by_signal[sample.signal] = _Series()
            self._record(sample, series)
            if key != last:
                touched.append(key)
                last = key
        if not self._listeners:
            return
        for key in touched if len(touched) == 1 else dict.fromkeys(touched):
            self._notify(key)

    def _record(self, sample: base.Sample, series: _Series) -> None:
        previous = series.latest.get(sample.source)
        if previous is not None and previous.ts > sample.ts:
            return  # out of order: the newer value from this source stands
        bucket = math.floor(sample.ts / self.limits.resolution_s) * self.limits.resolution_s
        if series.open_bucket is None:
            series.open_bucket = bucket
        elif bucket > series.open_bucket:
            # Close the previous bucket with the value as it stood at its end.
            self._close_bucket(sample.signal, series)
            series.open_bucket = bucket
        if sample.missing:
            series.latest.pop(sample.source, None)
            return
        series.latest[sample.source] = sample
        if len(series.latest) > self.limits.max_sources:
            oldest = min(series.latest.values(), key=lambda s: s.ts)
            del series.latest[oldest.source]

    def _close_bucket(self, signal: str, series: _Series) -> None:
        bucket = series.open_bucket
        if bucket is None:
            return
        end = bucket + self.limits.resolution_s
        combined = self._combine_fresh(signal, series, now=end, fresh_s=self.limits.window_fresh_s)
        if combined is None:
            return
        window = series.window
        window.append((bucket, combined.value))
        horizon = end - self.limits.window_s
        while window and (window[0][0] < horizon or len(window) > self._window_points):
            window.popleft()

    def _combine_fresh(
        self, signal: str, series: _Series, *, now: float, fresh_s: float
    ) -> Combined | None:
        fresh = [s for s in series.latest.values() if now - s.ts <= fresh_s and s.ts <= now]
        return combine(signal, fresh, quantile=self.limits.quantile)

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
        self, model: str, signal: str, *, now: float, stale_after_s: float
    ) -> types.SignalValue | None:
        """One signal combined over the sources fresh at `now`, with its age.

        When no source is fresh but some are retained (younger than ttl_s), the value
        combines the sources within `stale_after_s` of the newest one, and its age_s is
        above stale_after_s: the engine sees a stale value (hold) rather than none.
        """
        series = self._models.get(model, {}).get(signal)
        if series is None:
            return None
        self._expire_series(series, now)
        combined = self._combine_fresh(signal, series, now=now, fresh_s=stale_after_s)
        if combined is None:
            retained = [s for s in series.latest.values() if not s.missing]
            if not retained:
                return None
            newest = max(s.ts for s in retained)
            combined = combine(
                signal,
                [s for s in retained if s.ts >= newest - stale_after_s],
                quantile=self.limits.quantile,
            )
            if combined is None:
                return None
        return types.SignalValue(
            value=combined.value,
            age_s=max(0.0, now - combined.newest_ts),
            sources=combined.sources,
        )

    def snapshot(
        self, model: str, *, now: float, stale_after_s: float, latency_metric: str = "ttft"
    ) -> types.SignalSnapshot:
        """What the engine sees for `model` at `now`: each value with its age."""

        def get(signal: str) -> types.SignalValue | None:
            return self.value(model, signal, now=now, stale_after_s=stale_after_s)

        return types.SignalSnapshot(
            queue_depth=get(base.QUEUE_DEPTH),
            in_flight=get(base.IN_FLIGHT),
            tokens_per_second=get(base.TOKENS_PER_SECOND),
            prompt_tokens_per_second=get(base.PROMPT_TOKENS_PER_SECOND),
            p95_latency_s=get(base.latency_signal(latency_metric)),
            arrival_rate=get(base.ARRIVAL_RATE),
        )

    def history(self, model: str, signal: str) -> tuple[tuple[float, float], ...]:
        """(bucket start, combined value) points, oldest first, open bucket included."""
        series = self._models.get(model, {}).get(signal)
        if series is None:
            return ()
        points = list(series.window)
        if series.open_bucket is not None:
            end = series.open_bucket + self.limits.resolution_s
            current = self._combine_fresh(
                signal, series, now=end, fresh_s=self.limits.window_fresh_s
            )
            if current is not None:
                points.append((series.open_bucket, current.value))
        return tuple(points)

    def trend(self, model: str, signal: str, *, now: float, window_s: float) -> float | None:
        """Least-squares slope of the signal over the last `window_s`, in units per second.

        Example: queue depth 10, 12, 14 at t = 0, 1, 2 s -> 2.0 per second. None with
        fewer than two points.
        """
        points = [(t, v) for t, v in self.history(model, signal) if t >= now - window_s]
        return slope(points)

    # -- housekeeping -------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Delete values older than ttl_s and models left with nothing (the backstop tick)."""
        for key in tuple(self._models):
            series_by_signal = self._models[key]
            for signal in tuple(series_by_signal):
                series = series_by_signal[signal]
                self._expire_series(series, now)
                if not series.latest and not series.window:
                    del series_by_signal[signal]
            if not series_by_signal:
                del self._models[key]

    def _expire_series(self, series: _Series, now: float) -> None:
        cutoff = now - self.limits.ttl_s
        old = [source for source, s in series.latest.items() if s.ts < cutoff]
        for source in old:
            del series.latest[source]
        horizon = now - self.limits.window_s
        while series.window and series.window[0][0] < horizon:
            series.window.popleft()

    def forget(self, model: str) -> None:
        """Drop everything about a model (its policy was deleted)."""
        self._models.pop(model, None)


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) points; None below two distinct times."""
    if len(points) < 2:
        return None
    mean_t = math.fsum(t for t, _ in points) / len(points)
    mean_v = math.fsum(v for _, v in points) / len(points)
    spread = math.fsum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return math.fsum((t - mean_t) * (v - mean_v) for t, v in points) / spread
