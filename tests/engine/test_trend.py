"""The look-ahead's trend against its last 30 s: a plateau is no ramp, and a ramp whose
readings are smoothed keeps its slope through a chance dip."""

from __future__ import annotations

import random

from scaler.engine import forecast, types

RECENT_S = 30.0  # what decide passes: the flow balance's window


def _ar1(seed: int, *, rho: float, sigma: float, n: int) -> list[float]:
    """Noise as smoothed readings have it: each sample rho x the last plus a fresh draw."""
    rng, e, out = random.Random(seed), 0.0, []
    for _ in range(n):
        e = rho * e + rng.gauss(0.0, sigma)
        out.append(e)
    return out


def _samples(demand: list[float]) -> list[types.DemandSample]:
    return [types.DemandSample(float(t), d) for t, d in enumerate(demand)]


def _slope(demand: list[float], *, recent_s: float | None) -> float:
    trend = forecast.fit_trend(_samples(demand), now=float(len(demand) - 1), min_span_s=60.0,
                               recent_s=recent_s)
    assert trend is not None
    return trend.slope_per_s


def test_a_step_seen_through_a_smoothing_window_keeps_no_trend_once_it_holds() -> None:
    # Demand 1 for 40 s, a 36 s ramp to 7 (a step as a 30 s rate or flow fit shows it),
    # then a plateau with white or smoothed noise. Fitted over the whole 120 s the line
    # keeps about 0.067 replicas/s (27 replicas over a node boot's 405 s, were it not
    # capped by the history's span); the last 30 s are flat and allow about 0.005 to 0.018.
    for rho in (0.0, 0.8, 0.95):
        whole, bounded = [], []
        for seed in range(50):
            noise = _ar1(seed, rho=rho, sigma=0.1, n=121)
            demand = [1 + 6 * min(1.0, max(0.0, (t - 40) / 36)) + noise[t] for t in range(121)]
            whole.append(_slope(demand, recent_s=None))
            bounded.append(_slope(demand, recent_s=RECENT_S))
        assert sum(whole) / len(whole) > 0.06, rho
        assert sum(bounded) / len(bounded) < 0.025, (rho, bounded)


def test_a_ramp_with_smoothed_noise_keeps_its_slope_through_a_chance_dip() -> None:
    # A ramp of 0.05 replicas/s whose readings carry smoothed noise (lag-1 correlation
    # 0.95, as one-second samples of a 30 s rate): by chance its last 30 s sometimes look
    # flat. Their fit's error read as if the samples were independent is far too small
    # and would cut the slope below half the whole fit's in 34 of these 200 draws; read
    # with the residuals' correlation (an effective sample size n (1 - r) / (1 + r)) in 12.
    cut = 0
    for seed in range(200):
        noise = _ar1(seed, rho=0.95, sigma=0.3, n=121)
        demand = [5 + 0.05 * t + noise[t] for t in range(121)]
        cut += _slope(demand, recent_s=RECENT_S) < 0.5 * _slope(demand, recent_s=None)
    assert cut <= 20, cut
    # White noise of the same size: the last 30 s see the ramp; nothing is cut.
    for seed in range(50):
        noise = _ar1(seed, rho=0.0, sigma=0.3, n=121)
        demand = [5 + 0.05 * t + noise[t] for t in range(121)]
        assert _slope(demand, recent_s=RECENT_S) == _slope(demand, recent_s=None), seed
