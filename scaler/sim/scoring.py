"""Scoring a simulated run: SLO latencies, 60 s windows, and the windows any provisioning meets."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from scaler.sim import cluster as sim_cluster
from scaler.sim import profiles

# DESIGN 4.4: p95 is judged per 60 s window of arrivals that has traffic.
SLO_WINDOW_S = 60.0
# The p95 of a window is numpy's default (linear) percentile of its requests' latencies.
QUANTILE = 0.95
# Latencies within this of the threshold meet it (float noise of the fluid model's times).
EPSILON_S = 1e-9

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def latencies(cluster: sim_cluster.SimCluster, metric: str) -> FloatArray:
    """Per-request latency of the SLO metric (trace requests only, not warm-up); NaN for
    requests that never got there (unfinished, cut by a scale-down even after their first
    token, or rejected at the context limit)."""
    values: FloatArray
    if metric == "e2e":
        values = cluster.done - cluster.arrival
    elif metric == "itl":
        values = (cluster.done - cluster.first_token) / np.maximum(cluster.output_tokens - 1, 1)
    else:
        values = cluster.first_token - cluster.arrival
    return np.where(cluster.interrupted, np.nan, values)[cluster.first:]


def judged(cluster: sim_cluster.SimCluster, metric: str) -> FloatArray:
    """Latencies as the SLO judges them: a request never answered is an infinite miss."""
    values = latencies(cluster, metric)
    return np.where(np.isfinite(values), values, np.inf)


def censored(cluster: sim_cluster.SimCluster, metric: str) -> FloatArray:
    """Finite latencies for plots: an unanswered request counts as waiting until the run
    ended (a lower bound on its true latency: it had not been answered by then)."""
    values = latencies(cluster, metric)
    waited = cluster.time_of_step(cluster.step) - cluster.arrival[cluster.first:]
    return np.where(np.isfinite(values), values, np.maximum(waited, 0.0))


def windows_of(arrival_s: FloatArray) -> IntArray:
    """The 60 s window index of each arrival."""
    return (arrival_s // SLO_WINDOW_S).astype(np.int64)


def p95_within(values: FloatArray, threshold: float) -> bool:
    """Whether the linear-interpolated p95 of `values` is within `threshold`.

    Equal to `np.percentile(values, 95) <= threshold` but exact with infinite values
    (numpy interpolates inf - inf to NaN). With n = 21 values the p95 sits at rank
    0.95 x 20 = 19: the 20th smallest must meet the threshold.
    """
    n = values.size
    if n == 0:
        return True
    rank = QUANTILE * (n - 1)
    lo = math.floor(rank)
    frac = rank - lo
    ordered = np.partition(values, (lo, min(lo + 1, n - 1)))
    low, high = float(ordered[lo]), float(ordered[min(lo + 1, n - 1)])
    limit = threshold + EPSILON_S
    if low > limit:
        return False
    if frac == 0.0 or high <= limit:
        return True
    return low + frac * (high - low) <= limit


def misses_failing(n: int) -> int:
    """The fewest misses that fail a window of n requests, whatever their values.

    The p95 interpolates between the values at ranks lo = floor(0.95 (n-1)) and lo + 1
    (0-based, ascending): once n - lo requests miss, the value at rank lo misses too.
    n = 100: lo = 94, so 6 misses fail the window.
    """
    return n - math.floor(QUANTILE * (n - 1))


def misses_harmless(n: int) -> int:
    """The most misses a window of n requests can have and meet, whatever their values.

    Both interpolated ranks must meet, or only rank lo when it is exact: n = 100 (rank
    94.05) tolerates 4 misses; n = 21 (rank 19.0 exactly) tolerates 1.
    """
    rank = QUANTILE * (n - 1)
    exact = rank == math.floor(rank)
    return max(0, misses_failing(n) - (1 if exact else 2))


def window_met(judged_s: FloatArray, windows: IntArray, threshold: float) -> dict[int, bool]:
    """Per window with traffic: is its p95 within the threshold?"""
    order = np.argsort(windows, kind="stable")
    splits = np.flatnonzero(np.diff(windows[order])) + 1
    return {int(windows[idx[0]]): p95_within(judged_s[idx], threshold)
            for idx in np.split(order, splits) if idx.size}


def floor_latencies(
    *, profile: profiles.ReplicaProfile, arrival_s: FloatArray, input_tokens: FloatArray,
    output_tokens: FloatArray, metric: str, dt: float,
) -> FloatArray:
    """The best latency each request can get: alone on an idle ready replica.

    From the replica model of `cluster._serve`: alone, a prompt is prefilled in chunks of
    C = maxBatchedTokens tokens, each iteration taking a + C / prefill_rate, so TTFT =
    I x (a / C + 1 / prefill_rate) after the request reaches the replica at the next step
    boundary (arrivals are routed every dt); each later token takes a + b. 8B profile,
    a 60,000-token prompt: 60,000 x (8 ms / 8,192 + 1 / 25,000) = 2.46 s: over a 2 s TTFT
    SLO on any provisioning.
    """
    a = profile.decode_step.base_seconds
    b = profile.decode_step.per_sequence_seconds
    chunk = float(profile.max_batched_tokens)
    routed = np.ceil(arrival_s / dt - 1e-9) * dt - arrival_s
    prompt = np.maximum(input_tokens, 1.0)
    decode_steps = np.maximum(output_tokens, 1.0) - 1.0
    ttft = np.maximum(routed, 0.0) + prompt * (a / chunk + 1.0 / profile.prefill_tokens_per_second)
    if metric == "e2e":
        result: FloatArray = ttft + decode_steps * (a + b)
        return result
    if metric == "itl":
        return np.where(decode_steps > 0, a + b, 0.0)
    return ttft


def feasible_windows(
    *, profile: profiles.ReplicaProfile, arrival_s: FloatArray, input_tokens: FloatArray,
    output_tokens: FloatArray, metric: str, threshold: float, dt: float,
) -> set[int]:
    """Windows whose floor (every request alone on an idle replica) meets the SLO's p95."""
    floors = floor_latencies(profile=profile, arrival_s=arrival_s, input_tokens=input_tokens,
                             output_tokens=output_tokens, metric=metric, dt=dt)
    met = window_met(floors, windows_of(arrival_s), threshold)
    return {w for w, ok in met.items() if ok}
