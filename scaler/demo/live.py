"""The live run: the real service over an embedded nats-server, fed by the simulated replicas."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from nats.aio.client import Client

from scaler.core import backoff as core_backoff
from scaler.demo import clock as demo_clock
from scaler.demo import cluster as demo_cluster
from scaler.demo import nats_server, scenario, view
from scaler.service import runner
from scaler.service import settings as service_settings
from scaler.signals import nats_core

log = logging.getLogger(__name__)

# The replay loop wakes every 20 ms of real time: at 60x that is 1.2 virtual seconds, about
# one report per replica per wake-up. A wake-up runs at most 50 steps of 0.1 s (5 virtual
# s) before yielding, so NATS messages and evaluations interleave with the simulation.
TICK_S = 0.02
MAX_STEPS_PER_TICK = 50
# The simulation may fall this far behind the virtual clock before the clock is held back.
# A report's age when the service reads it is this lag plus NATS delivery; 5 virtual s
# keeps it well inside the policies' 30 s staleAfterSeconds (at 300x, 5 s is 17 ms real).
MAX_LAG_S = 5.0

# The service's loop-time periods in a real deployment (settings defaults); the demo
# divides them by the speed so that, in virtual time, they are what they would be.
BACKSTOP_TICK_S = 5.0
POLICY_POLL_S = 2.0


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


def service_settings_for(options: scenario.DemoOptions, *, nats_url: str
                         ) -> service_settings.Settings:
    """The service's settings: embedded NATS, loopback HTTP, loop periods scaled by 1/speed.

    Environment variables are ignored: the demo must not pick up a real deployment's
    settings (its NATS, its policies) by accident.
    """
    base = service_settings.load_settings(environ={})
    return base.model_copy(update={
        "nats": service_settings.NatsSettings(
            servers=(nats_url,), reconnect=core_backoff.Backoff(base_delay_s=0.05)),
        "http": service_settings.HttpSettings(host="127.0.0.1", port=0),
        "metrics_api": service_settings.MetricsApiSettings(
            enabled=options.metrics_api, host="127.0.0.1", port=0),
        # 5 s and 2 s in virtual time: at 60x, every 83 ms and 33 ms of real time.
        "engine": service_settings.EngineSettings(
            backstop_tick_seconds=BACKSTOP_TICK_S / options.speed),
        "policies": service_settings.PolicySettings(
            paths=[options.policy], reload_poll_seconds=POLICY_POLL_S / options.speed),
        # No Prometheus in the demo: a closed loopback port, so a policy's Prometheus
        # source fails fast instead of querying whatever runs on 9090 (its warnings are
        # silenced in cli.main).
        "prometheus": base.prometheus.model_copy(
            update={"url": f"http://127.0.0.1:{nats_server.free_port()}"}),
        "log": service_settings.LogSettings(level=options.log_level, format="text"),
    })


# -- the live run -------------------------------------------------------------------------


class Demo:
    """Runs the service against the simulated models until the duration or a signal."""

    def __init__(self, options: scenario.DemoOptions, *, models: scenario.Models,
                 warnings: dict[str, str], nats_url: str, out: TextIO) -> None:
        self.options = options
        self.warnings = warnings
        # Every model replays the same trace from the same instant (at its own rate).
        self.start_epoch = next(iter(models.values())).trace.start_s
        self.models = models
        self.nats_url = nats_url
        self.out = out
        self.replay = Replay()

    async def run(self) -> Replay:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        clock = demo_clock.VirtualClock(loop_time=loop.time, start_epoch=self.start_epoch,
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
            nats = service.source("nats")
            assert isinstance(nats, nats_core.NatsCoreSource)
            await asyncio.wait_for(nats.wait_ready(), timeout=10)
            self.replay.http_url = service.http.url if service.http else None
            self._banner(service)
            live_view = view.make_view(self.options, models=self.models, state=service.state,
                             clock=clock, out=self.out)
            clock.begin()
            started = time.monotonic()
            view_task = loop.create_task(live_view.run(), name="demo-view")
            await self._replay(clock=clock, service=service, publisher=publisher, stop=stop)
            view_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view_task
            live_view.close()
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

    async def _replay(self, *, clock: demo_clock.VirtualClock, service: runner.Service,
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
        options = self.options
        first = next(iter(self.models.values()))
        lines = [
            f"scaler demo: {Path(first.trace.path).name} over {options.duration_s:g} virtual "
            f"s at {options.speed:g}x (about {options.duration_s / options.speed:.0f} s)",
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
                         f"{model.trace.requests} requests (rate x{model.trace.rate_scale:g}), "
                         f"{model.initial_replicas} replicas ready at start")
        lines.extend(f"  warning      {warning}" for warning in self.warnings.values())
        print("\n".join(lines), file=self.out, flush=True)


async def _quiet(error: Exception) -> None:
    # A Ctrl-C on a terminal reaches the embedded nats-server too (same process group), so
    # it may be gone before the publisher closes: that is shutdown, not an error to print.
    log.debug("demo publisher: %r", error)


async def _quiet_disconnect() -> None:
    log.debug("demo publisher disconnected")
