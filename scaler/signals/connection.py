"""NATS connection settings (servers, auth, TLS, reconnect backoff) shared by the NATS sources."""

from __future__ import annotations

import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nats.aio.client import Client, Server
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from scaler.signals import base

log = logging.getLogger(__name__)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NatsTls(_Frozen):
    """TLS to the NATS server: a CA to verify it, and a client certificate for mTLS."""

    ca_file: Path | None = Field(default=None, description="PEM CA bundle; system CAs if unset")
    cert_file: Path | None = Field(default=None, description="client certificate (mTLS)")
    key_file: Path | None = Field(default=None, description="client key (mTLS)")
    hostname: str | None = Field(default=None, description="name to verify, if not the URL's")

    @model_validator(mode="after")
    def _pair(self) -> NatsTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.certFile and tls.keyFile go together")
        return self

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file else None
        )
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


class NatsSettings(_Frozen):
    """How to reach NATS. One auth method at most: user/password, token, NKey seed or creds.

    Reconnection never gives up: the delay before attempt n (n = failed attempts so far)
    is min(reconnect_max_s, reconnect_base_s * 2**n) times a jitter in [0.5, 1], so with
    the defaults 0.25 s, 0.5 s, 1 s, ... up to 10 s: a restarted server is found within
    about 10 s, and a thousand scalers do not reconnect in lock-step.
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str = "scaler"
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    nkey_seed_file: Path | None = Field(default=None, description="needs the nkeys package")
    creds_file: Path | None = Field(default=None, description="JWT + seed; needs nkeys")
    tls: NatsTls | None = None
    connect_timeout_s: int = Field(default=2, ge=1, description="per attempt, seconds")
    reconnect_base_s: float = Field(default=0.25, gt=0)
    reconnect_max_s: float = Field(default=10.0, gt=0)
    ping_interval_s: int = Field(
        default=20, ge=1, description="a dead server is noticed after ~2 pings, 40 s"
    )
    max_outstanding_pings: int = Field(default=2, ge=1)

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


def backoff_delay(
    attempt: int, *, base_s: float, max_s: float, jitter: float = 1.0
) -> float:
    """Seconds to wait before reconnect attempt `attempt` (0 = first retry).

    `jitter` in [0, 1] (random in production) scales the delay into [0.5, 1] of the
    exponential step: base 0.25 s, attempt 3 -> 2 s step -> 1 to 2 s.
    """
    step = min(max_s, base_s * math.pow(2.0, min(attempt, 62)))
    return step * (0.5 + 0.5 * min(1.0, max(0.0, jitter)))


Callback = Callable[[], Awaitable[None]]


async def connect(
    client: Client,
    settings: NatsSettings,
    *,
    stats: base.SourceStats,
    on_reconnected: Callback | None = None,
    rng: random.Random | None = None,
) -> None:
    """Connect `client` to NATS, retrying forever (cancel the caller to give up).

    The caller creates the client so it can close it even when cancelled mid-connect.
    Errors and reconnections are counted in `stats`; the client replays its
    subscriptions after a reconnect by itself.
    """
    jitter = rng or random.Random()

    def choose(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        server = min(servers, key=lambda s: s.reconnects)
        delay = backoff_delay(
            server.reconnects,
            base_s=settings.reconnect_base_s,
            max_s=settings.reconnect_max_s,
            jitter=jitter.random(),
        )
        return server, delay

    async def on_error(exc: Exception) -> None:
        stats.error(type(exc).__name__)
        log.debug("nats error: %r", exc)

    async def on_disconnected() -> None:
        log.info("nats disconnected; reconnecting")

    async def reconnected() -> None:
        stats.reconnects += 1
        log.info("nats reconnected")
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
        reconnect_time_wait=max(1, math.ceil(settings.reconnect_base_s)),
        reconnect_to_server_handler=choose,
        connect_timeout=settings.connect_timeout_s,
        ping_interval=settings.ping_interval_s,
        max_outstanding_pings=settings.max_outstanding_pings,
        **options,
    )


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
