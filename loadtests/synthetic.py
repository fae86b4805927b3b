"""Synthetic load shapes (flash crowd, ramp) as plain-CSV traces for `scaler simulate`.

The bundled Azure slices are real but have one shape each; policies are also judged on
loads they were not tuned on. This writes `timestamp_s,input_tokens,output_tokens` rows
with Poisson arrivals, deterministic for a seed:

    python loadtests/synthetic.py flash /tmp/flash.csv     # 5 -> 40 -> 5 req/s, then a ramp
    scaler simulate --trace /tmp/flash.csv --policy config/llama-8b.yaml
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# (seconds, requests/s at the start, requests/s at the end) per segment.
SHAPES: dict[str, list[tuple[float, float, float]]] = {
    # A step to 8x for ten minutes, back down, then a ten-minute ramp to 40 req/s.
    "flash": [(600, 5, 5), (600, 40, 40), (600, 5, 5), (600, 5, 40), (300, 40, 40)],
    # A slow daily-like rise and fall over an hour.
    "ramp": [(1800, 2, 30), (1800, 30, 2)],
}


def rows(shape: str, *, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["timestamp_s,input_tokens,output_tokens"]
    t0 = 0.0
    for seconds, start, end in SHAPES[shape]:
        t = t0
        while True:
            # Piecewise-constant rate per second within the segment: thinning is overkill.
            rate = start + (end - start) * (t - t0) / seconds
            t += rng.expovariate(max(rate, 1e-6))
            if t >= t0 + seconds:
                break
            out.append(f"{t:.3f},{rng.randint(200, 3000)},{rng.randint(20, 400)}")
        t0 += seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    lines = rows(args.shape, seed=args.seed)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines) - 1} requests")


if __name__ == "__main__":
    main()
