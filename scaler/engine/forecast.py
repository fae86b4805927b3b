"""Cold-start look-ahead (DESIGN 3.2): time to ready, learned start times, demand trend."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.engine import spec as engine_spec
from scaler.engine import types

# Weight of a new observation in the learned start time (exponential smoothing):
# 0.3 means about the last 3 observations dominate, so one slow pull does not
# double the look-ahead but a persistent change is learned within 5 to 6 starts.
LEARN_WEIGHT = 0.3

# Standard errors taken off the fitted slope before it is extrapolated (about a 98 %
# one-sided bound for a straight line through many points).
TREND_CONFIDENCE = 2.0

# A window is read as a step, not a ramp, when two flat levels explain it with less than
# this share of the straight line's squared error. A noisy ramp never qualifies (its best
# two-level fit leaves the ramp's own spread, R^2/48 per point, on top of the noise); a
# one-off step of a few noise widths does, and then only the history after the step
# counts for the slope: flat, so nothing is extrapolated through a node boot.
STEP_FIT_RATIO = 0.5



@types.fast_init
@dataclass(frozen=True, slots=True)
class StartTimes:
    pod_start_s: float
    node_boot_s: float


def learn_start_times(
    spec: engine_spec.EngineSpec,
    *,
    state: types.EngineState,
    observations: Sequence[types.ColdStartObservation],
) -> tuple[StartTimes, types.EngineState]:
    """Fold new observations (ready after the last one learned) into smoothed start times."""
    pod = state.learned_pod_start_s
    node = state.learned_node_boot_s
    newest = state.last_observation_at
    if spec.learn_start_times and observations:
        for obs in sorted(observations, key=lambda o: o.ready_at):
            if obs.ready_at <= state.last_observation_at:
                continue
            pod = obs.pod_start_s if pod is None else pod + LEARN_WEIGHT * (obs.pod_start_s - pod)
            if obs.node_boot_s > 0:
                node = (obs.node_boot_s if node is None
                        else node + LEARN_WEIGHT * (obs.node_boot_s - node))
            newest = max(newest, obs.ready_at)
    times = StartTimes(
        pod_start_s=spec.pod_start_s if pod is None else pod,
        node_boot_s=spec.node_boot_s if node is None else node,
    )
    if (pod, node, newest) == (state.learned_pod_start_s, state.learned_node_boot_s,
                               state.last_observation_at):
        return times, state
    return times, dataclasses.replace(
        state, learned_pod_start_s=pod, learned_node_boot_s=node, last_observation_at=newest
    )


@types.fast_init
@dataclass(frozen=True, slots=True)
class Trend:
    """Demand now, its slope, and the span of history the slope was fitted over."""

    level: float
    slope_per_s: float
    span_s: float = 0.0
    step: bool = False
    recent: bool = False  # the slope held to what the last `recent_s` allow (`_recent_bound`)

    def at(self, horizon_s: float) -> float:
        """Demand `horizon_s` ahead, extrapolated no further than the history observed.

        A slope seen over 30 s says little about the next 5 minutes: a burst's rising edge
        would be projected into dozens of replicas. So the look-ahead is capped at the
        span it was fitted over (120 s of history plans at most 120 s ahead).
        """
        return self.level + self.slope_per_s * min(horizon_s, self.span_s)


def fit_trend(samples: Sequence[types.DemandSample], *, now: float, min_span_s: float,
              recent_s: float | None = None) -> Trend | None:
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
    With `recent_s`, the trend must still be going on: the kept slope is at most what the
    last `recent_s` seconds allow (their own slope plus TREND_CONFIDENCE standard errors,
    `_recent_bound`).
    """
    if not samples:
        return None
    span = samples[-1].at - samples[0].at
    if span < min_span_s or len(samples) < 3:
        # Too little history for a trend (a fresh start, or after a gap in the signals).
        return Trend(level=samples[-1].demand, slope_per_s=0.0, span_s=span)
    n = len(samples)
    # Read once into lists (attrgetter in C); `_line` says how its sums are computed.
    times = list(map(_AT, samples))
    values = list(map(_DEMAND, samples))
    line = _line(times, values)
    if line is None:
        return Trend(level=samples[-1].demand, slope_per_s=0.0, span_s=span)
    slope, residual, var_t = line
    split = _step_split(values, line_residual=residual)
    if split is not None:
        # A step: the trend is that of the level after it (flat until it shows a slope).
        after = fit_trend(samples[split:], now=now, min_span_s=min_span_s, recent_s=recent_s)
        level = samples[-1].demand
        return Trend(level=level, slope_per_s=0.0 if after is None else after.slope_per_s,
                     span_s=0.0 if after is None else after.span_s, step=True,
                     recent=after is not None and after.recent)
    stderr = math.sqrt(residual / (n - 2) / var_t)
    kept = max(0.0, slope - TREND_CONFIDENCE * stderr)
    bound = math.inf
    if kept > 0 and recent_s is not None:
        bound = _recent_bound(times, values, now=now, recent_s=recent_s)
    # Level: the demand seen now. The fitted line lags a fresh jump and leads a fresh
    # drop; the latest sample is what capacity must cover right now.
    return Trend(level=samples[-1].demand, slope_per_s=min(kept, bound), span_s=span,
                 recent=bound < kept)


