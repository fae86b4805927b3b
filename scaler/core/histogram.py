"""Cumulative latency histograms (Prometheus style): quantiles, bucket bounds, merging."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

VLLM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
"""vLLM's bucket bounds for vllm:time_to_first_token_seconds (seconds)."""


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

    def share_within(self, threshold: float) -> tuple[float, float] | None:
        """Bounds on the share of observations <= `threshold`, from bucket edges alone.

        No interpolation: (low, high) where low is the share at the largest edge at or
        below the threshold (certainly within) and high the share at the smallest edge at
        or above it (at most this many within). They are equal when the threshold is an
        edge. None when the histogram is empty. Example: vLLM's TTFT buckets (..., 1.0,
        2.5, ...), a 2 s SLO, 90 of 100 under 1 s and 97 under 2.5 s: (0.90, 0.97), so a
        p95 within 2 s can neither be confirmed nor ruled out; linear interpolation would
        have read p95 = 1 + 1.5 x 5/7 = 2.07 s, a violation the data does not show.
        """
        total = self.total
        if total <= 0 or not self.le:
            return None
        below = 0.0
        for upper, cumulative in zip(self.le, self.counts, strict=True):
            if upper == threshold:
                return cumulative / total, cumulative / total
            if upper > threshold:
                return below / total, cumulative / total
            below = cumulative
        return 1.0, 1.0

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
