"""The one protocol every signal source follows (the registry is `signals.registry`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from scaler.policy import model as policy_model
from scaler.signals import samples


@runtime_checkable
class SignalSource(Protocol):
    """A signal source: reads one kind of input and emits samples; decides nothing.

    Lifecycle, the same for every source:
    - `run(sink)` works until cancelled (the service runs it as a supervised task):
      transient failures (lost connections, timeouts, errors from the backend) are
      counted in `stats` and retried, never raised. Cancelling it stops the work and
      releases its connections.
    - `update(policies)` gives it the policies in force (on start and every reload); it
      derives what to listen to or poll from them. It may be called before `run`.
    - `wait_ready()` returns once the source receives what it will receive (NATS: connected
      and subscribed); polling sources are ready at once.
    - `close()` releases anything `run` did not (called once, at shutdown).
    """

    @property
    def name(self) -> str: ...

    @property
    def stats(self) -> samples.SourceStats: ...

    async def run(self, sink: samples.SampleSink) -> None: ...

    async def update(self, policies: Sequence[policy_model.ScalePolicy]) -> None: ...

    async def wait_ready(self) -> None: ...

    async def close(self) -> None: ...
