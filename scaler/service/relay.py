"""What shards tell each other over NATS (docs/scaling.md, "Sharding across instances").

A shard evaluates only its share of the models (`policy.shards`). Three streams, under
`sharding.subject_prefix` (P):

- `P.decisions.<namespace>.<model>`: what the external metrics API serves of a model
  (`metrics_api.Served`), sent by its shard's leader at most once a decision and at most
  every `decisions_s`. Every instance keeps the latest record of each model it does not
  own, so the APIService may reach any pod. A record is served only while its decision is
  younger than the policy's staleAfterSeconds: a shard that stops publishing makes its
  models' metrics 404 (the HPA then holds), never stale numbers.
- `P.asks.<shard>`: the asks of a split domain's models (`arbiter.RemoteAsk`), from the
  shards that evaluate them to the one that arbitrates the domain.
- `P.grants.<shard>`: that arbiter's grants back, to each model's shard. A model waits at
  what it has until its first grant (`arbiter.AWAITING`) and keeps its last one while the
  arbiter is away.

Asks and grants go when they change and again every `REFRESH_S` (a restarted shard
learns everything within that), by leaders only; followers receive and apply them too, so
a follower that takes over is warm. The bus may be reachable by someone hostile (DESIGN
3.5): every message is bounded, every field checked (a decision's subject names its model;
an ask or grant must come from the shard that the files say evaluates or arbitrates that
model; numbers finite and in range), and a refused one is counted by reason
(`scaler_dropped_messages{source="shards"}`). Grant publish on `P.>` to the scaler's NATS
user alone (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from scaler.engine import fleet as engine_fleet
from scaler.policy import model, shards
from scaler.service import arbiter as fleet_arbiter
from scaler.service import metrics_api
from scaler.service import state as service_state
from scaler.signals import connection, samples

log = logging.getLogger(__name__)

MEMBER = "shards"
DECISIONS, ASKS, GRANTS = "decisions", "asks", "grants"
MAX_RECORD_BYTES = 8192
"""A decision record is about 300 bytes; labels are bounded below, so 8 KiB is generous."""
MAX_BATCH = 500
"""Asks or grants in one message: at most 500 x ~1.2 KB (a grant with the longest reason
taken) = 600 KB, under NATS's 1 MB default payload; about 75 KB as they usually are."""
MAX_BATCH_BYTES = 1 << 20
MAX_LABELS = 64
MAX_LABEL_CHARS = 317  # a qualified label key: a 253-character prefix, '/', 63 characters
MAX_REASON_CHARS = 1024
MAX_STALE_AFTER_S = 86_400.0
MAX_REPLICAS = 1_000_000
MAX_GPUS = 1_000_000_000
MAX_FUTURE_S = 5.0
REFRESH_S = 5.0
DECISIONS_S = 5.0
"""A model's record goes at most this often: an HPA reads every 15 s, and every instance
takes every other shard's records (12 us to decode and check one, plus nats-py's
delivery: 10,000 models a second would be a fifth of a core on each instance; 2,000 a
second at this period)."""

Sent = TypeVar("Sent", fleet_arbiter.RemoteAsk, engine_fleet.Grant)


class Refused(ValueError):
    """A message or item that is not taken; `reason` is its drop counter's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _finite(value: Any, reason: str = "implausible", *, low: float = -math.inf,
            high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(reason)
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise Refused(reason)
    return number


def _count(value: Any, *, high: int = MAX_REPLICAS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise Refused("implausible")
    return value


def _body(data: bytes, *, limit: int) -> dict[str, Any]:
    if len(data) > limit:
        raise Refused("too_large")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise Refused("malformed") from None
    if not isinstance(body, dict) or body.get("v") != 1:
        raise Refused("malformed")
    return body


# -- decisions --------------------------------------------------------------------------

def decision_subject(prefix: str, key: str) -> str:
    namespace, _, name = key.partition("/")
    return f"{prefix}.{DECISIONS}.{namespace}.{name}"


def encode(served: metrics_api.Served) -> bytes:
    """The record of one model's served values (compact JSON)."""
    return json.dumps({
        "v": 1, "model": served.key, "namespace": served.namespace,
        "labels": dict(served.labels), "stale_after_s": served.stale_after_s,
        "desired": served.desired, "decided_at": served.decided_at,
        "points": {metric: [point.value, point.produced_at]
                   for metric, point in served.points.items()},
    }, separators=(",", ":")).encode()


