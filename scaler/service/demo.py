"""`scaler demo`: the real service scaling a simulated GPU cluster over an embedded NATS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from nats.aio.client import Client

from scaler import testing
from scaler.policy import loader
from scaler.service import demo_cluster, logs, runner
from scaler.service import settings as service_settings
from scaler.service import state as service_state
from scaler.sim import profiles, report, run, strategies, traces
from scaler.testing import nats_server

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = REPO_ROOT / "config" / "llama-8b.yaml"
DEFAULT_TRACE = REPO_ROOT / "loadtests" / "traces" / "AzureLLMInferenceTrace_conv_20min.csv"
# Conv x8 is ~40 req/s of 1,155-token prompts and 211-token answers: about five 8B
# replicas at saturation (13.5 req/s each), so the service has to scale several up from
# the first minute's four, and back when bursts pass.
DEFAULT_RATE_SCALE = 8.0
# 60 virtual seconds per real second: a 105 s cold start takes 1.75 s to watch, and the
# whole 20-minute slice replays in 20 s.
DEFAULT_SPEED = 60.0
DEFAULT_DURATION_S = 1200.0

# The replay loop wakes every 20 ms of real time: at 60x that is 1.2 virtual seconds, about
# one report per replica per wake-up. A wake-up runs at most 50 steps of 0.1 s (5 virtual
# s) before yielding, so NATS messages and evaluations interleave with the simulation.
TICK_S = 0.02
MAX_STEPS_PER_TICK = 50
# The simulation may fall this far behind the virtual clock before the clock is held back.
# A report's age when the service reads it is this lag plus NATS delivery; 5 virtual s
# keeps it well inside the policies' 30 s staleAfterSeconds (at 300x, 5 s is 17 ms real).
MAX_LAG_S = 5.0
# The live view redraws 4 times a second; plain lines are checked for 20 times a second
# (1 s real is 60 virtual s at the default speed) and print a status every virtual minute.
LIVE_REFRESH_S = 0.25
PLAIN_REFRESH_S = 0.05
STATUS_EVERY_S = 60.0

# The service's loop-time periods in a real deployment (settings defaults); the demo
# divides them by the speed so that, in virtual time, they are what they would be.
BACKSTOP_TICK_S = 5.0
POLICY_POLL_S = 2.0


class DemoError(Exception):
    """Bad input (a policy, trace or option): the message says what, exit code 2."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    policy: Path = DEFAULT_POLICY
    trace: Path = DEFAULT_TRACE
    trace_format: traces.TraceFormat = "auto"
    rate_scale: float = DEFAULT_RATE_SCALE
    seed: int = 0
    speed: float = DEFAULT_SPEED
    duration_s: float = DEFAULT_DURATION_S
    initial_replicas: int | None = None
    report: Path | None = None
    json_path: Path | None = None
    ui: bool = True
    metrics_api: bool = False
    log_level: str = "WARNING"


class VirtualClock:
    """The service's wall clock: `start_epoch + speed x (loop time since begin())`.

    Frozen at `start_epoch` until `begin()`, so the service's start-up (policy load, first
    evaluation) happens at the trace's first instant. `loop_time` is the event loop's
    monotonic clock (`loop.time`), which is safe to read from worker threads too. When
    the simulation cannot keep up (a busy machine, a high speed), `hold_back` slows the
    clock instead of letting replicas' reports arrive stale; it never runs backwards.
    """

    def __init__(self, *, loop_time: Callable[[], float], start_epoch: float,
                 speed: float) -> None:
        self.loop_time = loop_time
        self.start_epoch = start_epoch
        self.speed = speed
        self.held_back_s = 0.0
        self._origin: float | None = None
        self._floor = 0.0

    def begin(self) -> None:
        self._origin = self.loop_time()

    def _raw(self) -> float:
        if self._origin is None:
            return 0.0
        return self.speed * (self.loop_time() - self._origin)

    def elapsed(self) -> float:
        """Virtual seconds since begin(), never less than a value already returned."""
        self._floor = max(self._floor, self._raw())
        return self._floor

    def hold_back(self, *, limit: float) -> None:
        """Move the clock's origin so that it reads at most `limit` (virtual seconds) now;
        readings already given stay (the clock pauses until it passes them again)."""
        excess = self._raw() - limit
        if excess > 0 and self._origin is not None:
            self._origin += excess / self.speed
            self.held_back_s += excess

    def __call__(self) -> float:
        return self.start_epoch + self.elapsed()


