"""What the demo prints while it runs: a live block on a terminal, plain lines otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import TextIO

from scaler.demo import clock as demo_clock
from scaler.demo import cluster as demo_cluster
from scaler.demo import scenario
from scaler.service import explain
from scaler.service import state as service_state

# The live view redraws 4 times a second; plain lines are checked for 20 times a second
# (1 s real is 60 virtual s at the default speed) and print a status every virtual minute.
LIVE_REFRESH_S = 0.25
PLAIN_REFRESH_S = 0.05
STATUS_EVERY_S = 60.0


def _fmt_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%H:%M:%SZ")


def fmt_offset(seconds: float) -> str:
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
    p95 = last.snapshot.p95_latency if last is not None else None
    return ModelLine(
        key=model.key, arrival_rate=model.arrival_rate(), waiting=waiting, running=running,
        ready=ready, starting=starting, desired=model.cluster.spec_replicas,
        nodes=model.cluster.live_node_count,
        decision=(explain.in_words(dataclasses.asdict(last.decision)) if last is not None
                  else "no decision yet"),
        winner=(last.decision.winner or "none") if last is not None else "-",
        p95_s=p95.value if p95 is not None else None,
        slo_s=guard.slo_seconds if guard is not None else None,
        metric=model.policy.spec.latency_metric)


def _p95_text(line: ModelLine) -> str:
    if line.p95_s is None:
        return f"p95 {line.metric} n/a"
    verdict = ""
    if line.slo_s is not None:
        verdict = f" (SLO {line.slo_s:g} s, {'ok' if line.p95_s <= line.slo_s else 'MISSED'})"
    return f"p95 {line.metric} {line.p95_s:.2f} s{verdict}"


class PlainView:
    """One line per scale change and a status line per virtual minute (logs, CI, pipes)."""

    def __init__(self, *, models: scenario.Models,
                 state: service_state.ServiceState, clock: demo_clock.VirtualClock,
                 out: TextIO) -> None:
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
        return (f"[{fmt_offset(at)} {_fmt_time(model.epoch(at))}] {model.key} {what} | "
                f"ready {ready} starting {starting} desired {desired} | "
                f"{line.arrival_rate:.1f} req/s, {line.waiting} waiting, {line.running} "
                f"running | {_p95_text(line)}")

    def refresh(self) -> None:
        for key, model in self.models.items():
            changes = model.changes
            for change in changes[self._seen[key]:]:
                print(self._line(model, change.words, change), file=self.out)
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

    def __init__(self, *, models: scenario.Models,
                 state: service_state.ServiceState, clock: demo_clock.VirtualClock, out: TextIO,
                 duration_s: float) -> None:
        super().__init__(models=models, state=state, clock=clock, out=out)
        self.duration_s = duration_s
        self._drawn = 0

    def render(self) -> list[str]:
        elapsed = min((m.now for m in self.models.values()), default=0.0)
        lines = [f"virtual time {_fmt_time(self.clock.start_epoch + elapsed)} "
                 f"({fmt_offset(elapsed)} of {fmt_offset(self.duration_s)}, "
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


def make_view(options: scenario.DemoOptions, *, models: scenario.Models,
              state: service_state.ServiceState, clock: demo_clock.VirtualClock, out: TextIO
              ) -> PlainView:
    """The live view on a terminal unless --no-ui; plain lines otherwise."""
    if options.ui and out.isatty():
        return LiveView(models=models, state=state, clock=clock, out=out,
                        duration_s=options.duration_s)
    return PlainView(models=models, state=state, clock=clock, out=out)
