"""NATS connection settings (servers, auth, TLS, reconnect backoff) shared by the NATS sources."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from nats.aio.client import Client, Server
from pydantic import Field, SecretStr, model_validator

from scaler.core import backoff as core_backoff
from scaler.core import settings as core_settings
from scaler.signals import samples

log = logging.getLogger(__name__)


class NatsTls(core_settings.Group):
    """TLS to the NATS server: a CA to verify it, and a client certificate for mTLS."""

    ca_file: Path | None = Field(
        default=None, description="PEM CA bundle that signed the server's certificate. "
        "None: the system CAs, which is right for a publicly signed server.")
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for mTLS; goes with key_file. "
        "None: no client certificate (the server decides whether it needs one).")
    key_file: Path | None = Field(
        default=None, description="PEM private key of cert_file. None: no client certificate.")
    hostname: str | None = Field(
        default=None, description="Name the server's certificate must carry. None: the host "
        "of the server URL, which is right unless NATS is reached through an IP or a proxy.")

    @model_validator(mode="after")
    def _pair(self) -> NatsTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file else None
        )
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


class NatsSettings(core_settings.Group):
    """How to reach NATS. One auth method at most: user/password, token, NKey seed or creds.

    Reconnection never gives up; the wait before each attempt follows `reconnect`
    (scaler.core.backoff).
    """

    servers: tuple[str, ...] = Field(
        default=("nats://127.0.0.1:4222",),
        description="NATS server URLs; the client picks among them and fails over. "
        "Default: a local server.")
    name: str = Field(
        default="scaler", description="Client name shown in the server's connection list "
        "(`nats server report connections`), to tell the scaler's connections apart.")
    user: str | None = Field(
        default=None, description="User name for user/password auth; goes with password. "
        "None: no user/password (NATS without auth, or another method).")
    password: SecretStr | None = Field(
        default=None, description="Password of user; never printed.")
    token: SecretStr | None = Field(
        default=None, description="Token auth; never printed. None: no token.")
    nkey_seed_file: Path | None = Field(
        default=None, description="NKey seed file for NKey auth (needs the nkeys package). "
        "None: no NKey.")
    creds_file: Path | None = Field(
        default=None, description="Credentials file (JWT + NKey seed, as `nsc` writes it) "
        "for decentralised auth; needs the nkeys package. None: no credentials file.")
    tls: NatsTls | None = Field(
        default=None, description="TLS settings. None: TLS only if a URL says tls://, "
        "verified against the system CAs.")
    connect_timeout_s: int = Field(
        default=2, ge=1, description="Timeout of one connection attempt, whole seconds "
        "(nats-py's unit). 2 s: a loopback or in-cluster server answers in milliseconds.")
    reconnect: core_backoff.Backoff = Field(
        default_factory=core_backoff.Backoff,
        description="Wait before each reconnect attempt; reconnection never gives up. "
        "0.25 s doubling to 10 s, each shortened by up to half: a restarted server is found "
        "within about 10 s, and a thousand scalers do not reconnect in lock-step.")
    ping_interval_s: int = Field(
        default=20, ge=1, description="Seconds between client PINGs. With "
        "max_outstanding_pings 2 a dead server is noticed after about 40 s (nats-py's "
        "default is 120 s, too slow for signals that go stale in 30 s).")
    max_outstanding_pings: int = Field(
        default=2, ge=1, description="Unanswered PINGs before the connection counts as "
        "dead and the client reconnects.")

    @model_validator(mode="after")
    def _one_auth(self) -> NatsSettings:
        methods = [
            self.user is not None or self.password is not None,
            self.token is not None,
            self.nkey_seed_file is not None,
            self.creds_file is not None,
        ]
        if sum(methods) > 1:
            raise ValueError("use one NATS auth method: user/password, token, nkey or creds")
        if (self.user is None) != (self.password is None):
            raise ValueError("user and password go together")
        return self


Callback = Callable[[], Awaitable[None]]


def display_servers(servers: Iterable[str]) -> str:
    """The server URLs for a log line, without any user:password@ in them."""
    shown = []
    for url in servers:
        parts = urllib.parse.urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        shown.append(urllib.parse.urlunsplit(parts._replace(netloc=host)))
    return ", ".join(shown)


class LinkLog:
    """One log line per change of the service's link to NATS, however many clients share it.

    NATS core and JetStream each hold a client to the same servers, so one server restart
    drops both, and nats-py also reports a disconnect when a client is closed on purpose.
    The link is down (WARNING, once) when any client has lost its connection, and back
    (INFO, once) when every client is connected again; a clean close logs nothing.
    """

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        """`clock`: seconds, for the length of an outage; the event loop's by default."""
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._connected: dict[str, bool] = {}
        self._down_since: float | None = None
        self._announced = False

    def joined(self, member: str) -> None:
        """A client starts connecting (not connected yet; silence until it fails)."""
        self._connected[member] = False

    def up(self, member: str, *, servers: str) -> None:
        self._connected[member] = True
        if not all(self._connected.values()):
            return
        if self._down_since is not None:
            log.info("nats connected to %s again after %.1f s", servers,
                     self._clock() - self._down_since)
        elif not self._announced:
            log.info("nats connected to %s", servers)
        self._down_since = None
        self._announced = True

    def down(self, member: str, *, servers: str, why: str) -> None:
        self._connected[member] = False
        if self._down_since is not None:
            return
        self._down_since = self._clock()
        if self._announced:
            log.warning("nats connection to %s lost (%s); reconnecting", servers, why)
        else:
            log.warning("nats: cannot connect to %s (%s); retrying", servers, why)

    def left(self, member: str) -> None:
        """A client was closed on purpose (shutdown, a restarted task): nothing to say."""
        self._connected.pop(member, None)
        if all(self._connected.values()):
            self._down_since = None