@dataclass(slots=True)
class Replay:
    """What the replay did, for the summary: counts, lag behind the clock, interruption."""

    interrupted: bool = False
    failed: str | None = None
    published: int = 0
    max_lag_s: float = 0.0
    held_back_s: float = 0.0
    replayed_s: float = 0.0
    real_s: float = 0.0
    http_url: str | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    evaluations: dict[str, int] = field(default_factory=dict)


# -- building the simulated models -------------------------------------------------------


Models = dict[str, demo_cluster.SimulatedModel]


def load_models(options: DemoOptions) -> tuple[traces.Trace, Models]:
    """The trace slice and one simulated cluster per policy in `options.policy`."""
    if options.speed <= 0 or options.duration_s <= 0 or options.rate_scale <= 0:
        raise DemoError("--speed, --duration and --rate-scale must be positive")
    for output in (options.report, options.json_path):
        if output is not None and not output.parent.is_dir():
            raise DemoError(f"cannot write {output}: no folder {output.parent}")
    result = loader.load_paths([options.policy])
    if result.errors:
        raise DemoError("invalid policy:\n" + "\n".join(str(e) for e in result.errors))
    if not result.policies:
        raise DemoError(f"no ScalePolicy in {options.policy}")
    try:
        full = traces.load_trace(options.trace, options.trace_format,
                                 rate_scale=options.rate_scale, seed=options.seed)
    except traces.TraceError as error:
        raise DemoError(str(error)) from None
    trace = demo_cluster.slice_trace(full, duration_s=options.duration_s)
    if trace.requests == 0:
        raise DemoError(f"no requests in the first {options.duration_s:g} s of {options.trace}")
    prefix = service_settings.NatsSettings().subject_prefix
    models: dict[str, demo_cluster.SimulatedModel] = {}
    for policy in result.policies:
        subject = demo_cluster.subject_of(policy, prefix=prefix)
        if subject is None:
            raise DemoError(f"policy {policy.key} has no spec.sources.nats: the demo's "
                            "replicas report over NATS")
        try:
            profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
        except profiles.ProfileError as error:
            raise DemoError(str(error)) from None
        initial = options.initial_replicas
        if initial is None:
            initial = run.initial_replicas(policy, strategies.oracle_need(trace, profile))
        models[policy.key] = demo_cluster.SimulatedModel(
            policy=policy, profile=profile, trace=trace, initial_replicas=initial,
            subject=subject)
    return trace, models


def service_settings_for(options: DemoOptions, *, nats_url: str) -> service_settings.Settings:
    """The service's settings: embedded NATS, loopback HTTP, loop periods scaled by 1/speed.

    Environment variables are ignored: the demo must not pick up a real deployment's
    settings (its NATS, its policies) by accident.
    """
    base = service_settings.load_settings(environ={})
    return base.model_copy(update={
        "nats": service_settings.NatsSettings(servers=(nats_url,), reconnect_base_s=0.05),
        "http": service_settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": service_settings.MetricsApiSettings(
            enabled=options.metrics_api, host="127.0.0.1", port=0),
        # 5 s and 2 s in virtual time: at 60x, every 83 ms and 33 ms of real time.
        "engine": service_settings.EngineSettings(
            backstop_tick_seconds=BACKSTOP_TICK_S / options.speed),
        "policies": service_settings.PolicySettings(
            paths=[options.policy], reload_poll_seconds=POLICY_POLL_S / options.speed),
        # No Prometheus in the demo: a closed loopback port, so a policy's Prometheus
        # source fails fast (logged at debug) instead of querying whatever runs on 9090.
        "prometheus": base.prometheus.model_copy(
            update={"url": f"http://127.0.0.1:{testing.free_port()}"}),
        "log": service_settings.LogSettings(level=options.log_level, format="text"),
    })


# -- the live run -------------------------------------------------------------------------


