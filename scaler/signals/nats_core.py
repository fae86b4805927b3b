"""NATS core source: signal messages (DESIGN 4.2) on per-model subjects or one wildcard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scaler.policy import model as policy_model
from scaler.signals import base, connection, messages

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "scaler.signals"


def default_subject(prefix: str, namespace: str, name: str) -> str:
    """`<prefix>.<namespace>.<model>`, e.g. scaler.signals.inference.llama-70b."""
    return f"{prefix}.{namespace}.{name}"


@dataclass(frozen=True, slots=True)
class NatsCoreConfig:
    """What the NATS core source listens to.

    routes: subject -> model key ('inference/llama-70b'); a message on a subject must be
      about that model. wildcard: subscribe once to `<prefix>.>` (one subscription for
      thousands of models) instead of once per subject; routes outside the prefix still
      get their own subscription. queue_group: set when several scaler replicas share
      the load (DESIGN 7); None = every replica sees every message.
    """

    routes: Mapping[str, str] = field(default_factory=dict)
    prefix: str = DEFAULT_PREFIX
    wildcard: bool = False
    queue_group: str | None = None
    limits: messages.Limits = messages.DEFAULT_LIMITS
    known: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        # Computed once: it is checked on every message.
        object.__setattr__(self, "known", frozenset(self.routes.values()))

    def subjects(self) -> frozenset[str]:
        """The subscriptions this config needs."""
        if not self.wildcard:
            return frozenset(self.routes)
        under = self.prefix + "."
        return frozenset(
            {self.prefix + ".>"} | {s for s in self.routes if not s.startswith(under)}
        )


def config_from_policies(
    policies: Iterable[policy_model.ScalePolicy],
    *,
    prefix: str = DEFAULT_PREFIX,
    wildcard: bool = False,
    queue_group: str | None = None,
    limits: messages.Limits = messages.DEFAULT_LIMITS,
) -> NatsCoreConfig:
    """Routes from the policies' `spec.sources.nats` (policies without it are skipped)."""
    routes: dict[str, str] = {}
    for policy in policies:
        source = policy.spec.sources.nats
        if source is None:
            continue
        subject = source.subject or default_subject(
            prefix, policy.metadata.namespace, policy.metadata.name
        )
        routes[subject] = policy.key
    return NatsCoreConfig(
        routes=routes, prefix=prefix, wildcard=wildcard, queue_group=queue_group, limits=limits
    )


def route_for(subject: str, config: NatsCoreConfig) -> messages.Route:
    """How to check a message that arrived on `subject` (a pure function).

    A routed subject expects its model. Under the wildcard, `<prefix>.<ns>.<model>`
    expects 'ns/model' and the model must have a policy; other subjects accept any
    known model named in the body.
    """
    known = config.known
    expected = config.routes.get(subject)
    if expected is not None:
        namespace = expected.partition("/")[0]
        return messages.Route(expected=expected, default_namespace=namespace, known=known)
    head = config.prefix + "."
    if subject.startswith(head):
        parts = subject[len(head) :].split(".")
        if len(parts) == 2 and all(parts):
            return messages.Route(
                expected=base.model_key(parts[0], parts[1]),
                default_namespace=parts[0],
                known=known,
            )
    return messages.Route(known=known)


class NatsCoreSource:
    """Subscribes to signal subjects and puts parsed samples into the sink.

    Runtime state (the client, subscriptions, counters) lives here; the config is frozen
    and replaced whole by `update`.
    """

    def __init__(
        self,
        settings: connection.NatsSettings,
        config: NatsCoreConfig,
        *,
        clock: base.Clock = base.wall_clock,
    ) -> None:
        self.settings = settings
        self.config = config
        self.stats = base.SourceStats()
        self._clock = clock
        self._client: Client | None = None
        self._sink: base.SampleSink | None = None
        self._subscriptions: dict[str, Subscription] = {}
        self._routes: dict[str, messages.Route] = {}
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return "nats"

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected

    async def wait_ready(self) -> None:
        """Until connected and subscribed (the first time)."""
        await self._ready.wait()

    async def run(self, sink: base.SampleSink) -> None:
        """Connect (retrying forever), subscribe, and deliver until cancelled."""
        self._sink = sink
        client = Client()
        try:
            await connection.connect(client, self.settings, stats=self.stats)
            self._client = client
            async with self._lock:
                await self._sync_subscriptions()
            await connection.barrier(client)
            self._ready.set()
            await asyncio.Future()  # until cancelled; the client reconnects by itself
        finally:
            self._ready.clear()
            self._client = None
            self._subscriptions.clear()
            if not client.is_closed:
                await client.close()

    async def update(self, config: NatsCoreConfig) -> None:
        """Replace the config; subscribe and unsubscribe to match it (policy reload)."""
        async with self._lock:
            self.config = config
            self._routes.clear()
            if self._client is not None and self._client.is_connected:
                await self._sync_subscriptions()
                # When update returns, the server has applied the (UN)SUBs.
                await connection.barrier(self._client)

    async def _sync_subscriptions(self) -> None:
        client = self._client
        if client is None:
            return
        wanted = self.config.subjects()
        for subject in set(self._subscriptions) - wanted:
            await self._subscriptions.pop(subject).unsubscribe()
        for subject in sorted(wanted - set(self._subscriptions)):
            self._subscriptions[subject] = await client.subscribe(
                subject, queue=self.config.queue_group or "", cb=self._on_message
            )

    async def _on_message(self, msg: Msg) -> None:
        now = self._clock()
        route = self._routes.get(msg.subject)
        if route is None:
            route = route_for(msg.subject, self.config)
            if route.expected is not None and route.expected in self.config.known:
                self._routes[msg.subject] = route  # cache only subjects with a policy
        result = messages.parse(msg.data, now=now, limits=self.config.limits, route=route)
        samples = messages.tally(self.stats, result)
        if samples and self._sink is not None:
            self._sink.put(samples)