def decode(data: bytes, *, subject: str, prefix: str, now: float) -> metrics_api.Served:
    """A relayed decision record, checked field by field; raises Refused with the reason."""
    body = _body(data, limit=MAX_RECORD_BYTES)
    key, namespace = body.get("model"), body.get("namespace")
    if not (isinstance(key, str) and isinstance(namespace, str)
            and key.startswith(f"{namespace}/") and subject == decision_subject(prefix, key)):
        raise Refused("subject_mismatch")
    labels = body.get("labels")
    if not (isinstance(labels, dict) and len(labels) <= MAX_LABELS and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_LABEL_CHARS
            and len(v) <= MAX_LABEL_CHARS for k, v in labels.items())):
        raise Refused("bad_labels")
    latest = now + MAX_FUTURE_S
    stale_after = _finite(body.get("stale_after_s"), low=0.0, high=MAX_STALE_AFTER_S)
    desired = body.get("desired")
    desired = None if desired is None else _count(desired)
    decided_at = _finite(body.get("decided_at"), low=0.0, high=latest)
    points = body.get("points")
    if not isinstance(points, dict):
        raise Refused("malformed")
    served_points = {}
    for metric, pair in points.items():
        if metric not in metrics_api.SERVED_SIGNALS or not (
                isinstance(pair, list) and len(pair) == 2):
            raise Refused("unknown_metric")
        served_points[metric] = metrics_api.MetricPoint(
            _finite(pair[0]), _finite(pair[1], low=0.0, high=latest))
    return metrics_api.Served(key=key, namespace=namespace, labels=labels,
                              stale_after_s=stale_after, desired=desired,
                              decided_at=decided_at, points=served_points)


# -- asks and grants --------------------------------------------------------------------

def batch(kind: str, *, sender: int, items: list[dict[str, Any]]) -> bytes:
    return json.dumps({"v": 1, "from": sender, kind: items}, separators=(",", ":")).encode()


def ask_item(ask: fleet_arbiter.RemoteAsk) -> dict[str, Any]:
    return {"model": ask.key, "desired": ask.desired, "current": ask.current,
            "replicas": ask.replicas, "forecast_replicas": ask.forecast_replicas,
            "excluded_gpus": ask.excluded_gpus, "at": ask.at}


def grant_item(grant: engine_fleet.Grant) -> dict[str, Any]:
    return {"model": grant.key, "replicas": grant.replicas, "cap_gpus": grant.cap_gpus,
            "reason": grant.reason, "borrowed_gpus": grant.borrowed_gpus}


def sender_and_items(data: bytes, kind: str, *, shards_count: int
                     ) -> tuple[int, list[Any]]:
    """A batch's sending shard and its items (each still to check)."""
    body = _body(data, limit=MAX_BATCH_BYTES)
    sender, items = body.get("from"), body.get(kind)
    if not isinstance(items, list) or len(items) > MAX_BATCH:
        raise Refused("malformed")
    return _count(sender, high=shards_count - 1), items


def decode_ask(item: Any, *, now: float) -> fleet_arbiter.RemoteAsk:
    if not isinstance(item, dict) or not isinstance(item.get("model"), str):
        raise Refused("malformed")
    return fleet_arbiter.RemoteAsk(
        key=item["model"], desired=_count(item.get("desired")),
        current=_count(item.get("current")), replicas=_count(item.get("replicas")),
        forecast_replicas=_count(item.get("forecast_replicas")),
        excluded_gpus=_count(item.get("excluded_gpus"), high=MAX_GPUS),
        at=_finite(item.get("at"), low=0.0, high=now + MAX_FUTURE_S))


def decode_grant(item: Any) -> engine_fleet.Grant:
    if not isinstance(item, dict) or not isinstance(item.get("model"), str):
        raise Refused("malformed")
    reason, cap = item.get("reason"), item.get("cap_gpus")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise Refused("malformed")
    return engine_fleet.Grant(
        key=item["model"], replicas=_count(item.get("replicas")),
        cap_gpus=None if cap is None else _count(cap, high=MAX_GPUS), reason=reason,
        borrowed_gpus=_count(item.get("borrowed_gpus"), high=MAX_GPUS))