class Demo:
    """Runs the service against the simulated models until the duration or a signal."""

    def __init__(self, options: DemoOptions, *, trace: traces.Trace,
                 models: dict[str, demo_cluster.SimulatedModel], nats_url: str,
                 out: TextIO) -> None:
        self.options = options
        self.trace = trace
        self.models = models
        self.nats_url = nats_url
        self.out = out
        self.replay = Replay()

    async def run(self) -> Replay:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        clock = VirtualClock(loop_time=loop.time, start_epoch=self.trace.start_s,
                             speed=self.options.speed)
        service = runner.Service(
            service_settings_for(self.options, nats_url=self.nats_url), wall_clock=clock,
            identity="scaler-demo", drain_timeout_s=5.0,
            backend=demo_cluster.backend(self.models))
        publisher = Client()
        view_task: asyncio.Task[None] | None = None
        started = time.monotonic()
        try:
            await publisher.connect(servers=[self.nats_url], connect_timeout=5,
                                    max_reconnect_attempts=-1, reconnect_time_wait=1,
                                    error_cb=_quiet, disconnected_cb=_quiet_disconnect)
            await service.start()
            await asyncio.wait_for(service.nats.wait_ready(), timeout=10)
            self.replay.http_url = service.http.url if service.http else None
            self._banner(service)
            view = make_view(self.options, models=self.models, state=service.state,
                             clock=clock, out=self.out)
            clock.begin()
            started = time.monotonic()
            view_task = loop.create_task(view.run(), name="demo-view")
            await self._replay(clock=clock, service=service, publisher=publisher, stop=stop)
            view_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view_task
            view.close()
        finally:
            self.replay.real_s = time.monotonic() - started
            if view_task is not None and not view_task.done():
                view_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await view_task
            self.replay.dropped = {f"{source}/{reason}": count for (source, reason), count
                                   in sorted(service.state.dropped().items())}
            for key in self.models:
                status = service.state.status(key)
                self.replay.evaluations[key] = sum(status.decisions.values()) if status else 0
            await service.stop()
            if not publisher.is_closed:
                await publisher.close()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
        return self.replay

    async def _replay(self, *, clock: VirtualClock, service: runner.Service,
                      publisher: Client, stop: asyncio.Event) -> None:
        """Step every model to the virtual clock and publish what its replicas report."""
        duration = self.options.duration_s
        replay = self.replay
        models = list(self.models.values())
        while True:
            if stop.is_set():
                replay.interrupted = True
                return
            if service.supervisor.failed.is_set():
                failures = service.supervisor.failures
                replay.failed = "; ".join(f"{f.name}: {f.error}" for f in failures) or "failed"
                return
            target = min(clock.elapsed(), duration)
            for model in models:
                for message in model.advance_to(target, max_steps=MAX_STEPS_PER_TICK):
                    await publisher.publish(message.subject, message.body)
                    replay.published += 1
            slowest = min(m.now for m in models)
            replay.replayed_s = min(slowest, duration)
            if all(m.now >= duration - 1e-9 or m.finished for m in models):
                replay.replayed_s = duration
                return
            lag = clock.elapsed() - slowest
            replay.max_lag_s = max(replay.max_lag_s, lag)
            if lag > MAX_LAG_S:
                clock.hold_back(limit=slowest + MAX_LAG_S)
                replay.held_back_s = clock.held_back_s
            # Behind the clock (a slow machine or a high --speed): yield without sleeping.
            behind = lag > models[0].cluster.dt
            await asyncio.sleep(0 if behind else TICK_S)

    def _banner(self, service: runner.Service) -> None:
        trace, options = self.trace, self.options
        first = next(iter(self.models.values()))
        lines = [
            f"scaler demo: {trace.requests} requests from {Path(trace.path).name} "
            f"(rate x{trace.rate_scale:g}) over {options.duration_s:g} virtual s at "
            f"{options.speed:g}x (about {options.duration_s / options.speed:.0f} s)",
            f"  nats-server  {self.nats_url} (embedded; replicas publish on "
            f"{first.subject})",
        ]
        if service.http is not None:
            lines.append(f"  service      {service.http.url}  (scaler explain "
                         f"{first.policy.metadata.name} --url {service.http.url})")
        if service.metrics_api is not None:
            lines.append(f"  metrics API  {service.metrics_api.url}")
        for model in self.models.values():
            lines.append(f"  model        {model.key}: profile {model.profile.name}, "
                         f"{model.initial_replicas} replicas ready at start")
        print("\n".join(lines), file=self.out, flush=True)


