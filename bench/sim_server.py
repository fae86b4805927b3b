"""sim-server fidelity: the TTFT and inter-token latency it serves vs the profile's model.

Run: .venv/bin/python bench/sim_server.py [--profile llama-3.1-8b-h100] [--rounds 3]
`scaler sim-server` runs in its own process pinned to CPU 1 (speed 1: real time); the
client (`scaler.sim.loadtest.run`, streaming /v1/completions with ignore_eos) is pinned to
CPU 0. Each case sends `batch` requests at once to the idle server and times every SSE
event (after a warm-up batch, over the connections it opened); `--rounds` runs per case,
the median of the rounds' means reported.

The model (the profile's step model, `scaler.sim.server.plan_step`, as the simulated
cluster uses it): while `batch` sequences decode together an iteration takes
base + perSequence x batch, so the inter-token latency is that; the first iteration(s)
prefill the prompts (base + perSequence x decoding + prefilled / prefillTokensPerSecond,
at most maxBatchedTokens a step) and a request's first token comes with the iteration
that prefills its last chunk. Cases keep batch x prompt within one step's token budget,
so every request is admitted at once (vLLM's admission rule, which the server applies).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from scaler.sim import loadtest, profiles, server

OUTPUT_TOKENS = 100
# (batch, prompt tokens): decode at 1 to 128 sequences with short prompts, then one
# request with prompts of 1k to 16k tokens (16k takes two prefill steps of 8,192).
CASES = ((1, 32), (8, 32), (32, 32), (128, 32), (1, 1000), (1, 4000), (1, 16000))


def model_itl_s(profile: profiles.ReplicaProfile, *, batch: int) -> float:
    """Seconds between tokens while `batch` sequences decode: one iteration."""
    return profile.decode_step.base_seconds + profile.decode_step.per_sequence_seconds * batch


def model_ttft_s(profile: profiles.ReplicaProfile, *, prompt: int,
                 arrivals_s: Sequence[float]) -> list[float]:
    """First-token times (from each arrival) of requests of `prompt` tokens arriving at
    `arrivals_s` on an idle replica, by the profile's step model and vLLM's rule that a
    request arriving during an iteration joins at the next one. Cases keep all prompts
    within one step's token budget, so every arrived request is admitted.

    8B profile, 1 request of 16,000 tokens: 8 + 327.7 ms, then 8 + 0.1 + 312.3 ms, so
    the first token at 0.656 s. 8 requests at once: one iteration of 8 + 256 / 25,000 s
    = 18.2 ms; the first alone and 7 arriving 1 ms later: 9.3 ms for the first, and the
    7 wait for its iteration, so theirs come at 9.3 + 8 + 0.1 + 9.0 = 26.3 ms, 25.3 ms
    after they arrived.
    """
    order = sorted(range(len(arrivals_s)), key=lambda i: arrivals_s[i])
    left: dict[int, float] = {}
    first: dict[int, float] = {}
    decoding, clock, queued = 0, arrivals_s[order[0]], 0
    while len(first) < len(order):
        while queued < len(order) and arrivals_s[order[queued]] <= clock + 1e-12:
            left[order[queued]] = float(prompt)
            queued += 1
        if not left:
            clock = arrivals_s[order[queued]]  # idle until the next arrival
            continue
        plan = server.plan_step(profile, decoding=decoding, prompt_left=list(left.values()))
        clock += plan.seconds
        for index, chunk in zip(list(left), plan.chunks, strict=True):
            left[index] -= chunk
            if left[index] <= 1e-9:
                del left[index]
                first[index] = clock - arrivals_s[index]
                decoding += 1
    return [first[i] for i in range(len(arrivals_s))]


def measure(url: str, *, profile: profiles.ReplicaProfile, batch: int, prompt: int
            ) -> dict[str, float]:
    """One round: a warm-up batch, then the measured batch once it has finished, in one
    client session, so the measured requests reuse open keep-alive connections (opening
    128 connections at once would spread their arrivals over tens of ms)."""
    ttft_max = max(model_ttft_s(profile, prompt=prompt, arrivals_s=[0.0] * batch))
    # Well after the warm-up batch finished: its prefill, 99 decode steps, and 0.5 s.
    later = 1.5 * (ttft_max + (OUTPUT_TOKENS - 1) * model_itl_s(profile, batch=batch)) + 0.5
    requests = [loadtest.Request(at, prompt, OUTPUT_TOKENS)
                for at in (0.0, later) for _ in range(batch)]
    live = asyncio.run(loadtest.run(requests, loadtest.Target(url=url, model=profile.name)))
    if sum(live.errors.values()):
        raise SystemExit(f"errors from sim-server: {live.errors}")
    measured = np.asarray(live.records.arrival_s, dtype=np.float64) >= later
    ttft = np.asarray(live.records.ttft_s, dtype=np.float64)[measured]
    itl = np.asarray(live.records.itl_s, dtype=np.float64)[measured]
    # When each left the client (the loop's lag after the shared due time): the model
    # run at those arrivals is what the server should have served them.
    sent = np.asarray(live.records.lag_s, dtype=np.float64)[measured]
    at_sends = model_ttft_s(profile, prompt=prompt, arrivals_s=sent.tolist())
    return {"ttft_mean": float(ttft.mean()), "ttft_max": float(ttft.max()),
            "itl_mean": float(itl.mean()), "model_sent_mean": statistics.fmean(at_sends),
            "spread": float(sent.max() - sent.min())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="llama-3.1-8b-h100")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    profile = profiles.load_profile(args.profile)
    for batch, prompt in CASES:
        if batch > 1 and batch * prompt > profile.max_batched_tokens:
            raise SystemExit(f"case {batch} x {prompt} exceeds one step's token budget")
    cores = os.cpu_count() or 1
    os.sched_setaffinity(0, {0})
    process = subprocess.Popen(
        [sys.executable, "-m", "scaler", "sim-server", "--profile", args.profile,
         "--port", "0"], stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {1 % cores}))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"on (http://\S+)/v1", line)
        if not found:
            raise SystemExit(f"sim-server did not start: {line!r}")
        url = found.group(1)
        print(f"profile {profile.name}: step {profile.decode_step.base_seconds * 1e3:g} ms + "
              f"{profile.decode_step.per_sequence_seconds * 1e3:g} ms per sequence, prefill "
              f"{profile.prefill_tokens_per_second:g} tok/s; {OUTPUT_TOKENS}-token outputs, "
              f"median of {args.rounds} rounds")
        print("| batch | prompt | ITL model | ITL served | TTFT model, all at once (mean "
              "/ max) | sends spread over | TTFT model at the sends (mean) | TTFT served "
              "(mean / max) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for batch, prompt in CASES:
            rounds = [measure(url, profile=profile, batch=batch, prompt=prompt)
                      for _ in range(args.rounds)]
            got = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            together = model_ttft_s(profile, prompt=prompt, arrivals_s=[0.0] * batch)
            print(f"| {batch} | {prompt} | {model_itl_s(profile, batch=batch) * 1e3:.2f} ms | "
                  f"{got['itl_mean'] * 1e3:.2f} ms | {statistics.fmean(together) * 1e3:.1f} / "
                  f"{max(together) * 1e3:.1f} ms | {got['spread'] * 1e3:.1f} ms | "
                  f"{got['model_sent_mean'] * 1e3:.1f} ms | {got['ttft_mean'] * 1e3:.1f} / "
                  f"{got['ttft_max'] * 1e3:.1f} ms |", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    main()
