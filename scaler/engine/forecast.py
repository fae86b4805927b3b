"""Cold-start look-ahead (DESIGN 3.2): time to ready, learned start times, demand trend."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.engine import types
from scaler.policy import model

# Weight of a new observation in the learned start time (exponential smoothing):
# 0.3 means about the last 3 observations dominate, so one slow pull does not
# double the look-ahead but a persistent change is learned within 5 to 6 starts.
LEARN_WEIGHT = 0.3

# The trend is fitted only once the window holds this much history (seconds): two
# samples one second apart would give a slope from noise.
MIN_TREND_SPAN_S = 10.0


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
    level: float
    slope_per_s: float


def fit_trend(samples: Sequence[types.DemandSample], *, now: float) -> Trend | None:
    """Least-squares line through the window's samples, evaluated at `now`.

    A line fitted over the whole window (rather than the last two points) keeps one
    noisy sample from swinging the forecast: with demand sampled every second around
    10 replicas +- 2, the slope's error over a 120 s window is about
    2 * sqrt(12 / 120) / 120 = 0.005 replicas/s, i.e. under one replica over a 150 s start.
    The slope is floored at 0: the look-ahead only ever adds capacity early; falling
    demand is left to the scale-down stabilization window.
    """
    if not samples:
        return None
    if samples[-1].at - samples[0].at < MIN_TREND_SPAN_S or len(samples) < 3:
        return Trend(level=samples[-1].demand, slope_per_s=0.0)
    n = len(samples)
    mean_t = sum(s.at for s in samples) / n
    mean_d = sum(s.demand for s in samples) / n
    var_t = sum((s.at - mean_t) ** 2 for s in samples)
    if var_t <= 0:
        return Trend(level=mean_d, slope_per_s=0.0)
    cov = sum((s.at - mean_t) * (s.demand - mean_d) for s in samples)
    slope = cov / var_t
    fitted_now = mean_d + slope * (now - mean_t)
    # The fitted value lags a fresh jump; never let it hide demand we can see right now.
    level = max(fitted_now, samples[-1].demand) if slope > 0 else samples[-1].demand
    return Trend(level=level, slope_per_s=max(0.0, slope))


def window(
    samples: Sequence[types.DemandSample],
    *,
    now: float,
    seconds: float,
) -> tuple[types.DemandSample, ...]:
    """The samples of the last `seconds` (time-keyed, not tick-keyed)."""
    cutoff = now - seconds
    return tuple(s for s in samples if s.at > cutoff)
