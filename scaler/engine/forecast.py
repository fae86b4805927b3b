"""Cold-start look-ahead (DESIGN 3.2): time to ready, learned start times, demand trend."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.engine import types
from scaler.policy import model

# Weight of a new observation in the learned start time (exponential smoothing):
# 0.3 means about the last 3 observations dominate, so one slow pull does not
# double the look-ahead but a persistent change is learned within 5 to 6 starts.
LEARN_WEIGHT = 0.3

# Standard errors taken off the fitted slope before it is extrapolated (about a 98 %
# one-sided bound for a straight line through many points).
TREND_CONFIDENCE = 2.0



@dataclass(frozen=True, slots=True)
class StartTimes:
    pod_start_s: float
    node_boot_s: float


def learn_start_times(
    spec: model.ColdStart,
    *,
    state: types.EngineState,
    observations: Sequence[types.ColdStartObservation],
) -> tuple[StartTimes, types.EngineState]:
    """Fold new observations (ready after the last one learned) into smoothed start times."""
    pod = state.learned_pod_start_s
    node = state.learned_node_boot_s
    newest = state.last_observation_at
    if spec.learn:
        for obs in sorted(observations, key=lambda o: o.ready_at):
            if obs.ready_at <= state.last_observation_at:
                continue
            pod = obs.pod_start_s if pod is None else pod + LEARN_WEIGHT * (obs.pod_start_s - pod)
            if obs.node_boot_s > 0:
                node = (obs.node_boot_s if node is None
                        else node + LEARN_WEIGHT * (obs.node_boot_s - node))
            newest = max(newest, obs.ready_at)
    times = StartTimes(
        pod_start_s=spec.pod_start_seconds if pod is None else pod,
        node_boot_s=spec.node_boot_seconds if node is None else node,
    )
    if (pod, node, newest) == (state.learned_pod_start_s, state.learned_node_boot_s,
                               state.last_observation_at):
        return times, state
    return times, dataclasses.replace(
        state, learned_pod_start_s=pod, learned_node_boot_s=node, last_observation_at=newest
    )


@dataclass(frozen=True, slots=True)
class Trend:
    """Demand now, its slope, and the span of history the slope was fitted over."""

    level: float
    slope_per_s: float
    span_s: float = 0.0

    def at(self, horizon_s: float) -> float:
        """Demand `horizon_s` ahead, extrapolated no further than the history observed.

        A slope seen over 30 s says little about the next 5 minutes: a burst's rising edge
        would be projected into dozens of replicas. So the look-ahead is capped at the
        span it was fitted over (120 s of history plans at most 120 s ahead).
        """
        return self.level + self.slope_per_s * min(horizon_s, self.span_s)


def fit_trend(samples: Sequence[types.DemandSample], *, now: float, min_span_s: float
              ) -> Trend | None:
    """Least-squares line through the window's samples, evaluated at `now`.

    Only the part of the slope that stands out of the noise is kept: the fitted slope less
    TREND_CONFIDENCE standard errors, floored at 0. A steady ramp has small residuals and
    keeps most of its slope; demand that merely fluctuates has a slope within its error
    and gets none, so noise is never multiplied by a minutes-long time to ready. Example:
    demand sampled every second for 120 s around 10 replicas +- 2 has a slope error of
    2 * sqrt(12 / 120) / 120 = 0.005 replicas/s; a real ramp of 0.05 replicas/s with the
    same noise keeps 0.05 - 2 x 0.005 = 0.04 replicas/s.
    The slope is never negative: the look-ahead only ever adds capacity early; falling
    demand is left to the scale-down stabilization window.
    """
    if not samples:
        return None
    span = samples[-1].at - samples[0].at
    if span < min_span_s or len(samples) < 3:
        # Too little history for a trend (a fresh start, or after a gap in the signals).
        return Trend(level=samples[-1].demand, slope_per_s=0.0, span_s=span)
    n = len(samples)
    mean_t = sum(s.at for s in samples) / n
    mean_d = sum(s.demand for s in samples) / n
    var_t = sum((s.at - mean_t) ** 2 for s in samples)
    if var_t <= 0:
        return Trend(level=samples[-1].demand, slope_per_s=0.0, span_s=span)
    slope = sum((s.at - mean_t) * (s.demand - mean_d) for s in samples) / var_t
    residual = sum((s.demand - mean_d - slope * (s.at - mean_t)) ** 2 for s in samples)
    stderr = math.sqrt(residual / (n - 2) / var_t)
    kept = max(0.0, slope - TREND_CONFIDENCE * stderr)
    # Level: the demand seen now. The fitted line lags a fresh jump and leads a fresh
    # drop; the latest sample is what capacity must cover right now.
    return Trend(level=samples[-1].demand, slope_per_s=kept, span_s=span)


def window(
    samples: Sequence[types.DemandSample],
    *,
    now: float,
    seconds: float,
) -> tuple[types.DemandSample, ...]:
    """The samples of the last `seconds` (time-keyed, not tick-keyed)."""
    cutoff = now - seconds
    return tuple(s for s in samples if s.at > cutoff)