async def _quiet(error: Exception) -> None:
    # A Ctrl-C on a terminal reaches the embedded nats-server too (same process group), so
    # it may be gone before the publisher closes: that is shutdown, not an error to print.
    log.debug("demo publisher: %r", error)


async def _quiet_disconnect() -> None:
    log.debug("demo publisher disconnected")


# -- terminal output ----------------------------------------------------------------------


def _fmt_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%H:%M:%SZ")


def _fmt_offset(seconds: float) -> str:
    whole = int(max(0.0, seconds))
    return f"+{whole // 60:02d}:{whole % 60:02d}"


@dataclass(frozen=True, slots=True)
class ModelLine:
    """What the view shows of one model at one moment."""

    key: str
    arrival_rate: float
    waiting: int
    running: int
    ready: int
    starting: int
    desired: int
    nodes: int
    decision: str
    winner: str
    p95_s: float | None
    slo_s: float | None
    metric: str


def model_line(model: demo_cluster.SimulatedModel, state: service_state.ServiceState
               ) -> ModelLine:
    ready, starting = model.ready_starting()
    waiting, running = model.in_system()
    status = state.status(model.key)
    last = status.last if status is not None else None
    guard = model.policy.spec.signals.p95_latency
    p95 = last.snapshot.p95_latency_s if last is not None else None
    return ModelLine(
        key=model.key, arrival_rate=model.arrival_rate(), waiting=waiting, running=running,
        ready=ready, starting=starting, desired=model.cluster.spec_replicas,
        nodes=model.cluster.live_node_count,
        decision=last.decision.summary if last is not None else "no decision yet",
        winner=(last.decision.winner or "none") if last is not None else "-",
        p95_s=p95.value if p95 is not None else None,
        slo_s=guard.slo_seconds if guard is not None else None,
        metric=guard.metric if guard is not None else "ttft")


def _p95_text(line: ModelLine) -> str:
    if line.p95_s is None:
        return f"p95 {line.metric} n/a"
    verdict = ""
    if line.slo_s is not None:
        verdict = f" (SLO {line.slo_s:g} s, {'ok' if line.p95_s <= line.slo_s else 'MISSED'})"
    return f"p95 {line.metric} {line.p95_s:.2f} s{verdict}"


