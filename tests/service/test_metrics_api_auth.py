"""Aggregated-API authentication of the external metrics API, end to end over real TLS.

Callers as the kube-aggregator (a front-proxy client certificate plus X-Remote-* headers),
as a pod with a bearer token, with a direct client certificate, and as attackers (a
spoofed header, a certificate from another CA); the API server behind TokenReview,
SubjectAccessReview and the authentication ConfigMap is the project's emulator.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import multidict
import pytest
from prometheus_client import exposition

from scaler import emulator as kube_emulator
from scaler.actuators import authn as delegated
from scaler.actuators import client as kube
from scaler.actuators import settings as kube_settings
from scaler.service import authn, metrics_api, observability, tls, web
from scaler.service import state as service_state

from . import factories, k8s_schema, pki
from .conftest import FakeClock

STATUS = k8s_schema.META + "Status"
METRIC = "scaler_desired_replicas"
METRIC_PATH = f"{metrics_api.BASE}/namespaces/inference/{METRIC}"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
PROXY_NAME = "front-proxy-client"


@dataclass(frozen=True, slots=True)
class Pki:
    requestheader_ca: pki.Issued
    client_ca: pki.Issued
    proxy: pki.Issued  # signed by the requestheader CA, CN allowed
    proxy_other_name: pki.Issued  # signed by the requestheader CA, CN not allowed
    rogue_proxy: pki.Issued  # same CN, signed by a CA nobody trusts
    alice: pki.Issued  # signed by the client CA: a direct client certificate


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    requestheader = pki.make_ca(directory, "front-proxy-ca")
    client = pki.make_ca(directory, "kubernetes-ca")
    rogue = pki.make_ca(directory, "rogue-ca")
    return Pki(
        requestheader_ca=requestheader, client_ca=client,
        proxy=pki.issue_client(requestheader, directory, common_name=PROXY_NAME),
        proxy_other_name=pki.issue_client(requestheader, directory, common_name="intruder"),
        rogue_proxy=pki.issue_client(rogue, directory, common_name=PROXY_NAME),
        alice=pki.issue_client(client, directory, common_name="alice",
                               organizations=["team-a"]),
    )


def config_map_data(certs: Pki) -> dict[str, str]:
    """What kube-apiserver writes into kube-system/extension-apiserver-authentication."""
    return {
        "client-ca-file": certs.client_ca.pem,
        "requestheader-client-ca-file": certs.requestheader_ca.pem,
        "requestheader-allowed-names": json.dumps([PROXY_NAME]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
    }


@dataclass(slots=True)
class Setup:
    emulator: kube_emulator.KubeEmulator
    server: web.RunningServer
    state: service_state.ServiceState
    gate_clock: FakeClock

    def reviews(self, path: str) -> list[Any]:
        return [r.body for r in self.emulator.requests if r.method == "POST" and r.path == path]


@pytest.fixture
async def emulator(certs: Pki) -> AsyncIterator[kube_emulator.KubeEmulator]:
    async with kube_emulator.KubeEmulator(clock=time.time) as emu:
        emu.store.create(emu.resource("", "configmaps"), "kube-system", {
            "metadata": {"name": "extension-apiserver-authentication"},
            "data": config_map_data(certs)})
        emu.reviews.tokens["good-token"] = {"username": "system:serviceaccount:kube-system:"
                                            "horizontal-pod-autoscaler",
                                            "groups": ["system:serviceaccounts",
                                                       "system:authenticated"]}
        emu.reviews.tokens["nosy-token"] = {"username": "nosy", "groups": ["system:authenticated"]}
        emu.reviews.grants += [
            # The chart's external-metrics-reader ClusterRole, bound to the HPA controller.
            kube_emulator.Grant(subject="system:serviceaccount:kube-system:"
                                "horizontal-pod-autoscaler", verbs=("get", "list"),
                                api_group=metrics_api.GROUP),
            # system:discovery: every authenticated user may read /apis/...
            kube_emulator.Grant(subject="system:authenticated", verbs=("get",),
                                paths=("/apis", "/apis/*")),
            kube_emulator.Grant(subject="bob", verbs=("list",), api_group=metrics_api.GROUP,
                                resources=(METRIC,), namespace="inference"),
            kube_emulator.Grant(subject="team-a", verbs=("list",),
                                api_group=metrics_api.GROUP, namespace="inference"),
        ]
        yield emu


@pytest.fixture
async def setup(emulator: kube_emulator.KubeEmulator, certificate: tls.CertificatePair,
                clock: FakeClock) -> AsyncIterator[Setup]:
    state = factories.loaded_state(factories.policy("llama-70b"))
    state.record("inference/llama-70b", factories.observation(desired=3))
    api_client = await kube.make_api_client(kube_settings.KubeSettings(host=emulator.url))
    # One attempt: a review that fails is seen at once (the retries have their own tests).
    delegation = delegated.KubeDelegation(kube.KubeApi(
        api_client, timeout_s=5.0, retry=kube_settings.RetrySettings(max_attempts=1)))
    gate_clock = FakeClock(now=0.0)
    gate = await authn.make_gate(delegation, enabled=True, clock=gate_clock)
    assert gate is not None
    api = metrics_api.MetricsApi(state, clock=clock, gate=gate)
    server = await web.serve(api.app(), host="127.0.0.1", port=0, ssl_context=tls.server_context(
        certificate, client_cas=gate.trust.ca_bundle))
    try:
        yield Setup(emulator=emulator, server=server, state=state, gate_clock=gate_clock)
    finally:
        await server.close()
        await api_client.close()


def client_context(certificate: tls.CertificatePair, identity: pki.Issued | None = None
                   ) -> ssl.SSLContext:
    """Trusts the server's certificate (verification on); presents `identity` if given."""
    context = ssl.create_default_context(cafile=str(certificate.cert_file))
    if identity is not None:
        context.load_cert_chain(str(identity.cert_file), str(identity.key_file))
    return context


