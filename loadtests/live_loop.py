"""The closed loop on real sockets: a trace slice, sim-server replicas, `scaler run` scaling them.

    .venv/bin/python -m loadtests.live_loop --policy loadtests/live-llama-8b.yaml \\
        --trace loadtests/traces/AzureLLMInferenceTrace_code_20min.csv \\
        --start 0 --duration 600 --rate-scale 2 --out /tmp/live

What runs, all on 127.0.0.1, each part a real process where a cluster has one:
- a nats-server (the pinned binary) and the Kubernetes API emulator (in this process);
- `scaler run` (a subprocess, the real service) against the emulator and the nats-server;
- `scaler.demo.replica_controller`: the emulator's Deployment `spec.replicas` -> `scaler
  sim-server` processes (one per pod), started with the profile's cold start (node boot
  when the pool has no free GPU), drained on scale-down; the only writer of the
  Deployment's status (the emulator's status writer is off);
- `scaler.sim.proxy` in this process: least-outstanding routing over the Ready replicas,
  SSE relayed as it arrives, requests held while none is ready (the simulator's gateway);
- the load: `scaler.sim.loadtest` (the library `scaler loadtest` runs) in a subprocess of
  its own, so its schedule is not delayed by the proxy's work, open loop, streaming.

Every sim-server publishes its DESIGN 4.2 signals to the nats-server; the service scales
the Deployment from them. Afterwards the same slice is simulated (`scaler simulate`'s
`run.simulate`, strategy scaler, same policy, profile and initial replicas) and both
reports and their comparison are written to --out:

    live.json        the live run: `scaler loadtest`'s keys, GPU-hours from the replica
                     timeline, and the timeline itself
    simulated.json   `scaler simulate --json` for the slice
    comparison.json  p95 TTFT, SLO attainment, GPU-hours, max replicas side by side,
                     and the simulator replaying the live decisions (the serving
                     model's error alone)

No time compression: every part runs on the wall clock (see docs/simulation.md, "Live vs
simulated", for why --speed other than 1 is refused).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scaler import emulator as kube_emulator
from scaler.demo import nats_server
from scaler.demo import replica_controller as replicas
from scaler.policy import loader
from scaler.policy import model as policy_model
from scaler.sim import cluster as sim_cluster
from scaler.sim import live_replicas, loadtest, profiles, proxy, report, run, traces

REPO = Path(__file__).resolve().parents[1]
LIVE = "live"
# Bounds on waits that only have to be far above what the step needs on a busy machine:
# the service's start, and the initial replicas' beyond their profile's cold start.
SERVICE_TIMEOUT_S = 60.0
READY_SLACK_S = 60.0
# After the slice's last request is sent, how long in-flight ones get (the simulator's
# drain tail), and the per-request limit of the load generator.
DRAIN_TAIL_S = sim_cluster.DRAIN_TAIL_S
REQUEST_TIMEOUT_S = 300.0
# The rows of the comparison: (key in both summaries, label).
COMPARED = (("p95_latency_s", "p95 latency (s)"), ("p50_latency_s", "p50 latency (s)"),
            ("slo_attainment", "SLO attainment"), ("p95_windows_met_all", "p95 windows met"),
            ("gpu_hours", "GPU-hours"), ("max_replicas", "max replicas"),
            ("scale_events", "scale events"), ("completed", "completed"))


class LoopError(Exception):
    """Bad input or a part that did not start; the message says which (exit 2)."""


@dataclass(frozen=True, slots=True)
class Inputs:
    trace: traces.Trace
    policy: policy_model.ScalePolicy
    profile: profiles.ReplicaProfile
    profile_ref: str
    initial: int
    warmup_s: float


def load_inputs(args: argparse.Namespace) -> Inputs:
    """The policy (one Deployment, no placeholder pods), its profile and the trace slice,
    or LoopError naming the file and what is wrong."""
    if args.speed != 1.0:
        raise LoopError(
            f"--speed {args.speed:g}: only real time (1) is honest here. The service's "
            "windows, tick and Lease run on its own clock, and a sim-server at --speed X "
            "reports rates and latencies in wall seconds (X times off); use a profile and "
            "policy with short cold starts and windows instead (docs/simulation.md)")
    result = loader.load_paths([args.policy])
    if result.errors:
        raise LoopError("; ".join(str(error) for error in result.errors))
    if not result.policies:
        raise LoopError(f"{args.policy}: no ScalePolicy document")
    policy = result.policies[0]
    spec = policy.spec
    if (spec.target.api_version, spec.target.kind) != ("apps/v1", "Deployment"):
        raise LoopError(f"{args.policy}: spec.target must be an apps/v1 Deployment")
    if spec.node_pool is not None and spec.node_pool.actuator != "none":
        raise LoopError(
            f"{args.policy}: spec.nodePool.actuator is {spec.node_pool.actuator!r}; the live "
            "loop runs no placeholder pods or node actuator, so set it to 'none' (the "
            "simulator then plans no placeholders either)")
    ref = spec.profile or "llama-3.1-8b-h100"
    # A profile path in the policy is relative to the working directory, as for simulate.
    if Path(ref).suffix in (".yaml", ".yml"):
        ref = str(Path(ref).resolve())
    try:
        profile = profiles.load_profile(ref)
        trace = traces.load_trace(args.trace, args.trace_format, rate_scale=args.rate_scale,
                                  seed=args.seed, start_s=args.start,
                                  max_duration_s=args.duration)
    except (profiles.ProfileError, traces.TraceError, ValueError) as exc:
        raise LoopError(str(exc)) from None
    if trace.requests == 0:
        raise LoopError(f"no requests in the chosen slice of {args.trace}")
    initial = args.initial if args.initial is not None else run.initial_replicas_for(
        trace, policy=policy, profile=profile)
    return Inputs(trace=trace, policy=policy, profile=profile, profile_ref=ref,
                  initial=initial, warmup_s=args.warmup)


# -- the load generator, in its own process ----------------------------------------------


async def drive(spec: dict[str, Any]) -> dict[str, Any]:
    """Send the warm-up (the slice's first `warmup_s` at their times played backwards,
    `traces.warmup`, as the simulator sends it before t=0) and then, from t=0, the
    slice; score the slice alone. Returns the live summary, details and series, t=0 as
    an epoch, and the tokens of completed requests."""
    data = np.load(spec["requests"])
    arrival, inputs, outputs = data["arrival_s"], data["input_tokens"], data["output_tokens"]
    requests = [loadtest.Request(float(t), int(i), int(o))
                for t, i, o in zip(arrival, inputs, outputs, strict=True)]
    warmup_s = float(spec["warmup_s"])
    sent, repeats = traces.warmup(arrival, warmup_s)
    warm = [loadtest.Request(float(t), int(inputs[i]), int(outputs[i]))
            for t, i in zip(sent, repeats, strict=True)]
    target = loadtest.Target(url=spec["url"], model=spec["model"], timeout_s=REQUEST_TIMEOUT_S)

    async def measured() -> tuple[float, loadtest.LiveRun]:
        await asyncio.sleep(warmup_s if warm else 0.0)
        # loadtest.run puts its t=0 LEAD_S after it is called.
        t0 = time.time() + loadtest.LEAD_S
        # The parent gives the service its policy now: the engine starts at t=0.
        print(f"t0 {t0!r}", flush=True)
        return t0, await loadtest.run(requests, target)

    jobs: list[Any] = [measured()]
    if warm:
        jobs.append(loadtest.run(warm, target))
    (t0, live), *_ = await asyncio.gather(*jobs)
    metric, threshold = spec["slo_metric"], spec["slo_s"]
    prompt_tokens, generated_tokens = loadtest.served_tokens(live.records)
    return {
        "t0_epoch": t0,
        "summary": loadtest.summary(live, metric=metric, threshold_s=threshold),
        "details": {**loadtest.details(live),
                    **loadtest.client_health(live, max_lag_ms=spec["max_lag_ms"])},
        "series": loadtest.series(live, metric=metric),
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated_tokens,
    }


def drive_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    result = asyncio.run(drive(spec))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


# -- the loop ----------------------------------------------------------------------------


def service_settings(*, kube_url: str, nats_url: str, http_port: int) -> dict[str, Any]:
    """`scaler run`'s settings file: the emulator, the nats-server, loopback HTTP; no
    external metrics API or ScalePolicy resources (nothing here reads them)."""
    return {
        "kube": {"host": kube_url},
        "nats": {"servers": [nats_url]},
        "http": {"host": "127.0.0.1", "port": http_port},
        "metrics_api": {"enabled": False},
        # A new policy file is read within 0.2 s (the engine's start at t=0, see live_run).
        "policies": {"resources": False, "reload_poll_seconds": 0.2},
        "log": {"format": "text", "level": "INFO"},
    }


async def _wait_http(url: str, *, timeout_s: float, process: asyncio.subprocess.Process,
                     what: str) -> None:
    """Poll `url` until it answers 200; LoopError if `process` exits or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    def get() -> int:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return int(response.status)

    while loop.time() < deadline:
        if process.returncode is not None:
            raise LoopError(f"{what} exited with {process.returncode} before it was ready")
        with contextlib.suppress(OSError):
            if await asyncio.to_thread(get) == 200:
                return
        await asyncio.sleep(0.2)
    raise LoopError(f"{what} not ready at {url} within {timeout_s:g} s")


