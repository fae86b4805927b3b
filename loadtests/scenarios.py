"""Parametrised load shapes as plain-CSV traces for `scaler simulate` and the suite.

Real traces have one shape each; a policy is also judged on shapes it was not tuned on.
Each scenario is a rate over time (requests/s) and a length mix, drawn as a
non-homogeneous Poisson process (per second: a Poisson count at that second's rate,
uniform inside it), deterministic for a seed, written as
`timestamp_s,input_tokens,output_tokens` rows that `scaler.sim.traces` reads:

    python -m loadtests.scenarios --list
    python -m loadtests.scenarios step /tmp/step.csv --param high=80 --seed 3
    scaler simulate --trace /tmp/step.csv --policy config/llama-8b.yaml

Rates are sized for the 8B example (one H100 replica serves about 13 req/s of the
default mix at saturation), so the shapes move it between 1 and about 8 replicas.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Lengths:
    """One log-normal mode of token lengths: means in tokens, sigma of the log.

    Log-normal because measured prompt and output lengths are (Azure conv: input mean
    1,155, median 1,020). For a log-normal with mean m and log-sigma s, mu = ln m - s^2/2.
    """

    input_mean: float
    output_mean: float
    input_sigma: float = 0.6
    output_sigma: float = 0.8
    weight: float = 1.0

    def draw(self, count: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        def lognormal(mean: float, sigma: float) -> IntArray:
            mu = math.log(mean) - sigma * sigma / 2
            return np.maximum(1, np.rint(rng.lognormal(mu, sigma, count))).astype(np.int64)

        return (lognormal(self.input_mean, self.input_sigma),
                lognormal(self.output_mean, self.output_sigma))


# A chat mix close to Azure conv (input mean 1,155, output 211).
CHAT = (Lengths(1100, 200),)


def draw_lengths(mix: tuple[Lengths, ...], count: int, rng: np.random.Generator
                 ) -> tuple[IntArray, IntArray]:
    """Lengths for `count` requests, each from a mode picked by weight."""
    weights = np.array([m.weight for m in mix], dtype=np.float64)
    mode = rng.choice(len(mix), size=count, p=weights / weights.sum())
    inputs = np.zeros(count, dtype=np.int64)
    outputs = np.zeros(count, dtype=np.int64)
    for i, lengths in enumerate(mix):
        chosen = mode == i
        inputs[chosen], outputs[chosen] = lengths.draw(int(chosen.sum()), rng)
    return inputs, outputs


RateFn = Callable[[FloatArray], FloatArray]


@dataclass(frozen=True)
class Scenario:
    """A named shape: its rate (req/s at each second), duration and length mix.

    `rises` are the times (s) where the rate steps up faster than any reactive scaler
    follows: the windows within one cold start after them need headroom or prediction.
    A climb that takes time is given by its start and its end: the load is not at its
    new level before the end, so a scaler that reacts sees that level only then.
    """

    name: str
    description: str
    duration_s: float
    rate: RateFn
    lengths: tuple[Lengths, ...] = CHAT
    rises: tuple[float, ...] = ()
    params: Mapping[str, float] = field(default_factory=dict)

    def rates(self) -> FloatArray:
        """The rate at each whole second of the scenario."""
        return np.maximum(self.rate(np.arange(int(math.ceil(self.duration_s)),
                                              dtype=np.float64)), 0.0)

    def replay_rises(self) -> tuple[float, ...]:
        """`rises` on the clock of the replayed trace, which starts at its first request:
        a shape that opens with no load (a square wave off for its first 150 s) is
        replayed from its first second with load, so every rise is that much earlier."""
        loaded = np.flatnonzero(self.rates() > 0)
        lead = float(loaded[0]) if loaded.size else 0.0
        return tuple(t - lead for t in self.rises)

    def draw(self, *, seed: int) -> tuple[FloatArray, IntArray, IntArray]:
        """(arrival s, input tokens, output tokens), sorted by arrival."""
        rng = np.random.default_rng(seed)
        per_second = rng.poisson(self.rates())
        arrival = (np.repeat(np.arange(per_second.size, dtype=np.float64), per_second)
                   + rng.uniform(size=int(per_second.sum())))
        arrival.sort()
        inputs, outputs = draw_lengths(self.lengths, arrival.size, rng)
        return arrival, inputs, outputs

    def write(self, path: Path, *, seed: int) -> int:
        """Write the trace as plain CSV; returns the number of requests."""
        arrival, inputs, outputs = self.draw(seed=seed)
        lines = ["timestamp_s,input_tokens,output_tokens"]
        lines += [f"{t:.3f},{i},{o}" for t, i, o in
                  zip(arrival.tolist(), inputs.tolist(), outputs.tolist(), strict=True)]
        path.write_text("\n".join(lines) + "\n")
        return int(arrival.size)


# ----- the shapes (each a function of its parameters; defaults sized for the 8B) ----------


def step(*, low: float = 10.0, high: float = 60.0, at: float = 900.0, hold: float = 1200.0,
         after: float = 1500.0) -> Scenario:
    """Step up from `low` to `high` req/s at `at` s, hold, step back down."""
    def rate(t: FloatArray) -> FloatArray:
        return np.where((t >= at) & (t < at + hold), high, low)

    return Scenario("step", f"step {low:g} -> {high:g} -> {low:g} req/s (up at {at:g} s, "
                    f"down after {hold:g} s)", at + hold + after, rate, rises=(at,),
                    params={"low": low, "high": high, "at": at, "hold": hold, "after": after})


def square(*, low: float = 0.0, high: float = 40.0, period: float = 900.0,
           duty: float = 0.5, cycles: float = 4.0) -> Scenario:
    """A square wave: `high` for duty x period, then `low` (0: off), `cycles` times,
    after a first half of the low phase (so the first rise is inside the trace)."""
    shift = (1 - duty) * period / 2

    def rate(t: FloatArray) -> FloatArray:
        on = (t >= shift) & (np.mod(t - shift, period) < duty * period)
        return np.where(on, high, low)

    rises = tuple(shift + k * period for k in range(int(cycles)))
    return Scenario("square", f"square wave {high:g} req/s on / {low:g} off, period "
                    f"{period:g} s, duty {duty:g}", shift + cycles * period, rate,
                    rises=rises, params={"low": low, "high": high, "period": period,
                                         "duty": duty, "cycles": cycles})


def sawtooth(*, low: float = 5.0, high: float = 50.0, climb: float = 240.0,
             period: float = 300.0, cycles: float = 6.0) -> Scenario:
    """A sawtooth: a linear climb from `low` to `high` req/s over `climb` s, back to
    `low` at once, held for the rest of the `period`, `cycles` times (batch jobs that
    ramp their submissions, then stop). Each climb is slower than a pod start, so it has
    no rises; the drops test the down window."""
    def rate(t: FloatArray) -> FloatArray:
        into = np.mod(t, period)
        return np.where(into < climb, low + (high - low) * into / climb, low)

    return Scenario("sawtooth", f"sawtooth {low:g} -> {high:g} req/s over {climb:g} s, "
                    f"period {period:g} s", cycles * period, rate,
                    params={"low": low, "high": high, "climb": climb, "period": period,
                            "cycles": cycles})


def stairs(*, low: float = 8.0, factor: float = 1.5, steps: float = 4.0,
           hold: float = 225.0) -> Scenario:
    """A staircase: `low` req/s, then `steps` steps up by `factor` each `hold` s, then
    the same steps down (8, 12, 18, 27, 40.5, 27, 18, 12 req/s at the defaults). Each
    step up is a rise: 1.5x is past the utilisation margin's 1.25x."""
    up = [low * factor ** k for k in range(int(steps) + 1)]
    levels: FloatArray = np.asarray(up + up[-2:0:-1], dtype=np.float64)

    def rate(t: FloatArray) -> FloatArray:
        return levels[np.minimum((t // hold).astype(np.int64), levels.size - 1)]

    return Scenario("stairs", f"stairs from {low:g} req/s, x{factor:g} every {hold:g} s, "
                    f"{steps:g} up and down", levels.size * hold, rate,
                    rises=tuple(hold * k for k in range(1, int(steps) + 1)),
                    params={"low": low, "factor": factor, "steps": steps, "hold": hold})


def flash(*, base: float = 8.0, peak: float = 80.0, at: float = 1200.0, rise: float = 30.0,
          decay: float = 600.0, duration: float = 3600.0) -> Scenario:
    """A flash crowd: `base` req/s, a `rise`-second climb to `peak`, then exponential
    decay back (time constant `decay` s), as after a launch or a news item."""
    def rate(t: FloatArray) -> FloatArray:
        climbing = np.clip((t - at) / rise, 0.0, 1.0)
        falling = np.exp(-np.maximum(t - at - rise, 0.0) / decay)
        return base + (peak - base) * climbing * falling

    return Scenario("flash", f"flash crowd {base:g} -> {peak:g} req/s in {rise:g} s at "
                    f"{at:g} s, decay {decay:g} s", duration, rate, rises=(at, at + rise),
                    params={"base": base, "peak": peak, "at": at, "rise": rise,
                            "decay": decay, "duration": duration})


def ramp(*, low: float = 4.0, high: float = 70.0, duration: float = 3600.0,
         hold: float = 600.0) -> Scenario:
    """A linear ramp from `low` to `high` req/s, then `hold` s at the top."""
    climb = duration - hold

    def rate(t: FloatArray) -> FloatArray:
        return low + (high - low) * np.clip(t / climb, 0.0, 1.0)

    return Scenario("ramp", f"linear ramp {low:g} -> {high:g} req/s over {climb:g} s",
                    duration, rate, params={"low": low, "high": high,
                                            "duration": duration, "hold": hold})


def daily(*, trough: float = 3.0, peak: float = 45.0, day: float = 86400.0,
          peak_hour: float = 14.0, duration: float = 86400.0) -> Scenario:
    """A daily cycle: a raised cosine between `trough` and `peak` req/s with its peak at
    `peak_hour` (trough 12 h away), over `duration` s from midnight."""
    def rate(t: FloatArray) -> FloatArray:
        phase = 2 * np.pi * (t - peak_hour * 3600.0 * day / 86400.0) / day
        return trough + (peak - trough) * (1 + np.cos(phase)) / 2

    return Scenario("daily", f"daily cycle {trough:g} -> {peak:g} req/s, peak at "
                    f"{peak_hour:g}:00", duration, rate,
                    params={"trough": trough, "peak": peak, "day": day,
                            "peak_hour": peak_hour, "duration": duration})


# The length mixes' rate swing: +-30 % over 20 minutes unless told otherwise, so that
# scaling still happens while the lengths are what is tested.
WOBBLE = 0.3
WOBBLE_PERIOD_S = 1200.0


def steady(*, name: str, description: str, rate_per_s: float, duration: float,
           lengths: tuple[Lengths, ...], wobble: float = WOBBLE, period: float = WOBBLE_PERIOD_S,
           params: Mapping[str, float] | None = None) -> Scenario:
    """A length-mix scenario: the rate wobbles +-`wobble` around `rate_per_s` (period
    `period` s) so that scaling still happens while the lengths are what is tested."""
    def rate(t: FloatArray) -> FloatArray:
        return rate_per_s * (1 + wobble * np.sin(2 * np.pi * t / period))

    return Scenario(name, description, duration, rate, lengths, params=dict(params or {}))


def _wobbling(wobble: float, period: float) -> str:
    """The rate's swing in a description: "+-30 %", or "+-70 % over 3600 s" when the period
    is not the default."""
    return f"+-{wobble * 100:g} %" + ("" if period == WOBBLE_PERIOD_S else f" over {period:g} s")


def long_context(*, rate: float = 6.0, share: float = 0.3, long_input: float = 16000.0,
                 duration: float = 3600.0, wobble: float = WOBBLE, period: float = WOBBLE_PERIOD_S
                 ) -> Scenario:
    """Long-context-heavy: `share` of prompts around `long_input` tokens (RAG, code,
    documents), the rest chat-sized. Some prompts alone take more than 0.5 s to prefill."""
    mix = (Lengths(1100, 200, weight=1 - share),
           Lengths(long_input, 300, input_sigma=0.5, weight=share))
    return steady(name="long-context", description=f"{share:.0%} of prompts ~{long_input:g} "
                  f"tokens, {rate:g} req/s {_wobbling(wobble, period)}", rate_per_s=rate,
                  duration=duration, lengths=mix, wobble=wobble, period=period,
                  params={"rate": rate, "share": share, "long_input": long_input,
                          "duration": duration, "wobble": wobble, "period": period})


def bimodal(*, rate: float = 25.0, short_input: float = 200.0, long_input: float = 6000.0,
            duration: float = 3600.0, wobble: float = WOBBLE, period: float = WOBBLE_PERIOD_S
            ) -> Scenario:
    """Bimodal lengths: half short chat turns, half long prompts with long answers; the
    mean describes neither mode (what a mean-length capacity model gets wrong)."""
    mix = (Lengths(short_input, 60, input_sigma=0.4, output_sigma=0.5),
           Lengths(long_input, 800, input_sigma=0.3, output_sigma=0.4))
    return steady(name="bimodal", description=f"half ~{short_input:g}-token, half "
                  f"~{long_input:g}-token prompts, {rate:g} req/s "
                  f"{_wobbling(wobble, period)}", rate_per_s=rate, duration=duration,
                  lengths=mix, wobble=wobble, period=period,
                  params={"rate": rate, "short_input": short_input,
                          "long_input": long_input, "duration": duration,
                          "wobble": wobble, "period": period})


def long_output(*, rate: float = 6.0, output_mean: float = 1500.0,
                duration: float = 3600.0, wobble: float = WOBBLE, period: float = WOBBLE_PERIOD_S
                ) -> Scenario:
    """Long outputs: reasoning-style answers averaging `output_mean` tokens (ServeGen's
    DeepSeek-R1 workload), short prompts; decode-bound, long-lived requests."""
    mix = (Lengths(600, output_mean, output_sigma=0.7),)
    return steady(name="long-output", description=f"outputs ~{output_mean:g} tokens, "
                  f"{rate:g} req/s {_wobbling(wobble, period)}", rate_per_s=rate,
                  duration=duration, lengths=mix, wobble=wobble, period=period,
                  params={"rate": rate, "output_mean": output_mean, "duration": duration,
                          "wobble": wobble, "period": period})


SHAPES: dict[str, Callable[..., Scenario]] = {
    "step": step, "square": square, "flash": flash, "ramp": ramp, "daily": daily,
    "sawtooth": sawtooth, "stairs": stairs,
    "long-context": long_context, "bimodal": bimodal, "long-output": long_output,
}

# Tiny versions for `suite.py --quick` and tests: minutes, not hours, a few req/s.
QUICK: dict[str, dict[str, float]] = {
    "step": {"low": 2.0, "high": 12.0, "at": 60.0, "hold": 180.0, "after": 60.0},
    "bimodal": {"rate": 4.0, "duration": 180.0},
}


def scenario(name: str, **params: float) -> Scenario:
    """The named shape with its parameters overridden; unknown names or keys are errors."""
    if name not in SHAPES:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SHAPES)}")
    try:
        return SHAPES[name](**params)
    except TypeError:
        raise ValueError(f"scenario {name!r} takes {', '.join(_parameters(name))}; "
                         f"got {', '.join(params)}") from None


# The shapes whose length mix is their point: `with_lengths` gives another shape theirs.
LENGTH_MIXES = ("long-context", "bimodal", "long-output")


def with_lengths(shape: Scenario, mix: str) -> Scenario:
    """`shape` (its rate over time) drawing its lengths from the default mix of the
    length-mix shape `mix` (LENGTH_MIXES): a square wave of half 6k-token prompts, a step
    of long contexts. Example: `with_lengths(scenario("square"), "bimodal")`."""
    if mix not in LENGTH_MIXES:
        raise ValueError(f"unknown length mix {mix!r}; choose from {', '.join(LENGTH_MIXES)}")
    return replace(shape, lengths=SHAPES[mix]().lengths,
                   description=f"{shape.description}, {mix} lengths")


def _parameters(name: str) -> list[str]:
    code = SHAPES[name].__code__
    return list(code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount])


def _param(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}")
    try:
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", choices=list(SHAPES))
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--param", type=_param, action="append", default=[],
                        metavar="KEY=NUMBER", help="override a shape parameter (repeatable)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="list shapes and parameters")
    args = parser.parse_args(argv)
    if args.list or args.name is None:
        for name in SHAPES:
            shape = scenario(name)
            print(f"{name:13} {shape.description}; "
                  + ", ".join(f"{k}={v:g}" for k, v in shape.params.items()))
        return 0
    if args.out is None:
        parser.error("give OUT.csv")
    try:
        shape = scenario(args.name, **dict(args.param))
    except ValueError as error:
        print(f"scenarios: {error}", file=sys.stderr)
        return 2
    count = shape.write(args.out, seed=args.seed)
    print(f"{args.out}: {count} requests over {shape.duration_s:g} s ({shape.description})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