@dataclass(frozen=True, slots=True)
class Arbitration:
    """What the relay needs of the reactor: its arbiter; `notify(key)`, to evaluate an own
    model whose grant moved; `foreign_asked(policy)`, to arbitrate (and plan the model's
    pool) again after another shard's ask (`Reactor.notify`, `Reactor.foreign_asked`)."""

    arbiter: fleet_arbiter.Arbiter
    notify: Callable[[str], None]
    foreign_asked: Callable[[model.ScalePolicy], None]


class ShardRelay:
    """One NATS connection: publishes (as leader) this shard's decisions, asks and grants;
    takes the others'."""

    def __init__(self, settings: connection.NatsSettings, *, prefix: str,
                 assignment: shards.Assignment, state: service_state.ServiceState,
                 arbitration: Arbitration, leading: Callable[[], bool],
                 clock: Callable[[], float], tick_s: float = 0.05,
                 decisions_s: float = DECISIONS_S, link: connection.LinkLog | None = None
                 ) -> None:
        self.settings = settings
        self.prefix = prefix
        self.assignment = assignment
        self.tick_s = tick_s
        self.decisions_s = decisions_s
        self.stats = samples.SourceStats()
        self.share: shards.Share | None = None
        self._state = state
        self._arbitration = arbitration
        self._leading = leading
        self._clock = clock
        self._link = link or connection.LinkLog()
        self._client: Client | None = None
        self._sent_decisions: dict[str, float] = {}  # key -> decided_at of the last sent
        self._sent_asks: dict[str, fleet_arbiter.RemoteAsk] = {}
        self._sent_grants: dict[str, engine_fleet.Grant] = {}
        self._granted_at = -1  # the arbiter's arbitration count at the last grants sent
        self._records: dict[str, metrics_api.Served] = {}
        self.ready = asyncio.Event()

    def subject(self, kind: str, shard: int) -> str:
        return f"{self.prefix}.{kind}.{shard}"

    def relayed(self) -> Mapping[str, metrics_api.Served]:
        """Other shards' models whose latest decision is younger than their
        staleAfterSeconds (older ones are forgotten)."""
        now, records = self._clock(), self._records
        for key in [k for k, r in records.items()
                    if self._state.policy(k) is not None or now - r.decided_at > r.stale_after_s]:
            del records[key]
        return dict(records)

    async def run(self) -> None:
        """Connect (retrying forever), subscribe, publish as leader until cancelled."""
        client = Client()
        try:
            await connection.connect(client, self.settings, stats=self.stats, member=MEMBER,
                                     link=self._link)
            self._client = client
            shard = self.assignment.shard
            await client.subscribe(f"{self.prefix}.{DECISIONS}.>", cb=self._on_decision)
            await client.subscribe(self.subject(ASKS, shard), cb=self._on_asks)
            await client.subscribe(self.subject(GRANTS, shard), cb=self._on_grants)
            await connection.barrier(client)
            self.ready.set()
            loop = asyncio.get_running_loop()
            next_decisions = next_refresh = loop.time()
            while True:
                now = loop.time()
                if not self._leading():
                    self._forget_sent()  # a new leader sends everything again
                else:
                    if now >= next_refresh:
                        self._forget_sent()
                        next_refresh = now + REFRESH_S
                    try:
                        await self.send_asks()
                        await self.send_grants()
                        if now >= next_decisions:
                            await self.send_decisions()
                            next_decisions = now + self.decisions_s
                    except Exception as error:  # a lost connection: counted, sent again
                        self.stats.error(type(error).__name__)
                        log.debug("shards: cannot publish: %r", error)
                        self._forget_sent()
                await asyncio.sleep(self.tick_s)
        finally:
            self.ready.clear()
            self._client = None
            if not client.is_closed:
                await client.close()

    def _forget_sent(self) -> None:
        self._sent_decisions.clear()
        self._sent_asks.clear()
        self._sent_grants.clear()
        self._granted_at = -1

    def _connected(self) -> Client | None:
        client = self._client
        return client if client is not None and client.is_connected else None

    async def send_decisions(self) -> int:
        """Send the record of every own model decided since its last one; how many."""
        client = self._connected()
        if client is None:
            return 0
        sent = 0
        for status in self._state.statuses():
            last = status.last
            if last is None or self._sent_decisions.get(status.key) == last.decision.at:
                continue
            await client.publish(decision_subject(self.prefix, status.key),
                                 encode(metrics_api.served_of(status)))
            self._sent_decisions[status.key] = last.decision.at
            sent += 1
        return sent

    async def send_asks(self) -> int:
        """Send each changed ask of an own model to its domain's arbiter; how many."""
        share, client = self.share, self._connected()
        if share is None or client is None:
            return 0
        return await self._send_changed(client, ASKS, self._arbitration.arbiter.outbox,
                                        sent=self._sent_asks, to=share.remote, item=ask_item)

    async def send_grants(self) -> int:
        """Send each changed grant of another shard's model arbitrated here; how many."""
        share, client, arbiter = self.share, self._connected(), self._arbitration.arbiter
        if share is None or client is None or arbiter.arbitrations == self._granted_at:
            return 0  # nothing arbitrated since the last send
        self._granted_at = arbiter.arbitrations
        return await self._send_changed(client, GRANTS, arbiter.foreign_grants(),
                                        sent=self._sent_grants, to=share.foreign,
                                        item=grant_item)

    async def _send_changed(self, client: Client, kind: str, latest: Mapping[str, Sent], *,
                            sent: dict[str, Sent], to: Mapping[str, int],
                            item: Callable[[Sent], dict[str, Any]]) -> int:
        """Send what changed since `sent` of `latest` (by model key) to the shard `to`
        names for each key, batched per shard; how many."""
        changed = {key: value for key, value in latest.items()
                   if key in to and sent.get(key) != value}
        by_shard: dict[int, list[dict[str, Any]]] = {}
        for key, value in changed.items():
            by_shard.setdefault(to[key], []).append(item(value))
        for shard, items in sorted(by_shard.items()):
            for start in range(0, len(items), MAX_BATCH):
                await client.publish(self.subject(kind, shard), batch(
                    kind, sender=self.assignment.shard, items=items[start:start + MAX_BATCH]))
        sent.update(changed)
        return len(changed)

    async def _on_decision(self, msg: Msg) -> None:
        try:
            record = decode(msg.data, subject=msg.subject, prefix=self.prefix,
                            now=self._clock())
        except Refused as refused:
            self.stats.drop(refused.reason)
            return
        if self._state.policy(record.key) is not None:
            return  # this shard's own model (its leader's echo): served from the state
        previous = self._records.get(record.key)
        if previous is not None and previous.decided_at > record.decided_at:
            self.stats.drop("out_of_order")
            return
        self._records[record.key] = record
        self.stats.accepted += 1

    def _batch(self, msg: Msg, kind: str) -> tuple[int, list[Any]] | None:
        """A batch's sender and items, or None (refused and counted)."""
        try:
            return sender_and_items(msg.data, kind, shards_count=self.assignment.shards)
        except Refused as refused:
            self.stats.drop(refused.reason)
            return None

    async def _on_asks(self, msg: Msg) -> None:
        share, batch = self.share, self._batch(msg, ASKS)
        if batch is None:
            return
        sender, items = batch
        arbiter, now = self._arbitration.arbiter, self._clock()
        for item in items:
            try:
                ask = decode_ask(item, now=now)
                if share is None or share.foreign.get(ask.key) != sender:
                    raise Refused("not_arbitrated_here")
                changed = arbiter.put_foreign(ask, now=now)
            except Refused as refused:
                self.stats.drop(refused.reason)
                continue
            except ValueError:  # older than the ask kept
                self.stats.drop("out_of_order")
                continue
            self.stats.accepted += 1
            policy = arbiter.foreign_policy(ask.key)
            if changed and policy is not None:
                self._arbitration.foreign_asked(policy)

    async def _on_grants(self, msg: Msg) -> None:
        share, batch = self.share, self._batch(msg, GRANTS)
        if batch is None:
            return
        sender, items = batch
        arbiter = self._arbitration.arbiter
        for item in items:
            try:
                grant = decode_grant(item)
                if share is None or share.remote.get(grant.key) != sender:
                    raise Refused("not_arbitrated_there")
                changed = arbiter.put_remote_grant(grant)
            except Refused as refused:
                self.stats.drop(refused.reason)
                continue
            self.stats.accepted += 1
            if changed:
                self._arbitration.notify(grant.key)