async def connect(
    client: Client,
    settings: NatsSettings,
    *,
    stats: samples.SourceStats,
    member: str = "nats",
    link: LinkLog | None = None,
    on_reconnected: Callback | None = None,
    rng: random.Random | None = None,
) -> None:
    """Connect `client` to NATS, retrying forever (cancel the caller to give up).

    The caller creates the client so it can close it even when cancelled mid-connect.
    Errors and reconnections are counted in `stats`, and `stats.connected` follows the
    connection; changes are logged through `link` (shared by the clients of one service,
    so one server restart is one WARNING and one INFO) as `member`. The client replays
    its subscriptions after a reconnect by itself.
    """
    jitter = rng or random.Random()
    link = link or LinkLog()
    shown = display_servers(settings.servers)
    stats.connected = False
    link.joined(member)

    def choose(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        server = min(servers, key=lambda s: s.reconnects)
        # nats-py counts a server's failed reconnects: 0 before the first retry.
        delay = core_backoff.delay_s(
            settings.reconnect, retry=server.reconnects + 1, jitter=jitter.random())
        return server, delay

    async def on_error(exc: Exception) -> None:
        stats.error(type(exc).__name__)
        log.debug("nats error: %r", exc)
        if not client.is_connected and not client.is_closed:
            # A failed (re)connection attempt: the first one of an outage is logged.
            link.down(member, servers=shown, why=f"{type(exc).__name__}: {exc}")

    async def on_disconnected() -> None:
        stats.connected = False
        if client.is_closed:
            link.left(member)  # closed on purpose: a clean shutdown is not an outage
        else:
            link.down(member, servers=shown, why="disconnected")

    async def reconnected() -> None:
        stats.reconnects += 1
        stats.connected = True
        link.up(member, servers=shown)
        if on_reconnected is not None:
            await on_reconnected()

    options: dict[str, Any] = {}
    if settings.user is not None and settings.password is not None:
        options["user"] = settings.user
        options["password"] = settings.password.get_secret_value()
    if settings.token is not None:
        options["token"] = settings.token.get_secret_value()
    if settings.nkey_seed_file is not None:
        options["nkeys_seed"] = str(settings.nkey_seed_file)
    if settings.creds_file is not None:
        options["user_credentials"] = str(settings.creds_file)
    if settings.tls is not None:
        options["tls"] = settings.tls.context()
        if settings.tls.hostname:
            options["tls_hostname"] = settings.tls.hostname
    await client.connect(
        servers=list(settings.servers),
        name=settings.name,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=reconnected,
        allow_reconnect=True,
        max_reconnect_attempts=-1,  # forever
        # Used by the first connection's retries only (whole seconds in nats-py); later
        # reconnects take their delay from `choose`.
        reconnect_time_wait=max(1, math.ceil(settings.reconnect.base_delay_s)),
        reconnect_to_server_handler=choose,
        connect_timeout=settings.connect_timeout_s,
        ping_interval=settings.ping_interval_s,
        max_outstanding_pings=settings.max_outstanding_pings,
        **options,
    )
    stats.connected = True
    link.up(member, servers=shown)


async def barrier(client: Client, *, timeout_s: int = 10) -> None:
    """Return once the server has processed every command this client sent so far.

    nats-py's flush() writes its PING straight to the socket, ahead of commands still
    queued for its flusher task (a SUB or UNSUB just issued), so the PONG alone proves
    nothing about them: under load a message published right after "subscribe + flush"
    was missed. The flusher is woken before that first PING is written and runs before
    the loop reads the PONG, so a second PING goes out behind the queued commands and
    its PONG comes back after the server applied them.
    """
    await client.flush(timeout=timeout_s)
    await client.flush(timeout=timeout_s)
