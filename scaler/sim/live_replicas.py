"""The replicas of a live run over time (a Deployment, or `scaler`'s API) and their cost."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from scaler.engine import cost as engine_cost
from scaler.sim import profiles

# How long `recording` waits for the first reading before it gives up: a kubeconfig
# pointing nowhere or a model the service does not know fails here, before any request
# is sent, not after an hour of load with an empty timeline.
FIRST_READING_TIMEOUT_S = 15.0
# scaler evaluates a model every few seconds (engine period); reading its decision once a
# second sees each one within a second of it being made.
DEFAULT_POLL_S = 1.0


class LiveReplicasError(Exception):
    """The replica source cannot be read (bad target, unknown model, unreachable API)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """The replicas as read at `at` (event-loop seconds, the load tester's clock).

    desired: spec.replicas (what was asked for); allocated: replicas that exist, starting
    included (they hold GPUs); ready: replicas passing readiness.
    """

    at: float
    desired: int
    allocated: int
    ready: int


@dataclass
class Timeline:
    """Readings of one source, kept only when a count changes (a day of scaling is a few
    thousand samples, not one a second)."""

    source: str
    samples: list[Sample] = field(default_factory=list)
    reads: int = 0
    errors: int = 0
    last_error: str | None = None

    def record(self, *, at: float, desired: int, allocated: int, ready: int) -> None:
        self.reads += 1
        last = self.samples[-1] if self.samples else None
        if last is None or (last.desired, last.allocated, last.ready) != (desired, allocated,
                                                                          ready):
            self.samples.append(Sample(at, desired, allocated, ready))

    def failed(self, message: str) -> None:
        self.errors += 1
        self.last_error = message


class Source(Protocol):
    """Where replicas are read from; `follow` records into a timeline until cancelled.

    Two exist: `ScalerSource` here, and a Deployment watched through the Kubernetes API,
    `scaler.actuators.deployment_replicas.DeploymentSource` (only the actuators talk to
    that API; `scaler loadtest` gets it from the command line's wiring, scaler/cli.py).
    """

    @property
    def name(self) -> str: ...

    async def follow(self, timeline: Timeline) -> None: ...


class DeploymentFactory(Protocol):
    """Makes the Source of a Deployment through a kubeconfig (the actuators' one,
    `scaler.actuators.deployment_replicas.source`, passed in by the command line)."""

    def __call__(self, *, kubeconfig: str, context: str | None, namespace: str,
                 deployment: str) -> Source: ...


