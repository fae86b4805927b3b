"""Delegated authentication for the external metrics API: what the API server says about callers.

An aggregated API server does not authenticate anyone itself. It reads the front-proxy
(requestheader) and client CAs from the ConfigMap `kube-system/extension-apiserver-
authentication`, asks the API server about bearer tokens (TokenReview) and asks it whether a
user may do something (SubjectAccessReview). This module is those three calls; the HTTP
side (headers, certificates, caches, answers) is `scaler.service.authn`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scaler.actuators import client as kube

CONFIG_MAP_NAMESPACE = "kube-system"
CONFIG_MAP_NAME = "extension-apiserver-authentication"
CONFIG_MAP_PATH = f"/api/v1/namespaces/{CONFIG_MAP_NAMESPACE}/configmaps/{CONFIG_MAP_NAME}"
TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True, slots=True)
class AuthenticationConfig:
    """What the ConfigMap says. CA bundles are PEM text ("" = that method is not offered);
    the header lists are what the front proxy (the kube-aggregator) sends."""

    client_ca: str = ""
    requestheader_ca: str = ""
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_headers_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated caller, as authentication.k8s.io/v1 UserInfo."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(key, values) pairs, sorted: hashable, so a user can key the authorisation cache."""


@dataclass(frozen=True, slots=True)
class AccessRequest:
    """A SubjectAccessReview's question. `resource` set: resource attributes (a metric in a
    namespace); otherwise non-resource attributes for `path` (discovery)."""

    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    namespace: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    reason: str = ""


class DelegationError(Exception):
    """The API server could not be asked (unreachable, 5xx, no RBAC): nothing is known."""


@runtime_checkable
class Delegation(Protocol):
    """The API server's answers about callers (the Kubernetes one, or a test's fake).
    Every method raises DelegationError when the question could not be asked."""

    async def authentication_config(self) -> AuthenticationConfig: ...

    async def review_token(self, token: str) -> UserInfo | None: ...

    async def review_access(self, user: UserInfo, request: AccessRequest) -> AccessDecision: ...


def _string_list(data: Mapping[str, str], key: str) -> tuple[str, ...]:
    # The API server writes these keys as JSON arrays of strings, e.g. '["X-Remote-User"]'.
    raw = data.get(key, "")
    if not raw.strip():
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: key {key!r} is not a "
                         f"JSON list of strings: {raw[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: key {key!r} is not a "
                         f"JSON list of strings: {raw[:80]!r}")
    return tuple(value)


def parse_config(data: Mapping[str, str]) -> AuthenticationConfig:
    """The ConfigMap's `data` as typed config; a malformed key raises ValueError naming it."""
    return AuthenticationConfig(
        client_ca=data.get("client-ca-file", ""),
        requestheader_ca=data.get("requestheader-client-ca-file", ""),
        allowed_names=_string_list(data, "requestheader-allowed-names"),
        username_headers=_string_list(data, "requestheader-username-headers"),
        group_headers=_string_list(data, "requestheader-group-headers"),
        extra_headers_prefixes=_string_list(data, "requestheader-extra-headers-prefix"),
    )


def _user_spec(user: UserInfo) -> kube.Obj:
    spec: kube.Obj = {"user": user.username, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    return spec


def _attributes(request: AccessRequest) -> kube.Obj:
    if request.resource:
        return {"resourceAttributes": {
            "verb": request.verb, "group": request.group, "version": request.version,
            "resource": request.resource, "namespace": request.namespace}}
    return {"nonResourceAttributes": {"verb": request.verb, "path": request.path}}


def _user_info(status: kube.Obj) -> UserInfo | None:
    if status.get("authenticated") is not True:
        return None
    user = status.get("user") or {}
    username = user.get("username")
    if not isinstance(username, str) or not username:
        return None
    extra = user.get("extra") or {}
    return UserInfo(username=username, uid=str(user.get("uid") or ""),
                    groups=tuple(str(g) for g in user.get("groups") or ()),
                    extra=tuple(sorted((str(k), tuple(str(v) for v in values))
                                       for k, values in extra.items()
                                       if isinstance(values, list))))


@dataclass(slots=True)
class KubeDelegation:
    """The three calls over the service's shared API client.

    RBAC: get on that one ConfigMap (the built-in Role `extension-apiserver-authentication-
    reader` in kube-system) and create on tokenreviews and subjectaccessreviews (the
    ClusterRole `system:auth-delegator`); the chart binds both.
    """

    api: kube.KubeApi

    async def authentication_config(self) -> AuthenticationConfig:
        """The ConfigMap's content. Absent (404): no client certificates are accepted and
        bearer tokens still are, as the API server's delegating authenticator does; any
        other error (403: the Role is not bound) is raised, so the service does not start
        half-open."""
        try:
            config_map = await self.api.get(CONFIG_MAP_PATH)
        except kube.KubeError as error:
            if error.not_found:
                return AuthenticationConfig()
            raise DelegationError(f"reading {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: "
                                  f"{error}") from None
        data = config_map.get("data") or {}
        return parse_config({str(k): str(v) for k, v in data.items()})

    async def _create(self, path: str, body: kube.Obj) -> kube.Obj:
        try:
            return await self.api.request("POST", path, body=body)
        except kube.KubeError as error:
            raise DelegationError(f"POST {path}: {error}") from None

    async def review_token(self, token: str) -> UserInfo | None:
        review = await self._create(TOKEN_REVIEWS_PATH, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}})
        return _user_info(review.get("status") or {})

    async def review_access(self, user: UserInfo, request: AccessRequest) -> AccessDecision:
        review = await self._create(ACCESS_REVIEWS_PATH, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {**_user_spec(user), **_attributes(request)}})
        status = review.get("status") or {}
        return AccessDecision(allowed=status.get("allowed") is True,
                              reason=str(status.get("reason") or ""))
