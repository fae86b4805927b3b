"""Who calls the external metrics API, and may they: front-proxy certificates, tokens, caches.

The same order and rules as the API server's delegating authenticator for an aggregated
API server (k8s.io/apiserver `authenticatorfactory.DelegatingAuthenticatorConfig`):
1. front proxy: a client certificate that chains to the requestheader CA, whose CN is in
   `requestheader-allowed-names` (an empty list allows any CN that CA signed), vouches for
   the identity in the username/group/extra headers it sends (X-Remote-User, ...);
2. a client certificate that chains to the client CA: user = CN, groups = O;
3. `Authorization: Bearer <token>`: a TokenReview.
Identity headers without a verified front-proxy certificate are ignored, so a spoofed
`X-Remote-User` leaves the caller unauthenticated. Then every authenticated user is
authorised with a SubjectAccessReview.

Caches, with the delegating defaults found in k8s.io/apiserver `pkg/server/options`
(`NewDelegatingAuthenticationOptions`: CacheTTL 10 s, for valid and invalid tokens alike;
`NewDelegatingAuthorizationOptions`: AllowCacheTTL 10 s, DenyCacheTTL 10 s): an HPA that
polls every 15 s through the aggregator makes at most one TokenReview/SubjectAccessReview
pair per 10 s per identity and metric, however many replicas read.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import ssl
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import multidict

from scaler.actuators import authn as delegated
from scaler.actuators import timefmt

log = logging.getLogger(__name__)

TOKEN_CACHE_TTL_S = 10.0
ALLOW_CACHE_TTL_S = 10.0
DENY_CACHE_TTL_S = 10.0
# Entries per cache. 4,096 identities x metrics is past any cluster's HPA count; beyond
# that the oldest entry goes (one more review, never a wrong answer).
CACHE_ENTRIES = 4096

_PEM_CERTIFICATE = re.compile(
    r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Answers kept for a time each, oldest dropped past `max_entries`; `clock` is monotonic
    seconds (the loop's clock unless a test injects one).

    Concurrent misses for one key share one load, as client-go's cached authenticator
    does: ten HPAs asking for the same metric at once cost one review, not ten.
    """

    def __init__(self, *, max_entries: int = CACHE_ENTRIES,
                 clock: Callable[[], float] | None = None) -> None:
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._max = max_entries
        self._clock = clock

    async def fetch(self, key: K, load: Callable[[], Awaitable[V]], *,
                    ttl_s: Callable[[V], float]) -> V:
        """The fresh cached value, else `load()`'s, kept for `ttl_s(value)` seconds.
        A load that raises caches nothing; every caller waiting on it gets the error."""
        entry = self._entries.get(key)
        if entry is not None:
            if timefmt.loop_now(self._clock) < entry[0]:
                return entry[1]
            del self._entries[key]
        loading = self._loading.get(key)
        if loading is None:
            loading = asyncio.ensure_future(self._load(key, load, ttl_s))
            self._loading[key] = loading
        # Shielded: one caller that goes away (client disconnect) does not fail the others.
        return await asyncio.shield(loading)

    async def _load(self, key: K, load: Callable[[], Awaitable[V]],
                    ttl_s: Callable[[V], float]) -> V:
        try:
            value = await load()
        finally:
            del self._loading[key]
        self._entries[key] = (timefmt.loop_now(self._clock) + ttl_s(value), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return value


def certificates_der(pem: str) -> frozenset[bytes]:
    """The DER form of every certificate in a PEM bundle (a CA file may hold several)."""
    return frozenset(ssl.PEM_cert_to_DER_cert(match.group(0))
                     for match in _PEM_CERTIFICATE.finditer(pem))


def verified_chain(ssl_object: Any) -> list[bytes]:
    """The peer's chain as OpenSSL verified it (leaf first, trust anchor last), DER.

    Empty when the peer sent no certificate. Python 3.13 made `get_verified_chain` public;
    3.10 to 3.12 have the same call on the private `_sslobj` (there is no other way to
    learn which CA a verified certificate chains to without a crypto library).
    """
    if not ssl_object.getpeercert():
        return []
    public = getattr(ssl_object, "get_verified_chain", None)
    if public is not None:
        return [bytes(cert) for cert in public()]
    chain = ssl_object._sslobj.get_verified_chain()
    encoding = ssl._ssl.ENCODING_DER  # type: ignore[attr-defined]
    return [cert.public_bytes(encoding) for cert in chain]


def _subject(ssl_object: Any, attribute: str) -> list[str]:
    peer = ssl_object.getpeercert() or {}
    return [value for rdn in peer.get("subject", ()) for key, value in rdn if key == attribute]


@dataclass(frozen=True, slots=True)
class Trust:
    """The ConfigMap's content, ready to check certificates against."""

    config: delegated.AuthenticationConfig
    client_cas: frozenset[bytes]
    requestheader_cas: frozenset[bytes]

    @classmethod
    def of(cls, config: delegated.AuthenticationConfig) -> Trust:
        return cls(config=config, client_cas=certificates_der(config.client_ca),
                   requestheader_cas=certificates_der(config.requestheader_ca))

    @property
    def ca_bundle(self) -> str:
        """Every CA a client certificate may chain to, for the TLS server's trust store."""
        return "\n".join(pem for pem in (self.config.client_ca, self.config.requestheader_ca)
                         if pem.strip())


def _chains_to(chain: list[bytes], cas: frozenset[bytes]) -> bool:
    # Any certificate above the leaf: the bundle may hold an intermediate as well as a root.
    return any(cert in cas for cert in chain[1:])


Headers = multidict.MultiMapping[str]
"""Request headers, case-insensitive, a name possibly repeated (aiohttp's `request.headers`)."""


def _header_values(headers: Headers, names: tuple[str, ...]) -> list[str]:
    return [value.strip() for name in names for value in headers.getall(name, [])
            if value.strip()]


def front_proxy_user(trust: Trust, *, chain: list[bytes], common_names: list[str],
                     headers: Headers) -> delegated.UserInfo | None:
    """The identity a verified front proxy vouches for, or None (not a front proxy, a CN
    not allowed, or no username header: the next method is tried, as in the API server)."""
    config = trust.config
    if not chain or not _chains_to(chain, trust.requestheader_cas):
        return None
    if config.allowed_names and not set(common_names) & set(config.allowed_names):
        return None
    usernames = _header_values(headers, config.username_headers)
    if not usernames:
        return None
    extra: dict[str, list[str]] = {}
    for name in dict.fromkeys(header.lower() for header in headers):  # each name once
        for prefix in config.extra_headers_prefixes:
            if name.startswith(prefix.lower()):
                # X-Remote-Extra-Scopes: a -> extra["scopes"] = ["a"]; keys are escaped.
                key = urllib.parse.unquote(name[len(prefix):])
                extra.setdefault(key, []).extend(_header_values(headers, (name,)))
    return delegated.UserInfo(
        username=usernames[0], groups=tuple(_header_values(headers, config.group_headers)),
        extra=tuple(sorted((key, tuple(values)) for key, values in extra.items())))


class Gate:
    """Authentication and authorisation of the metrics API's callers, cached."""

    def __init__(self, delegation: delegated.Delegation, trust: Trust, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.delegation = delegation
        self.trust = trust
        self._tokens: TtlCache[str, delegated.UserInfo | None] = TtlCache(clock=clock)
        self._access: TtlCache[tuple[delegated.UserInfo, delegated.AccessRequest],
                               delegated.AccessDecision] = TtlCache(clock=clock)

    async def authenticate(self, *, ssl_object: Any, headers: Headers
                           ) -> delegated.UserInfo | None:
        """The caller, or None (unauthenticated). Raises DelegationError when a token could
        not be reviewed (nothing is cached then)."""
        chain = verified_chain(ssl_object) if ssl_object is not None else []
        if chain:
            common_names = _subject(ssl_object, "commonName")
            proxied = front_proxy_user(self.trust, chain=chain, common_names=common_names,
                                       headers=headers)
            if proxied is not None:
                return proxied
            if _chains_to(chain, self.trust.client_cas) and common_names:
                return delegated.UserInfo(
                    username=common_names[0],
                    groups=tuple(_subject(ssl_object, "organizationName")))
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        # Keyed by a digest: the cache holds no usable credential.
        return await self._tokens.fetch(
            hashlib.sha256(token.encode()).hexdigest(),
            lambda: self.delegation.review_token(token), ttl_s=lambda _: TOKEN_CACHE_TTL_S)

    async def authorize(self, user: delegated.UserInfo, request: delegated.AccessRequest
                        ) -> delegated.AccessDecision:
        """May `user` do `request`? Raises DelegationError when the API could not be asked."""
        return await self._access.fetch(
            (user, request), lambda: self.delegation.review_access(user, request),
            ttl_s=lambda decision: ALLOW_CACHE_TTL_S if decision.allowed else DENY_CACHE_TTL_S)


async def make_gate(delegation: delegated.Delegation | None, *, enabled: bool,
                    clock: Callable[[], float] | None = None) -> Gate | None:
    """The metrics API's caller checks, or None (anyone is served, with a warning).

    The authentication ConfigMap is read once, here at start: a rotated front-proxy or
    client CA needs a restart, as the serving certificate does. Raises DelegationError
    when it cannot be read (the service then does not start half-open).
    """
    if not enabled:
        log.warning("external metrics API: authentication off (metrics_api.authentication): "
                    "anyone who reaches the port reads every model's metrics "
                    "(development only)")
        return None
    if delegation is None:
        log.warning("external metrics API: no cluster to delegate authentication to; "
                    "serving without it")
        return None
    config = await delegation.authentication_config()
    return Gate(delegation, Trust.of(config), clock=clock)