class PlainView:
    """One line per scale change and a status line per virtual minute (logs, CI, pipes)."""

    def __init__(self, *, models: dict[str, demo_cluster.SimulatedModel],
                 state: service_state.ServiceState, clock: VirtualClock, out: TextIO) -> None:
        self.models = models
        self.state = state
        self.clock = clock
        self.out = out
        self._seen = {key: 0 for key in models}
        self._next_status = 0.0

    def _line(self, model: demo_cluster.SimulatedModel, what: str,
              change: demo_cluster.ScaleChange | None = None) -> str:
        line = model_line(model, self.state)
        at = model.now if change is None else change.at_s
        ready, starting, desired = ((line.ready, line.starting, line.desired) if change is None
                                    else (change.ready, change.starting, change.desired))
        return (f"[{_fmt_offset(at)} {_fmt_time(model.epoch(at))}] {model.key} {what} | "
                f"ready {ready} starting {starting} desired {desired} | "
                f"{line.arrival_rate:.1f} req/s, {line.waiting} waiting, {line.running} "
                f"running | {_p95_text(line)}")

    def refresh(self) -> None:
        for key, model in self.models.items():
            changes = model.changes
            for change in changes[self._seen[key]:]:
                print(self._line(model, change.summary, change), file=self.out)
            self._seen[key] = len(changes)
        elapsed = min((m.now for m in self.models.values()), default=0.0)
        if elapsed >= self._next_status:
            for model in self.models.values():
                line = model_line(model, self.state)
                print(self._line(model, f"status: {line.decision}"), file=self.out)
            # On the virtual minute: +01:00, +02:00, ... (as far as the refresh allows).
            self._next_status = (elapsed // STATUS_EVERY_S + 1) * STATUS_EVERY_S
        self.out.flush()

    refresh_s = PLAIN_REFRESH_S

    async def run(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(self.refresh_s)

    def close(self) -> None:
        self.refresh()


class LiveView(PlainView):
    """A block redrawn in place on a terminal, per model: demand, replicas, decision, p95."""

    refresh_s = LIVE_REFRESH_S

    def __init__(self, *, models: dict[str, demo_cluster.SimulatedModel],
                 state: service_state.ServiceState, clock: VirtualClock, out: TextIO,
                 duration_s: float) -> None:
        super().__init__(models=models, state=state, clock=clock, out=out)
        self.duration_s = duration_s
        self._drawn = 0

    def render(self) -> list[str]:
        elapsed = min((m.now for m in self.models.values()), default=0.0)
        lines = [f"virtual time {_fmt_time(self.clock.start_epoch + elapsed)} "
                 f"({_fmt_offset(elapsed)} of {_fmt_offset(self.duration_s)}, "
                 f"x{self.clock.speed:g})   Ctrl-C stops"]
        for model in self.models.values():
            line = model_line(model, self.state)
            lines += [
                f"{line.key}",
                f"  demand    {line.arrival_rate:6.1f} req/s   {line.waiting} waiting, "
                f"{line.running} running",
                f"  replicas  ready {line.ready}   starting {line.starting}   desired "
                f"{line.desired}   (nodes {line.nodes})",
                f"  decision  {line.decision}",
                f"  winner    {line.winner}",
                f"  latency   {_p95_text(line)}",
            ]
        return lines

    def refresh(self) -> None:
        lines = self.render()
        # Move up over the previous block and clear it (ANSI CPL and ED), then redraw.
        prefix = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
        self.out.write(prefix + "\n".join(lines) + "\n")
        self.out.flush()
        self._drawn = len(lines)


def make_view(options: DemoOptions, *, models: dict[str, demo_cluster.SimulatedModel],
              state: service_state.ServiceState, clock: VirtualClock, out: TextIO
              ) -> PlainView:
    """The live view on a terminal unless --no-ui; plain lines otherwise."""
    if options.ui and out.isatty():
        return LiveView(models=models, state=state, clock=clock, out=out,
                        duration_s=options.duration_s)
    return PlainView(models=models, state=state, clock=clock, out=out)


# -- results ------------------------------------------------------------------------------


def simulation_result(model: demo_cluster.SimulatedModel) -> run.SimulationResult:
    """The simulator's result for the live run ('scaler') beside the oracle's lower bound.

    The oracle replays the same slice on its own simulated cluster, from the same
    initial replicas, knowing the future; it takes about a second.
    """
    policy, profile, trace = model.policy, model.profile, model.trace
    metric, threshold = run.slo_of(policy)
    need = strategies.oracle_need(trace, profile)
    oracle_strategy = run.make_strategy("oracle", policy=policy, profile=profile, trace=trace,
                                        pool=model.pool, need=need)
    oracle = run.run_strategy(oracle_strategy, trace=trace, profile=profile, pool=model.pool,
                              policy=policy, initial_replicas=model.initial_replicas,
                              warmup_s=model.warmup_s)
    results = {}
    for name, cluster in (("scaler", model.cluster), ("oracle", oracle)):
        results[name] = run.StrategyResult(
            name=name,
            summary=run.summarize(cluster, policy=policy, metric=metric, threshold=threshold),
            series=run.series(cluster, metric=metric))
    return run.SimulationResult(trace=trace, policy=policy, profile=profile,
                                slo_metric=metric, slo_threshold_s=threshold, results=results)


def report_path(base: Path, key: str, *, several: bool) -> Path:
    """`base` for one model; `base-<namespace>-<name>.html` for each of several."""
    if not several:
        return base
    return base.with_name(f"{base.stem}-{key.replace('/', '-')}{base.suffix}")


def summary_document(
    options: DemoOptions, *, trace: traces.Trace,
    models: dict[str, demo_cluster.SimulatedModel], replay: Replay, nats_url: str,
    results: dict[str, run.SimulationResult],
) -> dict[str, Any]:
    """The --json summary: the run, every scale change, and the simulator's scores."""
    per_model: dict[str, Any] = {}
    for key, model in models.items():
        changes = model.changes
        per_model[key] = {
            "initial_replicas": model.initial_replicas,
            "final_replicas": model.cluster.spec_replicas,
            "max_replicas": max([model.initial_replicas, *(c.desired for c in changes)]),
            "scale_ups": sum(1 for c in changes if c.desired > c.previous),
            "scale_downs": sum(1 for c in changes if c.desired < c.previous),
            "evaluations": replay.evaluations.get(key, 0),
            "reports_published": model.reports,
            "changes": [{"t": round(c.at_s, 1), "from": c.previous, "to": c.desired,
                         "winner": c.winner, "summary": c.summary} for c in changes],
        }
        if key in results:
            per_model[key]["simulation"] = results[key].to_json()
    return {
        "trace": {"path": trace.path, "requests": trace.requests,
                  "rate_scale": trace.rate_scale, "start_epoch_s": trace.start_s},
        "speed": options.speed,
        "duration_s": options.duration_s,
        "replayed_s": round(replay.replayed_s, 1),
        "real_seconds": round(replay.real_s, 2),
        "max_lag_s": round(replay.max_lag_s, 2),
        "clock_held_back_s": round(replay.held_back_s, 2),
        "interrupted": replay.interrupted,
        "failed": replay.failed,
        "nats_url": nats_url,
        "http_url": replay.http_url,
        "messages_published": replay.published,
        "dropped_messages": replay.dropped,
        "models": per_model,
    }


def finish(options: DemoOptions, *, trace: traces.Trace,
           models: dict[str, demo_cluster.SimulatedModel], replay: Replay, nats_url: str,
           out: TextIO) -> None:
    """Drain the clusters, score the run, print the table, write the report and JSON."""
    results: dict[str, run.SimulationResult] = {}
    if replay.interrupted or replay.failed:
        print(f"stopped at {_fmt_offset(replay.replayed_s)} of the replay; no simulation "
              "report for a partial run", file=out)
    else:
        for key, model in models.items():
            model.drain()
            result = simulation_result(model)
            results[key] = result
            print(f"\n{key}: SLO p95 {result.slo_metric} <= {result.slo_threshold_s:g} s; "
                  "'scaler' is this run (the real service over NATS), 'oracle' the lower "
                  "bound that knows the future", file=out)
            print(report.table(result), file=out)
            if options.report is not None:
                path = report_path(options.report, key, several=len(models) > 1)
                report.write_html(result, path)
                print(f"report: {path}", file=out)
    for key, model in models.items():
        ups = sum(1 for c in model.changes if c.desired > c.previous)
        downs = sum(1 for c in model.changes if c.desired < c.previous)
        print(f"{key}: {ups} scale-ups, {downs} scale-downs, "
              f"{replay.evaluations.get(key, 0)} evaluations, {model.reports} reports; "
              f"replayed {replay.replayed_s:.0f} virtual s in {replay.real_s:.1f} s "
              f"(max lag {replay.max_lag_s:.1f} virtual s)", file=out)
    if options.json_path is not None:
        document = summary_document(options, trace=trace, models=models, replay=replay,
                                    nats_url=nats_url, results=results)
        options.json_path.write_text(json.dumps(document, indent=2) + "\n")
    out.flush()


def main(options: DemoOptions, *, out: TextIO | None = None) -> int:
    """Run the demo; 0 when done or stopped by Ctrl-C / SIGTERM, 1 on a failure, 2 on bad
    input. The embedded nats-server is stopped (and its temp dir removed) in every case."""
    stream = out or sys.stdout
    logs.configure(level=options.log_level, fmt="text")
    try:
        trace, models = load_models(options)
    except DemoError as error:
        print(f"scaler demo: {error}", file=sys.stderr)
        return 2
    server = nats_server.NatsServer(jetstream=False)
    try:
        server.start()
        replay = asyncio.run(Demo(options, trace=trace, models=models, nats_url=server.url,
                                  out=stream).run())
        server.close()
        finish(options, trace=trace, models=models, replay=replay, nats_url=server.url,
               out=stream)
    except KeyboardInterrupt:
        # Ctrl-C outside the replay (start-up, the report): stop quietly, still cleaned up.
        print("scaler demo: interrupted", file=sys.stderr)
        return 0
    except Exception as error:  # nats-server or the service could not start, a write failed
        log.debug("demo failed", exc_info=True)
        print(f"scaler demo: failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        server.close()
    if replay.failed:
        print(f"scaler demo: the service failed: {replay.failed}", file=sys.stderr)
        return 1
    return 0