async def live_run(inputs: Inputs, *, out: Path, policy_path: Path, nats_url: str,
                   max_lag_ms: float) -> dict[str, Any]:
    """Run the loop once; returns the driver's result plus the replica timeline."""
    policy, profile = inputs.policy, inputs.profile
    spec = policy.spec
    pool = run.pool_for(policy, profile)
    pool_name = spec.node_pool.name if spec.node_pool is not None else "gpu-pool"
    selector = dict(spec.node_pool.node_selector) if spec.node_pool is not None else {}
    target = replicas.Target(
        namespace=policy.metadata.namespace, name=spec.target.name,
        served_model=policy.metadata.name, profile_path=Path(inputs.profile_ref),
        gpus_per_replica=spec.resources.gpus_per_replica,
        resource_name=spec.resources.resource_name, pool=pool, pool_name=pool_name,
        node_labels=replicas.node_labels(pool_name, selector))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    trace = inputs.trace
    np.savez(out / "requests.npz", arrival_s=trace.arrival_s, input_tokens=trace.input_tokens,
             output_tokens=trace.output_tokens)
    emulator = kube_emulator.KubeEmulator(
        clock=time.time, options=kube_emulator.EmulatorOptions(status_writer=False))
    kube_url = await emulator.start()
    balancer = proxy.Proxy()
    controller = replicas.ReplicaController(emulator, target, profile=profile,
                                            balancer=balancer, nats_url=nats_url,
                                            log_dir=logs)
    controller.create_deployment(replicas=inputs.initial)
    service: asyncio.subprocess.Process | None = None
    driver: asyncio.subprocess.Process | None = None
    ctl = asyncio.create_task(controller.run(), name="replica-controller")
    try:
        async with proxy.running(balancer, nats_url=nats_url, model_key=policy.key) as url:
            # The service starts with no policy and is given it at t=0, so that it decides
            # from t=0 on what it has seen since, as the simulated engine (first asked at
            # t=0, with the warm-up's load on the replicas but none of its signals).
            policies = out / "policies"
            policies.mkdir(exist_ok=True)
            for old in policies.iterdir():
                old.unlink()
            http_port = nats_server.free_port()
            settings = out / "service-settings.yaml"
            settings.write_text(yaml.safe_dump(service_settings(
                kube_url=kube_url, nats_url=nats_url, http_port=http_port)))
            with (logs / "service.log").open("wb") as service_log:
                service = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "scaler", "run", "--settings", str(settings),
                    "--policies", str(policies), cwd=REPO,
                    stdout=service_log, stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL)
            # The initial replicas start meanwhile (the service has no policy yet).
            await _wait_http(f"http://127.0.0.1:{http_port}/readyz", timeout_s=SERVICE_TIMEOUT_S,
                             process=service, what="scaler run")
            await _until(lambda: sum(r.phase == "ready" for r in controller.replicas.values())
                         >= inputs.initial, timeout_s=READY_SLACK_S + profile.cold_start.
                         pod_start_seconds + profile.cold_start.node_boot_seconds,
                         what=f"{inputs.initial} initial replicas Ready")
            _say(f"{inputs.initial} replicas Ready, scaler run ready on "
                 f"http://127.0.0.1:{http_port}; sending {trace.requests} requests after a "
                 f"{inputs.warmup_s:g} s warm-up")
            metric, threshold = run.slo_of(policy)
            drive_spec = {"requests": str(out / "requests.npz"), "warmup_s": inputs.warmup_s,
                          "url": url, "model": policy.metadata.name, "slo_metric": metric,
                          "slo_s": threshold, "max_lag_ms": max_lag_ms,
                          "out": str(out / "driver.json")}
            (out / "driver-spec.json").write_text(json.dumps(drive_spec))
            driver = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "loadtests.live_loop", "--drive",
                str(out / "driver-spec.json"), cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE)
            limit = inputs.warmup_s + trace.duration_s + DRAIN_TAIL_S + 60.0
            code = await asyncio.wait_for(_give_policy_at_t0(
                driver, policy=policy_path, folder=policies), limit)
            if code != 0:
                raise LoopError(f"the load generator exited with {code}")
    finally:
        for process in (driver, service):
            if process is not None:
                await replicas.stop_process(process)
        ctl.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ctl
        await emulator.stop()
    result: dict[str, Any] = json.loads((out / "driver.json").read_text())
    result["replicas"] = controller.replicas
    result["samples"] = controller.samples
    return result