def _line(times: Sequence[float], values: Sequence[float]
          ) -> tuple[float, float, float] | None:
    """Least squares through (time, value): the slope, the squared residual and the
    spread of the times (sum of (t - mean)^2); None when the times do not spread.

    The same sums in the same order as over the samples, read once into lists (a window
    holds up to a sample a second: 120 in the default window), and each deviation from
    the means computed once for the three sums that read it (the same floats: `d - mean_d
    - slope * (t - mean_t)` is `dd - slope * dt`). `map` over C functions (pow, mul) where
    no Python expression is needed: the same operations, without a bytecode loop.
    """
    n = len(times)
    mean_t = sum(times) / n
    mean_d = sum(values) / n
    dts = [t - mean_t for t in times]
    var_t = sum(map(pow, dts, itertools.repeat(2)))  # (t - mean_t) ** 2
    if var_t <= 0:
        return None
    dds = [d - mean_d for d in values]
    slope = sum(map(operator.mul, dts, dds)) / var_t
    residual = sum([(dd - slope * dt) ** 2 for dt, dd in zip(dts, dds, strict=True)])
    return slope, residual, var_t


def _recent_bound(times: list[float], values: list[float], *, now: float, recent_s: float
                  ) -> float:
    """The largest slope the last `recent_s` seconds allow: their own slope plus
    TREND_CONFIDENCE standard errors, widened by their residuals' correlation
    (`_correlation_inflation`); inf when they are too few to tell.

    A demand that is estimated over a window (the flow balance's 30 s fit, a Prometheus
    rate) answers a step with a ramp as long as that window, then stays flat; fitted
    over the look-ahead's 120 s, the ramp and the plateau after it read as a trend that
    the step split may not catch once the level before it leaves the window. A real ramp
    keeps rising in its last seconds, so the bound rarely binds on it (its recent slope
    is within its error of the whole one); a plateau's bound is its noise. Measured: a
    flash crowd's demand rose from 0.8 to 6.8 replicas within 36 s of the flow estimate
    and then held at 6.6 to 7.2 for 30 s; fitted over 120 s that kept 0.065 replicas/s,
    planned 7.8 replicas more through a node boot and bought 16 where 9 were needed; the
    last 30 s allow 0.011 (1.3 replicas over the horizon). Read as if its one-second
    samples were independent, the error of a 30 s fit of readings smoothed over 30 to 60 s
    is far too small: on a mix of half 6k-token prompts that bound cut a real, noisy
    rise's look-ahead (0.0088 -> 0 replicas/s) and lost a window; widened by the
    correlation it keeps it.
    """
    start = bisect.bisect_right(times, now - recent_s)
    ts, vs = times[start:], values[start:]
    if len(ts) < 3 or ts[-1] - ts[0] < recent_s / 2:
        return math.inf
    line = _line(ts, vs)
    if line is None:
        return math.inf
    slope, residual, var_t = line
    stderr = math.sqrt(residual / (len(ts) - 2) / var_t)
    return max(0.0, slope + TREND_CONFIDENCE * stderr * _correlation_inflation(ts, vs, slope))


# Lag-1 correlation of residuals is capped here: at 0.9 the error is read 4.4x wider; a
# series that correlated holds too few independent points in 30 s to bound anything.
MAX_RESIDUAL_CORRELATION = 0.9


