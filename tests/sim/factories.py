"""Synthetic traces for simulator tests: Poisson arrivals with fixed token lengths."""

from __future__ import annotations

import numpy as np

from scaler.sim import traces


def synthetic_trace(
    *, rate: float, duration_s: float, input_tokens: int, output_tokens: int, seed: int = 0,
    start_s: float = 0.0,
) -> traces.Trace:
    """Poisson arrivals at `rate` req/s with fixed lengths, starting at `start_s`."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * duration_s * 1.2) + 10)
    arrival = np.cumsum(gaps)
    arrival = arrival[arrival < duration_s] + start_s
    arrival = np.concatenate(([0.0], arrival)) if start_s > 0 else arrival - arrival[0]
    n = arrival.size
    return traces.Trace("synthetic", arrival, np.full(n, input_tokens, dtype=np.int64),
                        np.full(n, output_tokens, dtype=np.int64))


def step_trace(*, segments: list[tuple[float, float]], input_tokens: int, output_tokens: int,
               seed: int = 0) -> traces.Trace:
    """Poisson arrivals whose rate changes by segment: [(seconds, req/s), ...]."""
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    start = 0.0
    for seconds, rate in segments:
        count = rng.poisson(rate * seconds)
        times.append(np.sort(rng.uniform(start, start + seconds, count)))
        start += seconds
    arrival = np.concatenate([np.zeros(1), *times])
    n = arrival.size
    return traces.Trace("step", arrival, np.full(n, input_tokens, dtype=np.int64),
                        np.full(n, output_tokens, dtype=np.int64))