async def _give_policy_at_t0(driver: asyncio.subprocess.Process, *, policy: Path,
                             folder: Path) -> int:
    """Copy the policy into the service's folder when the driver says t=0 has come (a
    rename, so the service never reads half a file); the driver's exit code."""
    assert driver.stdout is not None
    while line := await driver.stdout.readline():
        if line.startswith(b"t0 "):
            staged = folder / ".policy.yaml.tmp"
            staged.write_bytes(policy.read_bytes())
            staged.rename(folder / "policy.yaml")
    return await driver.wait()


def _say(text: str) -> None:
    print(f"live_loop: {text}", file=sys.stderr, flush=True)


async def _until(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise LoopError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(0.05)


# -- the reports (pure) ------------------------------------------------------------------


def live_summary(result: dict[str, Any], *, inputs: Inputs) -> dict[str, float | int]:
    """`scaler simulate`'s per-strategy keys for the live run: the load generator's
    latencies, and GPU-hours, cost, scale events and max replicas from the controller's
    timeline (`live_replicas.summary`: each pod billed from creation until gone, draining
    included, over [0, duration] of the slice, as the simulator bills it)."""
    t0 = float(result["t0_epoch"])
    trace, policy, profile = inputs.trace, inputs.policy, inputs.profile
    gpus = policy.spec.resources.gpus_per_replica
    recorded = live_replicas.Timeline(source="replica controller")
    for sample in result["samples"]:
        recorded.record(at=sample.at, desired=sample.desired, allocated=sample.allocated,
                        ready=sample.ready)
    summary = dict(result["summary"])
    end = max((r.gone_at or t0) - t0 for r in result["replicas"].values())
    summary.update(live_replicas.summary(
        recorded, origin=t0, until_s=trace.duration_s, end_s=max(end, trace.duration_s),
        gpus_per_replica=gpus, gpu_hourly=policy.spec.cost.gpu_hourly,
        useful_gpu_s=live_replicas.useful_gpu_seconds(
            profile, prompt_tokens=result["prompt_tokens"],
            generated_tokens=result["generated_tokens"], gpus_per_replica=gpus),
        completed=int(summary["completed"])))
    return summary


def timeline(result: dict[str, Any]) -> dict[str, Any]:
    """The replica timeline in seconds from t=0 (negative: before the slice began)."""
    t0 = float(result["t0_epoch"])

    def rebased(value: float | None) -> float | None:
        return None if value is None else round(value - t0, 3)

    pods = []
    for record in result["replicas"].values():
        row = record.to_json()
        for key in ("created_at", "scheduled_at", "started_at", "ready_at", "drain_at",
                    "gone_at"):
            row[key] = rebased(row[key])
        pods.append(row)
    return {
        "t": [rebased(s.at) for s in result["samples"]],
        "desired": [s.desired for s in result["samples"]],
        "ready": [s.ready for s in result["samples"]],
        "allocated": [s.allocated for s in result["samples"]],
        "nodes": [s.nodes for s in result["samples"]],
        "pods": pods,
        "max_late_start_s": max((p["late_s"] for p in pods), default=0.0),
    }


def live_document(result: dict[str, Any], *, inputs: Inputs, args: argparse.Namespace
                  ) -> dict[str, Any]:
    trace = inputs.trace
    metric, threshold = run.slo_of(inputs.policy)
    return {
        "trace": {"path": trace.path, "requests": trace.requests,
                  "duration_s": round(trace.duration_s, 3), "rate_scale": trace.rate_scale},
        "policy": inputs.policy.name,
        "slo": {"metric": metric, "threshold_s": threshold},
        "strategies": {LIVE: live_summary(result, inputs=inputs)},
        "loadtest": {**result["details"], "series": result["series"]},
        "live_loop": {"initial_replicas": inputs.initial, "warmup_s": inputs.warmup_s,
                      "speed": args.speed, "profile": inputs.profile.name,
                      "routing": "least outstanding", "replicas": timeline(result)},
    }


def compare(live: dict[str, float | int], simulated: dict[str, float | int],
            replayed: dict[str, float | int]) -> dict[str, dict[str, float | None]]:
    """Per COMPARED key: both values, live - simulated and that relative to simulated,
    and the simulator with the live decisions (`replayed`) with live's difference to it."""

    def relative(a: float, b: float) -> float | None:
        return round((a - b) / b, 4) if b else None

    rows: dict[str, dict[str, float | None]] = {}
    for key, _ in COMPARED:
        a, b, c = float(live[key]), float(simulated[key]), float(replayed[key])
        rows[key] = {LIVE: a, "simulated": b, "difference": round(a - b, 4),
                     "relative": relative(a, b), "replayed": c,
                     "replayed_relative": relative(a, c)}
    return rows


@dataclass(frozen=True, slots=True)
class LiveDecisions:
    """A strategy that sets spec.replicas as the live service did (the controller's
    timeline, seconds from t=0): the simulator with the live decisions, so what is left
    of the difference is the serving model's (replicas, routing, start chain)."""

    times: tuple[float, ...]
    desired: tuple[int, ...]
    name: str = "live-decisions"
    period_s: float = 0.1

    def decide(self, cluster: sim_cluster.SimCluster, *, now: float) -> int:
        index = max(0, bisect.bisect_right(self.times, now) - 1)
        return self.desired[index]


def replay_live_decisions(result: dict[str, Any], *, inputs: Inputs) -> dict[str, float | int]:
    """`scaler simulate`'s summary of the slice on the simulated cluster, spec.replicas
    following the live timeline (same initial replicas, warm-up and feasibility)."""
    t0 = float(result["t0_epoch"])
    samples: list[replicas.Sample] = result["samples"]
    before = [s for s in samples if s.at <= t0][-1:]
    after = [s for s in samples if s.at > t0]
    strategy = LiveDecisions(times=tuple(s.at - t0 for s in before + after),
                             desired=tuple(s.desired for s in before + after))
    trace, policy, profile = inputs.trace, inputs.policy, inputs.profile
    cluster = run.run_strategy(strategy, trace=trace, profile=profile,
                               pool=run.pool_for(policy, profile), policy=policy,
                               initial_replicas=inputs.initial)
    metric, threshold = run.slo_of(policy)
    return run.summarize(cluster, policy=policy, metric=metric, threshold=threshold,
                         feasible_windows=run.feasible(trace, profile=profile, metric=metric,
                                                       threshold=threshold))


def table(rows: dict[str, dict[str, float | None]]) -> str:
    lines = [f"{'':<18}{'live':>10}{'simulated':>11}{'difference':>12}{'relative':>10}"
             f"{'sim, live decisions':>21}{'relative':>10}"]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1%}"

    for key, label in COMPARED:
        row = rows[key]
        lines.append(f"{label:<18}{row[LIVE]:>10.4g}{row['simulated']:>11.4g}"
                     f"{row['difference']:>+12.4g}{share(row['relative']):>10}"
                     f"{row['replayed']:>21.4g}{share(row['replayed_relative']):>10}")
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.live_loop",
        description="Replay a trace slice against sim-server replicas scaled by the real "
        "`scaler run`, then simulate the same slice; write both and their comparison.")
    parser.add_argument("--trace", type=Path, help="trace file (or ServeGen folder)")
    parser.add_argument("--trace-format", choices=traces.FORMATS, default="auto")
    parser.add_argument("--policy", type=Path, help="ScalePolicy YAML (nodePool.actuator "
                        "none; spec.profile names the replica profile, or a profile YAML)")
    parser.add_argument("--start", type=float, default=None, metavar="SECONDS",
                        help="start SECONDS into the trace (its own clock)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="replay SECONDS of the trace")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", type=float, default=1.0,
                        help="time compression; only 1 (real time) is accepted, see "
                        "docs/simulation.md")
    parser.add_argument("--warmup", type=float, default=run.WARMUP_S, metavar="SECONDS",
                        help="replay the slice's first SECONDS before t=0, as the simulator "
                        f"does (default {run.WARMUP_S:g}, the simulator's)")
    parser.add_argument("--initial", type=int, default=None, metavar="N",
                        help="replicas Ready at t=0 on both sides (default: the simulator's "
                        "start for the slice)")
    parser.add_argument("--max-lag-ms", type=float, default=loadtest.DEFAULT_MAX_LAG_MS)
    parser.add_argument("--out", type=Path, help="folder for the reports")
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.drive is not None:
        return drive_main(args.drive)
    missing = [flag for flag in ("trace", "policy", "out") if getattr(args, flag) is None]
    if missing:
        print(f"live_loop: missing --{', --'.join(missing)}", file=sys.stderr)
        return 2
    if args.warmup < 0 or (args.initial is not None and args.initial < 0):
        print("live_loop: --warmup and --initial must not be negative", file=sys.stderr)
        return 2
    try:
        inputs = load_inputs(args)
    except LoopError as exc:
        print(f"live_loop: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not math.isclose(inputs.warmup_s, run.WARMUP_S):
        print(f"live_loop: note: a {inputs.warmup_s:g} s warm-up live, the simulator's "
              f"{run.WARMUP_S:g} s simulated", file=sys.stderr)
    with nats_server.NatsServer(jetstream=False) as nats:
        try:
            result = asyncio.run(live_run(inputs, out=out, policy_path=args.policy,
                                          nats_url=nats.url, max_lag_ms=args.max_lag_ms))
        except LoopError as exc:
            print(f"live_loop: {exc} (logs in {out / 'logs'})", file=sys.stderr)
            return 2
    live = live_document(result, inputs=inputs, args=args)
    (out / "live.json").write_text(json.dumps(live, indent=2) + "\n")
    simulated = run.simulate(inputs.trace, policy=inputs.policy, profile=inputs.profile,
                             names=["scaler"], initial=inputs.initial)
    report.write_json(simulated, out / "simulated.json")
    sim_summary = simulated.results["scaler"].summary
    rows = compare(live["strategies"][LIVE], sim_summary,
                   replay_live_decisions(result, inputs=inputs))
    (out / "comparison.json").write_text(json.dumps({
        "trace": live["trace"], "policy": live["policy"], "slo": live["slo"],
        "initial_replicas": inputs.initial, "valid": live["loadtest"]["valid"],
        "rows": rows}, indent=2) + "\n")
    trace = inputs.trace
    print(f"trace {trace.path}: {trace.requests} requests over {trace.duration_s:.0f} s "
          f"(rate scale {trace.rate_scale:g}); policy {inputs.policy.name}; profile "
          f"{inputs.profile.name}; {inputs.initial} replicas at t=0")
    print(table(rows))
    if not live["loadtest"]["valid"]:
        print("live_loop: the load generator's schedule lag was over --max-lag-ms: the live "
              "latencies are not the servers' alone", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