def _correlation_inflation(times: list[float], values: list[float], slope: float) -> float:
    """How much wider a least-squares slope's error is than the independent-samples
    formula says, from the lag-1 correlation r of the residuals: sqrt((1 + r) / (1 - r))
    (an AR(1) error's effective sample size is n (1 - r) / (1 + r)). Readings smoothed over
    30 to 60 s and sampled every second are strongly correlated; a window of white noise
    has r near 0 and keeps its formula."""
    n = len(times)
    mean_t = sum(times) / n
    mean_d = sum(values) / n
    res = [d - mean_d - slope * (t - mean_t) for t, d in zip(times, values, strict=True)]
    power = sum(e * e for e in res)
    if power <= 0:
        return 1.0
    r = sum(a * b for a, b in itertools.pairwise(res)) / power
    r = min(MAX_RESIDUAL_CORRELATION, max(0.0, r))
    return math.sqrt((1 + r) / (1 - r))


# A forecast is checked only when it added at least this many replicas: smaller lifts are
# within the noise of the demand they are compared with.
MIN_CHECKED_LIFT = 0.5


def check_forecast(
    state: types.EngineState, *, now: float, demand_now: float | None
) -> types.EngineState:
    """Compare a due forecast with the demand that came, and trust the trend accordingly.

    realized = (demand now - demand then) / (predicted - demand then), in [0, 1]; the
    trusted share of the trend moves half way to it. A one-off step read as a ramp
    predicted +4 replicas that never came: realized 0, the next forecasts use half the
    slope, then a quarter. A real ramp realizes about 1 and keeps (or regains) all of it.
    """
    check = state.forecast_check
    if check is None or now < check.due_at or demand_now is None:
        return state
    lift = check.predicted - check.base
    realized = min(1.0, max(0.0, (demand_now - check.base) / lift)) if lift > 0 else 1.0
    scale = 0.5 * state.horizon_scale + 0.5 * realized
    return dataclasses.replace(state, forecast_check=None, horizon_scale=scale)


def register_forecast(
    state: types.EngineState, forecast: types.Forecast, *, now: float
) -> types.EngineState:
    """Keep a forecast that lifted demand, to check it when its time comes (one at a time:
    bounded memory, and each check sees the effect of the last)."""
    if state.forecast_check is not None:
        return state
    if forecast.demand_at_ready - forecast.demand_now < MIN_CHECKED_LIFT:
        return state
    return dataclasses.replace(state, forecast_check=types.ForecastCheck(
        due_at=now + forecast.time_to_ready_s, base=forecast.demand_now,
        predicted=forecast.demand_at_ready))


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) points per second; None below two distinct times.

    Example: 10, 12, 14 at t = 0, 1, 2 s -> 2.0 per second."""
    if len(points) < 2:
        return None
    try:
        mean_t = math.fsum(t for t, _ in points) / len(points)
        mean_v = math.fsum(v for _, v in points) / len(points)
        spread = math.fsum((t - mean_t) ** 2 for t, _ in points)
        if spread <= 0:
            return None
        fitted = math.fsum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    except (OverflowError, ValueError):
        # Sums past a float (values the parser's plausibility bounds refuse long before,
        # e.g. two readings of 1.7e308): no slope, as for too few points.
        return None
    return fitted if math.isfinite(fitted) else None


def _step_split(values: Sequence[float], *, line_residual: float) -> int | None:
    """Where a two-level (step) fit splits the samples' demand `values`, if it beats the
    line clearly.

    O(n) with prefix sums: for each split k the squared error of two means is
    sum(d^2) - (sum before)^2 / k - (sum after)^2 / (n - k). Each level needs 3 samples.
    """
    n = len(values)
    if n < 6 or line_residual <= 0:
        return None
    total, total_sq = math.fsum(values), math.fsum(map(operator.mul, values, values))
    # befores[k]: the sum of the first k values, added up in order from 0.0 (a running
    # sum, as a loop adding one value a split would); splits k = 3 .. n - 3.
    befores = list(itertools.accumulate(values[:n - 3], initial=0.0))
    errors = [total_sq - before * before / k - (total - before) * (total - before) / (n - k)
              for k, before in zip(range(3, n - 2), befores[3:], strict=True)]
    # The first smallest error, as a scan keeping only strictly smaller ones would find:
    # demands are bounded (recommend.bounded: at most 1e6 replicas), so every error is
    # finite and `min` and `index` agree with that scan.
    best = min(errors)
    if best >= STEP_FIT_RATIO * line_residual:
        return None
    return errors.index(best) + 3


_AT = operator.attrgetter("at")
_DEMAND = operator.attrgetter("demand")


def window(
    samples: Sequence[types.DemandSample],
    *,
    now: float,
    seconds: float,
) -> tuple[types.DemandSample, ...]:
    """The samples of the last `seconds` (time-keyed, not tick-keyed)."""
    cutoff = now - seconds
    return tuple([s for s in samples if s.at > cutoff])
