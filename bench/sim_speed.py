"""Simulator speed: a one-hour trace at about 50 req/s through every strategy, one core.

Run: .venv/bin/python bench/sim_speed.py [--trace PATH] [--rate-scale X]
Default trace: Azure conv 2023 (../shared/traces) x 9 = 174k requests over 3,502 s
(49.8 req/s); without ../shared, the bundled 20-minute conv slice tiled to an hour, x 9.
Target (issues 3 and 10): under 60 s for all default strategies, the oracle's search,
its repair replays and its bound included (`oracle` and `static-peak` share one plan, so
they are timed together).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import yaml

from scaler.policy import model as policy_model
from scaler.sim import profiles, run, strategies, traces

REPO = Path(__file__).resolve().parents[1]
SHARED_CONV = REPO / ".." / "shared" / "traces" / "azure_llm_2023" / \
    "AzureLLMInferenceTrace_conv.csv"
BUNDLED_CONV = REPO / "loadtests" / "traces" / "AzureLLMInferenceTrace_conv_20min.csv"


def _hour_from_slice(path: Path, *, scale: float, seed: int) -> traces.Trace:
    """Three back-to-back copies of a 20-minute slice, then rate-scaled: one hour."""
    base = traces.load_trace(path)
    parts = [base.arrival_s + k * 1200.0 for k in range(3)]
    tiled = traces.Trace(str(path), np.concatenate(parts),
                         np.tile(base.input_tokens, 3), np.tile(base.output_tokens, 3))
    return traces.scale_rate(tiled, scale, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--rate-scale", type=float, default=9.0)
    parser.add_argument("--policy", type=Path, default=REPO / "config" / "llama-8b.yaml")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    started = time.perf_counter()
    if args.trace is not None:
        trace = traces.load_trace(args.trace, rate_scale=args.rate_scale, seed=args.seed)
    elif SHARED_CONV.is_file():
        trace = traces.load_trace(SHARED_CONV, rate_scale=args.rate_scale, seed=args.seed)
    else:
        trace = _hour_from_slice(BUNDLED_CONV, scale=args.rate_scale * 1.0, seed=args.seed)
    loaded = time.perf_counter()
    policy = policy_model.ScalePolicy.model_validate(yaml.safe_load(args.policy.read_text()))
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    print(f"trace {trace.path}: {trace.requests} requests over {trace.duration_s:.0f} s "
          f"({trace.requests / trace.duration_s:.1f} req/s), loaded in {loaded - started:.1f} s")
    t0, c0 = time.perf_counter(), time.process_time()
    start = run.initial_replicas_for(trace, policy=policy, profile=profile)
    total, cpu_total = time.perf_counter() - t0, time.process_time() - c0
    print(f"{'common start':<20} {total:6.1f} s wall {cpu_total:6.1f} s CPU   "
          f"{start} replicas ready at t=0")
    groups = [[n] for n in strategies.STRATEGIES if n not in run.PLANNED] + [list(run.PLANNED)]
    for names in groups:
        t0, c0 = time.perf_counter(), time.process_time()
        result = run.simulate(trace, policy=policy, profile=profile, names=names,
                              initial=start)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        total += elapsed
        cpu_total += cpu
        shown = "  ".join(f"{n}: max replicas {result.results[n].summary['max_replicas']}, "
                          f"GPU-h {result.results[n].summary['gpu_hours']:.2f}" for n in names)
        # CPU time as well as wall time: on a shared machine the wall clock also counts
        # the other processes on this core.
        print(f"{' + '.join(names):<20} {elapsed:6.1f} s wall {cpu:6.1f} s CPU   {shown}")
    print(f"all strategies: {total:.1f} s wall, {cpu_total:.1f} s CPU (target < 60 s)")


if __name__ == "__main__":
    main()
