"""One shared Kubernetes API client: config loading, timeouts, typed errors, retries as data."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from scaler.actuators import settings as kube_settings
from scaler.core import backoff as core_backoff

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


class KubeError(Exception):
    """A non-2xx answer (or no answer: status 0) from the API, with the Status' reason."""

    def __init__(self, status: int, reason: str, message: str, *,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def conflict(self) -> bool:
        """A stale resourceVersion (not AlreadyExists, which is also a 409)."""
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def transient(self) -> bool:
        return self.status in _RETRYABLE or self.status == 0


def _retry_after(value: str | None) -> float | None:
    # The API server sends whole seconds ("Retry-After: 3"); HTTP dates are not used by it.
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _error(status: int, body: str | bytes | None, headers: Any) -> KubeError:
    reason, message = "Unknown", ""
    try:
        status_obj = json.loads(body or b"{}")
        reason = str(status_obj.get("reason") or reason)
        message = str(status_obj.get("message") or "")
    except (ValueError, AttributeError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else body) or ""
    retry_after = _retry_after(headers.get("Retry-After") if headers is not None else None)
    return KubeError(status, reason, message[:500], retry_after=retry_after)


async def make_api_client(settings: kube_settings.KubeSettings) -> client.ApiClient:
    """The one ApiClient the process shares: host, kubeconfig (+context) or in-cluster."""
    configuration = client.Configuration()
    if settings.host:
        configuration.host = settings.host
    elif settings.kubeconfig:
        await config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                      client_configuration=configuration)
    else:
        load_incluster: Any = config.load_incluster_config  # untyped in kubernetes_asyncio
        load_incluster(client_configuration=configuration)
    return client.ApiClient(configuration)


@dataclass(slots=True)
class KubeApi:
    """Raw JSON calls through the shared ApiClient, with a timeout on every call and the
    retry settings applied to transient failures. `sleep` and `rng` are the seams tests use
    to see the delays without waiting for them.
    """

    api_client: client.ApiClient
    timeout_s: float = 10.0
    retry: kube_settings.RetrySettings = field(default_factory=kube_settings.RetrySettings)
    sleep: Sleep = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)

    async def _once(self, method: str, path: str, *, query: list[tuple[str, str]],
                    body: Any, content_type: str) -> Obj:
        try:
            result = await self.api_client.call_api(
                path, method, query_params=query,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body, response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"], _return_http_data_only=True,
                _preload_content=True, _request_timeout=self.timeout_s,
            )
        except client.ApiException as exc:
            raise _error(exc.status, exc.body, exc.headers) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            # No answer, or half of one: the write may or may not have happened, so callers
            # rely on preconditions (a resourceVersion, a JSON patch `test`) to make the
            # retry safe.
            raise KubeError(0, type(exc).__name__, str(exc) or "timeout") from None
        return result if isinstance(result, dict) else {}

    async def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json") -> Obj:
        """One API call; 429/5xx/timeouts retried per the settings, anything else raised."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._once(method, path, query=list((query or {}).items()),
                                        body=body, content_type=content_type)
            except KubeError as error:
                if not error.transient or attempt >= self.retry.max_attempts:
                    raise
                if error.status == 429 and error.retry_after is not None:
                    delay = min(error.retry_after, self.retry.max_retry_after_s)
                else:
                    delay = core_backoff.delay_s(
                        self.retry, retry=attempt, jitter=self.rng.random())
                log.info("kube %s %s: %s; retry %d in %.2f s", method, path, error, attempt,
                         delay)
                await self.sleep(delay)

    async def get(self, path: str, *, query: dict[str, str] | None = None) -> Obj:
        return await self.request("GET", path, query=query)

    async def merge_patch(self, path: str, patch: Obj) -> Obj:
        """JSON merge patch: works for every kind, CRDs included (strategic merge does not)."""
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[Obj]) -> Obj:
        """RFC 6902 JSON patch: operations applied in order, all or none; a failed `test`
        operation refuses the whole patch with 422 Invalid."""
        return await self.request("PATCH", path, body=operations, content_type=JSON_PATCH)

    async def watch(self, path: str, *, query: dict[str, str]) -> AsyncGenerator[Obj, None]:
        """Stream a watch's events (one JSON object a line) until the server ends it.

        Raises KubeError for a non-2xx answer (a 410 means: list again) and for a dropped
        connection (status 0); the caller resumes from the last resourceVersion it saw.
        """
        server_timeout = int(query.get("timeoutSeconds", "300"))
        try:
            response = await self.api_client.call_api(
                path, "GET", query_params=list({**query, "watch": "1"}.items()),
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                _preload_content=False,
                # Connect within the call timeout; between lines allow the server's own
                # watch timeout plus the call timeout, as bookmarks may be a minute apart.
                _request_timeout=aiohttp.ClientTimeout(
                    sock_connect=self.timeout_s, sock_read=server_timeout + self.timeout_s),
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise KubeError(0, type(exc).__name__, str(exc) or "timeout") from None
        try:
            if response.status >= 300:
                raise _error(response.status, await response.read(), response.headers)
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise KubeError(0, type(exc).__name__, str(exc) or "watch dropped") from None
        finally:
            response.release()
