"""Scenario shapes: rates follow the shape, lengths the mix, files load as traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadtests import scenarios
from scaler.sim import traces


def test_step_rates_follow_the_shape_and_the_file_loads(tmp_path: Path) -> None:
    shape = scenarios.scenario("step", low=5.0, high=40.0, at=300.0, hold=600.0, after=300.0)
    path = tmp_path / "step.csv"
    count = shape.write(path, seed=1)
    trace = traces.load_trace(path, start_s=0.0)
    assert trace.requests == count
    per_minute = trace.per_minute()
    # 5 req/s = 300 a minute before and after, 40 req/s = 2,400 a minute while high.
    assert per_minute[1:4].mean() == pytest.approx(300, rel=0.1)
    assert per_minute[6:14].mean() == pytest.approx(2400, rel=0.05)
    assert per_minute[16:19].mean() == pytest.approx(300, rel=0.1)
    assert shape.rises == (300.0,)
    # Deterministic for a seed, different across seeds.
    again, _, _ = shape.draw(seed=1)
    other, _, _ = shape.draw(seed=2)
    # The loader's clock starts at the first request.
    assert np.allclose(np.round(again, 3) - round(float(again[0]), 3), trace.arrival_s)
    assert again.size != other.size or not np.array_equal(again, other)


def test_square_wave_is_off_between_bursts() -> None:
    shape = scenarios.scenario("square", high=30.0, low=0.0, period=600.0, duty=0.5,
                               cycles=2.0)
    rates = shape.rates()
    assert shape.duration_s == 150.0 + 1200.0
    assert rates[:150].max() == 0.0 and rates[150:450].min() == 30.0
    assert rates[450:750].max() == 0.0 and shape.rises == (150.0, 750.0)


@pytest.mark.parametrize(("name", "params", "check"), [
    ("flash", {"base": 5.0, "peak": 50.0, "at": 100.0, "rise": 20.0, "decay": 100.0,
               "duration": 600.0},
     lambda r: r[50] == 5.0 and r[120] == pytest.approx(50.0) and r[220] < 25.0),
    ("ramp", {"low": 2.0, "high": 20.0, "duration": 1000.0, "hold": 100.0},
     lambda r: r[0] == 2.0 and r[450] == pytest.approx(11.0) and r[950] == 20.0),
    ("daily", {"trough": 2.0, "peak": 20.0},
     lambda r: r[14 * 3600] == pytest.approx(20.0) and r[2 * 3600] == pytest.approx(2.0)),
    # The length mixes wobble +-30 % over 1,200 s unless told otherwise: a slow day of
    # long answers, 4.5 req/s +-78 % over an hour, is 8 at 900 s and 1 at 2,700 s.
    # A sawtooth climbs within each period and drops at once; stairs go up and down.
    ("sawtooth", {"low": 5.0, "high": 50.0, "climb": 240.0, "period": 300.0},
     lambda r: r[0] == 5.0 and r[120] == 27.5 and r[270] == 5.0 and r[420] == 27.5),
    ("stairs", {"low": 8.0, "factor": 1.5, "steps": 4.0, "hold": 225.0},
     lambda r: [r[k * 225] for k in range(8)] == [8, 12, 18, 27, 40.5, 27, 18, 12]
     and r.size == 1800),
    ("long-output", {"rate": 6.0},
     lambda r: r[300] == pytest.approx(7.8) and r[900] == pytest.approx(4.2)),
    ("long-output", {"rate": 4.5, "wobble": 0.78, "period": 3600.0},
     lambda r: r[900] == pytest.approx(8.01) and r[2700] == pytest.approx(0.99)),
    ("bimodal", {"rate": 15.0, "wobble": 0.8, "period": 3600.0},
     lambda r: r[900] == pytest.approx(27.0) and r[2700] == pytest.approx(3.0)),
])
def test_shapes_have_their_documented_rates(name: str, params: dict[str, float],
                                            check: object) -> None:
    rates = scenarios.scenario(name, **params).rates()
    assert callable(check) and check(rates)


def test_stairs_rise_at_each_step_up_and_a_sawtooth_never() -> None:
    assert scenarios.scenario("stairs", hold=100.0, steps=3.0).rises == (100.0, 200.0, 300.0)
    assert scenarios.scenario("sawtooth").rises == ()


def test_length_mixes() -> None:
    rng = np.random.default_rng(0)
    long_context = scenarios.scenario("long-context", share=0.3, long_input=16000.0)
    inputs, _ = scenarios.draw_lengths(long_context.lengths, 20000, rng)
    assert float(np.mean(inputs > 6000)) == pytest.approx(0.3, abs=0.03)
    bimodal = scenarios.scenario("bimodal")
    inputs, outputs = scenarios.draw_lengths(bimodal.lengths, 20000, rng)
    # Two modes and almost nothing at the mean (about 3,100 tokens).
    assert float(np.mean((inputs > 1500) & (inputs < 3500))) < 0.1
    assert float(np.mean(inputs < 600)) == pytest.approx(0.5, abs=0.03)
    long_output = scenarios.scenario("long-output", output_mean=1500.0)
    _, outputs = scenarios.draw_lengths(long_output.lengths, 20000, rng)
    assert float(outputs.mean()) == pytest.approx(1500, rel=0.05)


def test_unknown_names_and_parameters_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown scenario 'wave'"):
        scenarios.scenario("wave")
    with pytest.raises(ValueError, match="takes low, high, at, hold, after"):
        scenarios.scenario("step", height=3.0)
    assert scenarios.main(["step", str(tmp_path / "x.csv"), "--param", "height=3"]) == 2
    assert scenarios.main(["ramp", str(tmp_path / "r.csv"), "--param", "duration=120",
                           "--param", "hold=20"]) == 0
    assert traces.load_trace(tmp_path / "r.csv").requests > 0