def parse_target(text: str, *, flag: str = "--target") -> tuple[str, str]:
    """`namespace/name` -> (namespace, name), with an error naming the flag."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise LiveReplicasError(f"{flag} {text!r}: expected namespace/name")
    return namespace, name


def _named(counts: tuple[int, int, int]) -> dict[str, int]:
    desired, allocated, ready = counts
    return {"desired": desired, "allocated": allocated, "ready": ready}


def decision_counts(document: Any) -> tuple[int, int, int]:
    """(desired, allocated, ready) from the service's decision document
    (`GET /v1/models/{namespace}/{name}/decision`, scaler.service.http_api): the desired
    count of its latest decision, and the cluster it saw (ready + starting allocated)."""
    try:
        desired = document["decision"]["desired"]
        ready = document["cluster"]["ready"]
        starting = document["cluster"]["starting"]
    except (KeyError, TypeError):
        raise LiveReplicasError("the decision document has no decision.desired, "
                                "cluster.ready or cluster.starting") from None
    counts = (desired, ready + starting if isinstance(starting, int) else -1, ready)
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise LiveReplicasError(f"the decision document's counts are not whole numbers: "
                                f"{counts}")
    return counts


@dataclass
class ScalerSource:
    """`scaler`'s HTTP decision API, polled every `interval_s` seconds.

    model is `namespace/name`, as the service keys it. Failed polls (the service
    restarting, a 404 before its first decision) are counted and polling goes on.
    """

    url: str
    model: str
    interval_s: float = DEFAULT_POLL_S
    timeout_s: float = 5.0

    @property
    def name(self) -> str:
        return f"scaler {self.url} model {self.model}"

    @property
    def decision_url(self) -> str:
        # The route of scaler.service.http_api (`/v1/models/{namespace}/{model}/decision`);
        # sim may not import the service layer, so the path is spelled here.
        namespace, name = self.model.split("/", 1)
        return f"{self.url.rstrip('/')}/v1/models/{namespace}/{name}/decision"

    async def follow(self, timeline: Timeline) -> None:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(self.decision_url) as response:
                        if response.status != 200:
                            text = (await response.text())[:200]
                            timeline.failed(f"HTTP {response.status}: {text}")
                        else:
                            counts = decision_counts(await response.json())
                            timeline.record(at=loop.time(), **_named(counts))
                except (aiohttp.ClientError, TimeoutError, ValueError,
                        LiveReplicasError) as error:
                    timeline.failed(f"{type(error).__name__}: {error}")
                await asyncio.sleep(self.interval_s)


@contextlib.asynccontextmanager
async def recording(source: Source, *, first_reading_timeout_s: float = FIRST_READING_TIMEOUT_S
                    ) -> AsyncIterator[Timeline]:
    """Follow `source` in a task for the body of the `async with`; yields its timeline.

    Waits for the first reading, so the timeline covers the run from its start; raises
    LiveReplicasError when none comes in time or the source fails. Example:

        async with live_replicas.recording(source) as timeline:
            live = await loadtest.run(requests, target)
        keys = live_replicas.summary(timeline, origin=live.origin, until_s=..., ...)
    """
    timeline = Timeline(source=source.name)
    task = asyncio.create_task(source.follow(timeline), name=f"replicas of {source.name}")
    try:
        deadline = asyncio.get_running_loop().time() + first_reading_timeout_s
        while not timeline.samples:
            if task.done():
                error = task.exception()
                # The source's own error names what it read (a 404 for a missing
                # Deployment, a refused connection).
                raise LiveReplicasError(str(error) if error is not None else
                                        f"{source.name}: stopped before a first reading")
            if asyncio.get_running_loop().time() > deadline:
                raise LiveReplicasError(
                    f"{source.name}: no reading within {first_reading_timeout_s:g} s"
                    + (f" (last error: {timeline.last_error})" if timeline.last_error else ""))
            await asyncio.sleep(0.05)
        yield timeline
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as error:  # the source failed mid-run: its timeline ends there
            timeline.failed(f"{type(error).__name__}: {error}")


# ----- what the timeline says, in the simulator's vocabulary ----------------------------


def _relative(timeline: Timeline, *, origin: float) -> list[Sample]:
    """Samples on the run's clock (0 = the first request's trace time), the state at 0
    first: the last reading before the start holds from 0; with none before it, the
    first reading is taken to hold from 0 (the source answered just after the start)."""
    shifted = [Sample(s.at - origin, s.desired, s.allocated, s.ready) for s in timeline.samples]
    before = [s for s in shifted if s.at <= 0.0]
    after = [s for s in shifted if s.at > 0.0]
    start = before[-1] if before else (after.pop(0) if after else None)
    return ([Sample(0.0, start.desired, start.allocated, start.ready)] if start else []) + after


def allocated_gpu_seconds(timeline: Timeline, *, origin: float, until_s: float,
                          gpus_per_replica: int) -> float:
    """GPUs held over [0, until_s]: allocated replicas x GPUs each x seconds, as the
    simulator bills each pod from creation to removal (cold starts included).

    Example: 2 replicas from 0 s, 3 from 600 s, until 1,800 s at 1 GPU each:
    2 x 600 + 3 x 1,200 = 4,800 GPU-seconds (1.33 GPU-hours).
    """
    samples = _relative(timeline, origin=origin)
    total = 0.0
    for sample, following in zip(samples, [*samples[1:], None], strict=True):
        end = until_s if following is None else min(following.at, until_s)
        total += max(0.0, end - sample.at) * sample.allocated
    return total * gpus_per_replica


def useful_gpu_seconds(profile: profiles.ReplicaProfile, *, prompt_tokens: float,
                       generated_tokens: float, gpus_per_replica: int) -> float:
    """GPU time the work would take at full efficiency, the simulator's definition
    (scaler.sim.cluster): prompt tokens at the prefill rate, generated tokens at the
    per-token cost of a full batch (a / max_batch + b).

    Example, the 8B profile (8 ms + 0.1 ms per sequence, batch 256, 40k prefill tok/s):
    1 M prompt tokens and 200k generated are 25 s + 200k x 0.131 ms = 51 GPU-seconds.
    """
    step = profile.decode_step
    per_token = step.base_seconds / profile.max_batch + step.per_sequence_seconds
    useful = prompt_tokens / profile.prefill_tokens_per_second + generated_tokens * per_token
    return useful * gpus_per_replica


def summary(timeline: Timeline, *, origin: float, until_s: float, end_s: float,
            gpus_per_replica: int, gpu_hourly: float, useful_gpu_s: float,
            completed: int) -> dict[str, float | int]:
    """The 4.4 keys a replica timeline gives: max_replicas, scale_events, gpu_hours, cost,
    idle_cost, cost_per_1k_requests, as `scaler.sim.run.summarize` defines them.

    GPU time is billed over [0, until_s] (the trace's duration, as the simulator does);
    scale events and the peak count over [0, end_s] (the whole run, drain included).
    """
    samples = [s for s in _relative(timeline, origin=origin) if s.at <= end_s]
    desired = [s.desired for s in samples]
    price = engine_cost.of_gpu_time(
        allocated_gpu_seconds=allocated_gpu_seconds(timeline, origin=origin, until_s=until_s,
                                                    gpus_per_replica=gpus_per_replica),
        useful_gpu_seconds=useful_gpu_s, gpu_hourly=gpu_hourly, requests=completed)
    return {
        "gpu_hours": round(price.allocated_gpu_hours, 4),
        "cost": round(price.cost, 4),
        "idle_cost": round(price.idle_cost, 4),
        "cost_per_1k_requests": round(price.cost_per_1k_requests or 0.0, 4),
        "scale_events": sum(1 for a, b in zip(desired, desired[1:], strict=False) if a != b),
        "max_replicas": max(desired, default=0),
    }


def series(timeline: Timeline, *, origin: float, end_s: float) -> dict[str, list[float]]:
    """Step points for the report's plot: each change, from 0 to end_s (the last count
    repeated at end_s so the step reaches the end)."""
    samples = [s for s in _relative(timeline, origin=origin) if s.at <= end_s]
    if samples and not math.isclose(samples[-1].at, end_s):
        last = samples[-1]
        samples.append(Sample(end_s, last.desired, last.allocated, last.ready))
    return {"replicas_t": [round(s.at, 3) for s in samples],
            "desired": [float(s.desired) for s in samples],
            "allocated": [float(s.allocated) for s in samples],
            "ready": [float(s.ready) for s in samples]}
