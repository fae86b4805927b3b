"""NATS core source: signal messages (DESIGN 4.2) on per-model subjects or one wildcard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scaler.core import vocabulary
from scaler.policy import model as policy_model
from scaler.signals import connection, messages, samples

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "scaler.signals"


def default_subject(prefix: str, namespace: str, name: str) -> str:
    """`<prefix>.<namespace>.<model>`, e.g. scaler.signals.inference.llama-70b."""
    return f"{prefix}.{namespace}.{name}"


@dataclass(frozen=True, slots=True)
class NatsCoreConfig:
    """What the NATS core source listens to.

    routes: subject -> model key ('inference/llama-70b'); a message on a subject must be
      about that model. stale_after: model key -> its policy's staleAfterSeconds, the
      age past which its messages are stale on arrival (models not listed: the limits'
      max_age_s). wildcard: subscribe once to `<prefix>.>` (one subscription for
      thousands of models) instead of once per subject; routes outside the prefix still
      get their own subscription. queue_group: set when several scaler replicas share
      the load (DESIGN 7); None = every replica sees every message.
    """

    routes: Mapping[str, str] = field(default_factory=dict)
    stale_after: Mapping[str, float] = field(default_factory=dict)
    prefix: str = DEFAULT_PREFIX
    wildcard: bool = False
    queue_group: str | None = None
    limits: messages.Limits = messages.DEFAULT_LIMITS
    known: Mapping[str, float] = field(init=False)

    def __post_init__(self) -> None:
        # Computed once: it is checked on every message. Every routed model is known.
        known = {key: self.limits.max_age_s for key in self.routes.values()}
        known.update({key: s for key, s in self.stale_after.items() if key in known})
        object.__setattr__(self, "known", known)

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
    stale_after: dict[str, float] = {}
    for policy in policies:
        source = policy.spec.sources.nats
        if source is None:
            continue
        subject = source.subject or default_subject(
            prefix, policy.metadata.namespace, policy.metadata.name
        )
        routes[subject] = policy.key
        stale_after[policy.key] = policy.spec.stale_after_seconds
    return NatsCoreConfig(
        routes=routes, stale_after=stale_after, prefix=prefix, wildcard=wildcard,
        queue_group=queue_group, limits=limits,
    )


def route_for(subject: str, config: NatsCoreConfig) -> messages.Route | messages.Drop:
    """How to check a message that arrived on `subject` (a pure function).

    The subject names the model, exactly: a routed subject expects its model; under the
    wildcard, `<prefix>.<ns>.<model>` (three parts, no more) expects 'ns/model', which must
    have a policy. Any other subject is refused: `<prefix>.inference.llama-8b.extra` does
    not reach llama-8b, and a body cannot name a model its subject does not.
    """
    known = config.known
    expected = config.routes.get(subject)
    if expected is not None:
        namespace = expected.partition("/")[0]
        return messages.Route(expected=expected, default_namespace=namespace, models=known)
    head = config.prefix + "."
    if subject.startswith(head):
        parts = subject[len(head) :].split(".")
        if len(parts) == 2 and all(parts):
            return messages.Route(
                expected=vocabulary.model_key(parts[0], parts[1]),
                default_namespace=parts[0],
                models=known,
            )
    return messages.Drop(messages.DropReason.SUBJECT_MISMATCH,
                         f"subject {subject[:200]} names no model")


class NatsCoreSource:
    """Subscribes to signal subjects and puts parsed samples into the sink.

    Runtime state (the client, subscriptions, counters) lives here; the config is frozen
    and replaced whole by `update`.
    """

    def __init__(
        self,
        settings: connection.NatsSettings,
        config: NatsCoreConfig | None = None,
        *,
        clock: samples.Clock = samples.wall_clock,
        subscribe: NatsCoreConfig | None = None,
        link: connection.LinkLog | None = None,
    ) -> None:
        """`subscribe` gives how `update` subscribes for policies (prefix, wildcard, queue
        group, limits; its routes are ignored); `config`, what to subscribe to now.
        `link` logs connection changes, shared with the service's other NATS clients."""
        self.settings = settings
        self._link = link or connection.LinkLog()
        self._subscribe = subscribe or NatsCoreConfig()
        self.config = config or self._subscribe
        self.stats = samples.SourceStats()
        self._clock = clock
        self._client: Client | None = None
        self._sink: samples.SampleSink | None = None
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

    async def run(self, sink: samples.SampleSink) -> None:
        """Connect (retrying forever), subscribe, and deliver until cancelled."""
        self._sink = sink
        client = Client()
        try:
            await connection.connect(client, self.settings, stats=self.stats,
                                     member=self.name, link=self._link)
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

    async def update(self, policies: Sequence[policy_model.ScalePolicy]) -> None:
        """Subscribe to what the policies in force name (policy reload)."""
        how = self._subscribe
        await self.configure(config_from_policies(
            policies, prefix=how.prefix, wildcard=how.wildcard, queue_group=how.queue_group,
            limits=how.limits))

    async def close(self) -> None:
        """Nothing beyond `run`'s own cleanup: the connection closes when it is cancelled."""

    async def configure(self, config: NatsCoreConfig) -> None:
        """Replace the config; subscribe and unsubscribe to match it."""
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
        result: messages.ParseResult
        if route is None:
            found = route_for(msg.subject, self.config)
            if isinstance(found, messages.Drop):
                messages.tally(self.stats, found)
                return
            route = found
            if route.expected is not None and route.expected in self.config.known:
                self._routes[msg.subject] = route  # cache only subjects with a policy
        result = messages.parse(msg.data, now=now, limits=self.config.limits, route=route)
        accepted = messages.tally(self.stats, result)
        if accepted and self._sink is not None:
            self._sink.put(accepted)
