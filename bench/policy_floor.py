"""What the policy's own scale-down window costs a strategy that knows the future.

Run: .venv/bin/python bench/policy_floor.py [--policy config/llama-8b.yaml]
         [--only step,square,...]

For each of the suite's shapes (its seed), the oracle's replayed plan (a clairvoyant
schedule judged on TTFT alone, the suite's reference point) and the same plan held by the
policy's scale-down stabilization window: at every moment the highest count of the window
before it, as the HPA and the scaler hold when `behavior.scaleDown.stabilizationSeconds`
is set (the issue's rule: explicit bounds stay authoritative). That held plan is a floor
for any strategy obeying the window, clairvoyant or not, before its utilization target
(`targetUtilization: 0.8` sizes 1.25x the work on its own) and before any reaction time.
GPU-hours from the plan's replica count every 10 s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadtests import scenarios, suite
from scaler.policy import loader
from scaler.sim import profiles, run

STEP_S = 10.0  # the report's series: one count every 10 s


def held(counts: np.ndarray, window_s: float) -> np.ndarray:
    """Each count raised to the highest of the `window_s` before it."""
    span = int(window_s // STEP_S)
    return np.array([counts[max(0, i - span):i + 1].max() for i in range(counts.size)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=suite.DEFAULT_POLICY)
    parser.add_argument("--only", default=",".join(suite.FULL))
    parser.add_argument("--out", type=Path, default=Path("/tmp/scaler-policy-floor"))
    args = parser.parse_args(argv)
    policy = loader.load_paths([args.policy]).policies[0]
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    window = policy.spec.behavior.scale_down.stabilization_seconds
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"scale-down window {window:.0f} s; GPU-hours of the oracle's plan")
    print("| shape | oracle | held by the window | held / oracle |")
    print("| --- | ---: | ---: | ---: |")
    for name in args.only.split(","):
        path = args.out / f"{name}.csv"
        scenarios.scenario(name, **suite.FULL[name]).write(path, seed=suite.SCENARIO_SEED)
        trace = suite.Item(name, "", path, "scenario", seed=suite.SCENARIO_SEED).load()
        result = run.simulate(trace, policy=policy, profile=profile, names=("oracle",))
        counts = np.asarray(result.results["oracle"].series["desired"], dtype=float)
        gpus = policy.spec.resources.gpus_per_replica
        plan = counts.sum() * STEP_S / 3600 * gpus
        floor = held(counts, window).sum() * STEP_S / 3600 * gpus
        print(f"| {name} | {plan:.2f} | {floor:.2f} | {floor / plan:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