async def call(http: aiohttp.ClientSession, setup: Setup, context: ssl.SSLContext, *,
               path: str = METRIC_PATH, headers: dict[str, str] | None = None
               ) -> tuple[int, Any]:
    async with http.get(setup.server.url + path, params={"labelSelector": "model=llama-70b"},
                        headers=headers, ssl=context) as response:
        return response.status, await response.json()


def assert_status(body: Any, code: int, reason: str) -> None:
    k8s_schema.validate(body, STATUS)
    assert (body["code"], body["reason"]) == (code, reason)


async def test_front_proxy_certificate_vouches_for_the_identity_headers(
    setup: Setup, http: aiohttp.ClientSession, certs: Pki, certificate: tls.CertificatePair,
) -> None:
    code, body = await call(http, setup, client_context(certificate, certs.proxy), headers={
        "X-Remote-User": "bob", "X-Remote-Group": "viewers", "X-Remote-Extra-Scopes": "s1"})
    assert code == 200, body
    assert [item["value"] for item in body["items"]] == ["3"]
    [review] = setup.reviews(ACCESS_REVIEWS)
    assert review["spec"]["user"] == "bob"
    assert review["spec"]["groups"] == ["viewers"]
    assert review["spec"]["extra"] == {"scopes": ["s1"]}
    assert review["spec"]["resourceAttributes"] == {
        "verb": "list", "group": metrics_api.GROUP, "version": metrics_api.VERSION,
        "resource": METRIC, "namespace": "inference"}
    assert setup.reviews(TOKEN_REVIEWS) == []  # the proxy's word is enough


async def test_front_proxy_identity_is_still_authorised(
    setup: Setup, http: aiohttp.ClientSession, certs: Pki, certificate: tls.CertificatePair,
) -> None:
    # bob may list only in "inference": the same proxy asking for him elsewhere is refused.
    code, body = await call(http, setup, client_context(certificate, certs.proxy),
                            path=f"{metrics_api.BASE}/namespaces/staging/{METRIC}",
                            headers={"X-Remote-User": "bob"})
    assert code == 403
    assert_status(body, 403, "Forbidden")
    assert 'User "bob" cannot list resource "scaler_desired_replicas"' in body["message"]


async def test_certificate_from_another_ca_is_refused(
    setup: Setup, http: aiohttp.ClientSession, certs: Pki, certificate: tls.CertificatePair,
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await call(http, setup, client_context(certificate, certs.rogue_proxy),
                   headers={"X-Remote-User": "system:admin"})
    assert setup.reviews(ACCESS_REVIEWS) == []
    # Refused for its certificate alone: the real proxy on the same server gets through.
    code, _ = await call(http, setup, client_context(certificate, certs.proxy),
                         headers={"X-Remote-User": "bob"})
    assert code == 200


@pytest.mark.parametrize("proxy", ["none", "other_name"])
async def test_identity_headers_without_an_allowed_front_proxy_are_ignored(
    setup: Setup, http: aiohttp.ClientSession, certs: Pki, certificate: tls.CertificatePair,
    proxy: str,
) -> None:
    identity = certs.proxy_other_name if proxy == "other_name" else None
    code, body = await call(http, setup, client_context(certificate, identity), headers={
        "X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"})
    assert code == 401
    assert_status(body, 401, "Unauthorized")
    assert setup.reviews(ACCESS_REVIEWS) == []


async def test_direct_client_certificate_names_user_and_groups(
    setup: Setup, http: aiohttp.ClientSession, certs: Pki, certificate: tls.CertificatePair,
) -> None:
    # Headers from a client-CA certificate are not a proxy's: alice stays alice.
    code, body = await call(http, setup, client_context(certificate, certs.alice),
                            headers={"X-Remote-User": "system:admin"})
    assert code == 200, body
    [review] = setup.reviews(ACCESS_REVIEWS)
    assert (review["spec"]["user"], review["spec"]["groups"]) == ("alice", ["team-a"])


@pytest.mark.parametrize(
    ("token", "expected", "reason"),
    [("good-token", 200, None), ("nosy-token", 403, "Forbidden"),
     ("forged-token", 401, "Unauthorized")],
)
async def test_bearer_tokens_through_token_review_and_access_review(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
    token: str, expected: int, reason: str | None,
) -> None:
    code, body = await call(http, setup, client_context(certificate),
                            headers={"Authorization": f"Bearer {token}"})
    assert code == expected, body
    if reason is not None:
        assert_status(body, expected, reason)
    [token_review] = setup.reviews(TOKEN_REVIEWS)
    assert token_review["spec"] == {"token": token}
    # Only an authenticated caller is authorised.
    assert len(setup.reviews(ACCESS_REVIEWS)) == (0 if expected == 401 else 1)
    assert setup.state.metrics_api_requests == {expected: 1}


async def test_reviews_are_cached_for_their_ttl(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
) -> None:
    context = client_context(certificate)
    for token in ("good-token", "nosy-token", "forged-token"):
        for _ in range(3):
            await call(http, setup, context, headers={"Authorization": f"Bearer {token}"})
    # One review per token and one per authenticated user, however many requests.
    assert len(setup.reviews(TOKEN_REVIEWS)) == 3
    assert len(setup.reviews(ACCESS_REVIEWS)) == 2
    setup.gate_clock.now += authn.TOKEN_CACHE_TTL_S - 0.5
    await call(http, setup, context, headers={"Authorization": "Bearer good-token"})
    assert len(setup.reviews(TOKEN_REVIEWS)) == 3
    setup.gate_clock.now += 1.0  # past the 10 s TTLs: asked again
    code, _ = await call(http, setup, context, headers={"Authorization": "Bearer good-token"})
    assert code == 200
    assert len(setup.reviews(TOKEN_REVIEWS)) == 4
    assert len(setup.reviews(ACCESS_REVIEWS)) == 3
    assert setup.state.metrics_api_requests == {200: 5, 403: 3, 401: 3}


async def test_concurrent_requests_share_one_review(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
) -> None:
    context = client_context(certificate)
    answers = await asyncio.gather(*(
        call(http, setup, context, headers={"Authorization": "Bearer good-token"})
        for _ in range(5)))
    assert [code for code, _ in answers] == [200] * 5
    assert len(setup.reviews(TOKEN_REVIEWS)) == 1
    assert len(setup.reviews(ACCESS_REVIEWS)) == 1


async def test_a_failed_review_is_not_cached(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
) -> None:
    context = client_context(certificate)
    headers = {"Authorization": "Bearer good-token"}
    # The API server fails the TokenReview: the caller gets a 401, as from kube-apiserver.
    setup.emulator.inject(kube_emulator.Fault(verb="create", path="tokenreviews", status=500))
    code, body = await call(http, setup, context, headers=headers)
    assert code == 401
    assert_status(body, 401, "Unauthorized")
    code, _ = await call(http, setup, context, headers=headers)
    assert code == 200  # asked again, not the failure remembered


async def test_discovery_needs_a_user_and_probes_stay_open(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
) -> None:
    context = client_context(certificate)
    for path in ("/apis", f"/apis/{metrics_api.GROUP}", metrics_api.BASE, "/unknown"):
        code, body = await call(http, setup, context, path=path)
        assert code == 401, path
        assert_status(body, 401, "Unauthorized")
    code, body = await call(http, setup, context, path=metrics_api.BASE,
                            headers={"Authorization": "Bearer nosy-token"})
    assert code == 200
    assert body["kind"] == "APIResourceList"
    [review] = setup.reviews(ACCESS_REVIEWS)
    assert review["spec"]["nonResourceAttributes"] == {"verb": "get", "path": metrics_api.BASE}
    async with http.get(setup.server.url + "/healthz", ssl=context) as response:
        assert response.status == 200


async def test_outcomes_are_counted_in_metrics(
    setup: Setup, http: aiohttp.ClientSession, certificate: tls.CertificatePair,
) -> None:
    context = client_context(certificate)
    await call(http, setup, context)
    await call(http, setup, context, headers={"Authorization": "Bearer nosy-token"})
    text = exposition.generate_latest(observability.make_registry(
        setup.state, clock=time.time, process=False)).decode()
    assert 'scaler_metrics_api_requests_total{code="401"} 1.0' in text
    assert 'scaler_metrics_api_requests_total{code="403"} 1.0' in text


async def test_missing_config_map_leaves_bearer_tokens_only(
    emulator: kube_emulator.KubeEmulator,
) -> None:
    emulator.store.delete(emulator.resource("", "configmaps"), "kube-system",
                          "extension-apiserver-authentication")
    api_client = await kube.make_api_client(kube_settings.KubeSettings(host=emulator.url))
    try:
        delegation = delegated.KubeDelegation(kube.KubeApi(api_client, timeout_s=5.0))
        assert await delegation.authentication_config() == delegated.AuthenticationConfig()
        emulator.inject(kube_emulator.Fault(path="configmaps", status=403, message="forbidden"))
        with pytest.raises(delegated.DelegationError, match="extension-apiserver-auth"):
            await delegation.authentication_config()
    finally:
        await api_client.close()


async def test_without_authentication_or_a_cluster_anyone_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unreachable:
        async def authentication_config(self) -> delegated.AuthenticationConfig:
            raise AssertionError("authentication off: the cluster is not asked")

        async def review_token(self, token: str) -> delegated.UserInfo | None:
            raise AssertionError("not asked")

        async def review_access(self, user: delegated.UserInfo,
                                request: delegated.AccessRequest) -> delegated.AccessDecision:
            raise AssertionError("not asked")

    assert await authn.make_gate(Unreachable(), enabled=False) is None
    assert await authn.make_gate(None, enabled=True) is None
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    assert "authentication off" in caplog.records[0].getMessage()


def test_malformed_config_map_key_is_named() -> None:
    with pytest.raises(ValueError, match="requestheader-allowed-names"):
        delegated.parse_config({"requestheader-allowed-names": "front-proxy-client"})
    config = delegated.parse_config({"requestheader-allowed-names": "[]"})
    assert config.allowed_names == ()  # empty: any CN the requestheader CA signed


def test_server_without_client_cas_asks_for_no_certificate(
    certificate: tls.CertificatePair, tmp_path: Path,
) -> None:
    assert tls.server_context(certificate).verify_mode == ssl.CERT_NONE
    ca = pki.make_ca(tmp_path, "some-ca")
    assert tls.server_context(certificate, client_cas=ca.pem).verify_mode == ssl.CERT_OPTIONAL


PROXY_CA = b"proxy-ca-der"


@pytest.mark.parametrize(
    ("allowed", "chain", "common_names", "headers", "expected"),
    [
        # An empty allowed list: any CN the requestheader CA signed, as the API server does.
        ((), [b"leaf", PROXY_CA], ["anyone"], [("X-Remote-User", "u")], ("u", ())),
        ((PROXY_NAME,), [b"leaf", PROXY_CA], [PROXY_NAME],
         [("X-Remote-User", "u"), ("X-Remote-Group", "a"), ("X-Remote-Group", "b")],
         ("u", ("a", "b"))),
        ((PROXY_NAME,), [b"leaf", PROXY_CA], ["other"], [("X-Remote-User", "u")], None),
        ((), [b"leaf", b"another-ca"], [PROXY_NAME], [("X-Remote-User", "u")], None),
        ((), [], [], [("X-Remote-User", "u")], None),  # no certificate at all
        ((), [PROXY_CA], [PROXY_NAME], [("X-Remote-User", "u")], None),  # the CA itself
        ((), [b"leaf", PROXY_CA], [PROXY_NAME], [("X-Remote-User", " ")], None),
    ],
)
def test_front_proxy_rules(
    allowed: tuple[str, ...], chain: list[bytes], common_names: list[str],
    headers: list[tuple[str, str]], expected: tuple[str, tuple[str, ...]] | None,
) -> None:
    config = delegated.AuthenticationConfig(
        allowed_names=allowed, username_headers=("X-Remote-User",),
        group_headers=("X-Remote-Group",), extra_headers_prefixes=("X-Remote-Extra-",))
    trust = authn.Trust(config=config, client_cas=frozenset(),
                        requestheader_cas=frozenset({PROXY_CA}))
    user = authn.front_proxy_user(trust, chain=chain, common_names=common_names,
                                  headers=multidict.CIMultiDictProxy(multidict.CIMultiDict(headers)))
    assert (None if user is None else (user.username, user.groups)) == expected
