"""The Helm chart, rendered with the real Helm SDK and validated against Kubernetes schemas."""

from __future__ import annotations

import base64
import json
import ssl
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pydantic
import pytest
import yaml

from scaler import cli
from scaler.actuators import rbac
from scaler.policy import loader
from scaler.service import settings as service_settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "scaler"
KUBE_VERSIONS = ["1.30.0", "1.37.0"]
NAMESPACE = "scaler-system"
CERT_MANAGER = "cert-manager.io/v1"  # CRDs: no schema in kubernetes-validate


def render(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(values or {}, name="scaler", namespace=NAMESPACE, is_install=True)
    out: dict[str, list[dict[str, Any]]] = {}
    for path, text in rendered.items():
        if path.endswith(".txt"):
            continue
        out[Path(path).name] = [d for d in yaml.safe_load_all(text) if d]
    return out


def all_objects(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [obj for objs in rendered.values() for obj in objs]


def example_policies() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((REPO / "config").glob("*.yaml"))}


def settings_of(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path,
                environ: dict[str, str] | None = None) -> service_settings.Settings:
    """The service's settings as the pod loads them from the rendered ConfigMap."""
    text = next(o for o in rendered["configmap.yaml"]
                if o["metadata"]["name"].endswith("-settings"))["data"]["settings.yaml"]
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return service_settings.load_settings(path, environ=environ or {})


def pod_spec(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (deployment,) = rendered["deployment.yaml"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


FULL = {
    "policies": example_policies(),
    "watchNamespaces": ["inference", "batch"],
    "placeholder": {"enabled": True},
    "capacityBuffer": {"enabled": True},
    "rbac": {"clusterApi": True, "extraScaleTargets": [
        {"apiGroup": "example.com", "resources": ["llamas"]}]},
    "externalMetricsApi": {"tlsSecret": "scaler-tls", "caBundle": "Q0E="},
    "networkPolicy": {"metricsApi": {"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
                      "egress": {"enabled": True, "rules": [
                          {"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                           "ports": [{"port": 443, "protocol": "TCP"}]}]}},
}
CERT_MANAGER_MODE = {"externalMetricsApi": {"certManager": {"enabled": True}}}
CLUSTER_WIDE = {"rbac": {"clusterWide": True}}


def test_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", [{}, FULL, CERT_MANAGER_MODE, CLUSTER_WIDE],
                         ids=["defaults", "full", "cert-manager", "cluster-wide"])
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_matches_the_kubernetes_schema(values: dict[str, Any],
                                                      kube_version: str) -> None:
    objects = all_objects(render(values))
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ConfigMap", "ClusterRole", "Role", "Service", "NetworkPolicy",
            "APIService", "PodDisruptionBudget"} <= kinds
    for obj in objects:
        if obj["apiVersion"] == CERT_MANAGER:
            continue  # checked field by field in test_cert_manager_issues_the_certificate
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_policies_in_the_configmap_load_without_errors(tmp_path: Path) -> None:
    rendered = render(FULL)
    (policies,) = [o for o in rendered["configmap.yaml"] if o["metadata"]["name"].endswith(
        "-policies")]
    for name, text in policies["data"].items():
        (tmp_path / name).write_text(text)
    result = loader.load_paths([tmp_path])
    shipped = loader.load_paths([REPO / "config"])
    assert result.errors == []
    assert len(example_policies()) == len(policies["data"])
    assert [p.key for p in result.policies] == [p.key for p in shipped.policies]
    assert len(result.pools) == len(shipped.pools) > 0
    assert len(result.budgets) == len(shipped.budgets) > 0


# -- RBAC: exactly what `scaler kube rbac` prints for the rendered settings ---------------

RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def _without_labels(objects: list[dict[str, Any]]) -> list[str]:
    out = []
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        obj["metadata"].pop("labels", None)
        out.append(json.dumps(obj, sort_keys=True))
    return sorted(out)


@pytest.mark.parametrize("values", [
    {}, FULL, CLUSTER_WIDE, {"externalMetricsApi": {"register": False}},
    {"settings": {"kube": {"lease": {"enabled": False}}}, "watchNamespaces": ["a"]},
    {"settings": {"policies": {"resources": True}}},
], ids=["defaults", "full", "cluster-wide", "unregistered", "no-lease", "policy-resources"])
def test_rbac_is_exactly_what_scaler_kube_rbac_prints(
        values: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The chart's RBAC objects equal what `scaler kube rbac --settings` prints for the
    settings file the chart renders (and that printer's own test records every request
    the adapters make against the emulator)."""
    rendered = render(values)
    chart = [o for o in all_objects(rendered) if o["kind"] in RBAC_KINDS]
    settings = settings_of(rendered, tmp_path)
    chart_rbac = values.get("rbac", {})
    argv = ["kube", "rbac", "--settings", str(tmp_path / "settings.yaml"),
            "--namespace", NAMESPACE]
    argv += ["--clusterapi"] if chart_rbac.get("clusterApi") else []
    argv += ["--policy-resources"] if settings.policies.resources else []
    argv += ["--no-metrics-api"] if values.get("externalMetricsApi", {}).get(
        "register") is False else []
    for target in chart_rbac.get("extraScaleTargets", []):
        argv += [arg for r in target["resources"]
                 for arg in ("--scale-target", f"{target['apiGroup']}/{r}")]
    capsys.readouterr()
    assert cli.main(argv) == 0
    printed = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert _without_labels(chart) == _without_labels(printed)
    subject = {"kind": "ServiceAccount", "name": "scaler", "namespace": NAMESPACE}
    granted = rbac.grants(chart, subject)
    assert not any(verb == "*" for *_, verb in granted)
    wide = {resource for where, _, resource, _ in granted if where == "*"}
    assert wide == ({"nodes", "resourceslices", "deviceclasses"} | (
        {"gpupools", "gpubudgets", "gpupools/status", "gpubudgets/status"}
        if settings.policies.resources else set()) | (
        {"pods", "events", "deployments/scale", "statefulsets/scale", "resourceclaims",
         "deployments", "statefulsets",
         "leaderworkersets/scale", "horizontalpodautoscalers", "scaledobjects"}
        if settings.kube.cluster_wide else set()))
    creates = {where for where, group, resource, verb in granted
               if (group, resource, verb) == ("apps", "deployments", "create")}
    assert creates == ({NAMESPACE} if settings.kube.placeholder.enabled else set())


def test_namespaces_are_the_release_namespace_unless_listed(tmp_path: Path) -> None:
    assert settings_of(render(), tmp_path).kube.watch_namespaces == (NAMESPACE,)
    listed = settings_of(render(FULL), tmp_path).kube
    assert listed.watch_namespaces == ("inference", "batch") and not listed.cluster_wide
    wide = settings_of(render(CLUSTER_WIDE), tmp_path).kube
    assert wide.watch_namespaces == () and wide.cluster_wide


# -- the image: a full reference, pinned by digest when one is given ------------------------

DIGEST = "sha256:" + "0123456789abcdef" * 4


def _image(values: dict[str, Any]) -> str:
    (container,) = pod_spec(render(values))["containers"]
    image: str = container["image"]
    return image


@pytest.mark.parametrize(("values", "expected"), [
    ({}, "{registry}/{repository}:{version}"),
    ({"image": {"tag": "0.2.0-rc1"}}, "{registry}/{repository}:0.2.0-rc1"),
    ({"image": {"digest": DIGEST}}, "{registry}/{repository}@" + DIGEST),
    ({"image": {"tag": "0.2.0", "digest": DIGEST}}, "{registry}/{repository}@" + DIGEST),
    ({"image": {"registry": "registry.example.com:5000/", "repository": "ml/scaler"}},
     "registry.example.com:5000/ml/scaler:{version}"),
    ({"image": {"registry": "", "repository": "scaler"}}, "scaler:{version}"),
], ids=["defaults", "tag", "digest", "digest-over-tag", "own-registry", "no-registry"])
def test_the_image_is_a_full_reference(values: dict[str, Any], expected: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    # scripts/build-image tags the image with the package's version: the chart's default
    # tag (its appVersion) must be that version, or the default reference names no image.
    assert chart["appVersion"] == package
    assert _image(values) == expected.format(version=chart["appVersion"], **defaults)


@pytest.mark.parametrize("digest", ["0123abcd", "sha256:" + "A" * 64, "sha512:" + "0" * 128])
def test_a_malformed_digest_fails_with_what_to_set(digest: str) -> None:
    with pytest.raises(helm.HelmError, match="image.digest"):
        render({"image": {"digest": digest}})


@pytest.mark.parametrize(("values", "message"), [
    ({"settings": {"kube": {"watch_namespaces": ["x"]}}}, "set watchNamespaces instead"),
    ({"settings": {"kube": {"placeholder": {"enabled": True}}}}, "set placeholder.enabled"),
    ({"watchNamespaces": ["a"], "rbac": {"clusterWide": True}}, "exclude each other"),
    ({"externalMetricsApi": {"tlsSecret": "mine"}}, "needs externalMetricsApi.caBundle"),
    ({"secrets": {"env": {"http.port": {"secretName": "s", "key": "k"}}}},
     "not a secret setting"),
    ({"secrets": {"files": {"audit.path": {"secretName": "s", "key": "k"}}}},
     "not a file setting"),
    ({"settings": {"http": {"push_token": "t"}},
      "secrets": {"env": {"http.push_token": {"secretName": "s", "key": "k"}}}}, "give one"),
], ids=["watch-namespaces", "placeholder", "both-scopes", "tls-without-ca", "env-unknown",
        "file-unknown", "inline-and-secret"])
def test_bad_values_fail_with_what_to_set(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


# -- secrets never in a ConfigMap -----------------------------------------------------------

def _secret_settings(group: type[pydantic.BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted names of every SecretStr setting, found in the Settings model itself."""
    for name, field in group.model_fields.items():
        types = (field.annotation, *typing.get_args(field.annotation))
        if pydantic.SecretStr in types:
            yield f"{prefix}{name}"
        for each in types:
            if isinstance(each, type) and issubclass(each, pydantic.BaseModel):
                yield from _secret_settings(each, f"{prefix}{name}.")


SECRET_SETTINGS = sorted(_secret_settings(service_settings.Settings))
FILE_SETTINGS = ["nats.creds_file", "nats.nkey_seed_file", "nats.tls.ca_file",
                 "nats.tls.cert_file", "nats.tls.key_file"]


def _env_name(setting: str) -> str:
    return "SCALER_" + setting.upper().replace(".", "__")


def test_inline_secret_settings_go_to_a_secret_only(tmp_path: Path) -> None:
    assert len(SECRET_SETTINGS) >= 5  # push token, NATS password and token, Prometheus x2
    # NATS allows one auth method: the password and the token go in two renders.
    for chosen in ([s for s in SECRET_SETTINGS if s != "nats.token"], ["nats.token"]):
        plain = {s: f"plain-{s.replace('.', '-')}-0123456789" for s in chosen}
        settings: dict[str, dict[str, str]] = {}
        for setting, value in plain.items():
            group, field = setting.split(".")
            settings.setdefault(group, {})[field] = value
        if "nats.password" in plain:
            settings["nats"]["user"] = "scaler"
        if "prometheus.basic_auth_password" in plain:
            settings["prometheus"]["basic_auth_user"] = "scaler"
        rendered = render({"settings": settings})
        for obj in all_objects(rendered):
            text = json.dumps(obj)
            if obj["kind"] != "Secret":
                assert not [v for v in plain.values() if v in text], obj["metadata"]["name"]
        (secret,) = [o for o in rendered["secret.yaml"]]
        stored = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        assert stored == {_env_name(s): v for s, v in plain.items()}
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod_spec(rendered)[
            "containers"][0]["env"]}
        assert env == {_env_name(s): {"name": "scaler-secrets", "key": _env_name(s)}
                       for s in plain}
        # The pod then has them: the settings file plus the variables the Secret gives.
        loaded = settings_of(rendered, tmp_path, environ=stored)
        for setting, value in plain.items():
            group, field = setting.split(".")
            assert getattr(getattr(loaded, group), field).get_secret_value() == value


def test_every_secret_from_existing_secrets_as_env_and_files(tmp_path: Path) -> None:
    env_settings = [s for s in SECRET_SETTINGS if s != "nats.token"] + [
        "nats.user", "prometheus.basic_auth_user"]
    values: dict[str, Any] = {"secrets": {
        "env": {s: {"secretName": f"src-{s.split('.')[0]}", "key": s} for s in env_settings},
        "envFrom": [{"secretRef": {"name": "scaler-env"}}],
        "files": {s: {"secretName": "nats-material", "key": s.split(".")[-1]}
                  for s in FILE_SETTINGS if s != "nats.nkey_seed_file"}}}
    rendered = render(values)
    container = pod_spec(rendered)["containers"][0]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]} == {
        _env_name(s): {"name": f"src-{s.split('.')[0]}", "key": s} for s in env_settings}
    assert container["envFrom"] == [{"secretRef": {"name": "scaler-env"}}]
    assert "secret.yaml" not in rendered or rendered["secret.yaml"] == []
    # Files: each key mounted read-only, and the setting names that file.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    loaded = settings_of(rendered, tmp_path)
    for setting in values["secrets"]["files"]:
        label = setting.replace(".", "-").replace("_", "-")
        key = setting.split(".")[-1]
        assert volumes[f"secret-{label}"]["secret"] == {
            "secretName": "nats-material", "items": [{"key": key, "path": key}]}
        mount = mounts[f"secret-{label}"]
        assert mount["readOnly"] is True
        node: Any = loaded
        for part in setting.split("."):
            node = getattr(node, part)
        assert node == Path(mount["mountPath"]) / key
    seed = render({"secrets": {"files": {"nats.nkey_seed_file": {
        "secretName": "seed", "key": "seed.nk"}}}})
    assert settings_of(seed, tmp_path).nats.nkey_seed_file == Path(
        "/etc/scaler/secrets/nats-nkey-seed-file/seed.nk")


def test_nats_token_from_a_secret_is_accepted() -> None:
    rendered = render({"secrets": {"env": {"nats.token": {"secretName": "t", "key": "k"}}}})
    assert pod_spec(rendered)["containers"][0]["env"] == [
        {"name": "SCALER_NATS__TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}]


# -- the metrics API's serving certificate ---------------------------------------------------

def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake between two in-memory ends (no socket): raises if the client does
    not accept the server's certificate for `hostname`."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    client_end = client.wrap_bio(to_client, to_server, server_hostname=hostname)
    done = {"server": False, "client": False}
    for _ in range(10):
        for name, end in (("client", client_end), ("server", server_end)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def test_generated_certificate_is_verified_by_the_aggregator(tmp_path: Path) -> None:
    rendered = render()
    secret, api_service = rendered["apiservice.yaml"]
    assert secret["kind"] == "Secret" and secret["type"] == "kubernetes.io/tls"
    spec = api_service["spec"]
    assert "insecureSkipTLSVerify" not in spec
    assert spec["caBundle"] == secret["data"]["ca.crt"]
    files = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    # The pod mounts that Secret and the service serves it.
    assert {"name": "tls", "secret": {"secretName": secret["metadata"]["name"]}} in pod_spec(
        rendered)["volumes"]
    loaded = settings_of(rendered, tmp_path)
    assert loaded.metrics_api.cert_file == Path("/etc/scaler/tls/tls.crt")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    aggregator = ssl.create_default_context(cadata=files["ca.crt"])
    _handshake(server, aggregator, f"scaler.{NAMESPACE}.svc")  # how the aggregator dials it
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, aggregator, "kubernetes.default.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, ssl.create_default_context(), f"scaler.{NAMESPACE}.svc")
    # The private key is in that Secret and nowhere else.
    key_line = files["tls.key"].splitlines()[1]
    assert [o["metadata"]["name"] for o in all_objects(rendered)
            if key_line in json.dumps(o) or secret["data"]["tls.key"] in json.dumps(o)] == [
        secret["metadata"]["name"]]


def test_cert_manager_issues_the_certificate(tmp_path: Path) -> None:
    rendered = render(CERT_MANAGER_MODE)
    (api_service,) = rendered["apiservice.yaml"]
    assert "caBundle" not in api_service["spec"]
    assert "insecureSkipTLSVerify" not in api_service["spec"]
    injected = api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered["certmanager.yaml"]}
    certificate = objects[("Certificate", injected.split("/")[1])]
    assert injected.split("/")[0] == NAMESPACE
    assert f"scaler.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    issuer = certificate["spec"]["issuerRef"]
    ca_issuer = objects[(issuer["kind"], issuer["name"])]
    ca_certificate = objects[("Certificate", "scaler-metrics-api-ca")]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_certificate["spec"]["secretName"]
    assert ca_certificate["spec"]["isCA"] is True
    assert {"name": "tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in (
        pod_spec(rendered)["volumes"])
    assert settings_of(rendered, tmp_path).metrics_api.key_file == Path("/etc/scaler/tls/tls.key")
    own = render({"externalMetricsApi": {"certManager": {
        "enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}})
    assert [(o["kind"], o["spec"]["issuerRef"]) for o in own["certmanager.yaml"]] == [
        ("Certificate", {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})]


def test_skipping_verification_is_development_only(tmp_path: Path) -> None:
    rendered = render({"externalMetricsApi": {"insecureSkipTLSVerify": True}})
    (api_service,) = rendered["apiservice.yaml"]
    assert api_service["spec"]["insecureSkipTLSVerify"] is True
    assert "tls" not in {v["name"] for v in pod_spec(rendered)["volumes"]}
    assert settings_of(rendered, tmp_path).metrics_api.cert_file is None


def test_own_tls_secret_is_mounted_and_named_in_settings(tmp_path: Path) -> None:
    rendered = render(FULL)
    assert {"name": "tls", "secret": {"secretName": "scaler-tls"}} in pod_spec(rendered)["volumes"]
    assert settings_of(rendered, tmp_path).metrics_api.cert_file == Path(
        "/etc/scaler/tls/tls.crt")
    (api_service,) = rendered["apiservice.yaml"]
    assert api_service["spec"]["caBundle"] == "Q0E=" and "insecureSkipTLSVerify" not in (
        api_service["spec"])


def test_registration_can_be_left_to_another_provider() -> None:
    rendered = render({"externalMetricsApi": {"register": False}})
    assert [o["kind"] for o in rendered["apiservice.yaml"]] == ["Secret"]  # still serves TLS
    names = [o["metadata"]["name"] for o in rendered["rbac.yaml"]]
    assert not any("auth-delegator" in n for n in names)


# -- network exposure ------------------------------------------------------------------------

def test_network_policy_admits_scrapers_publishers_and_the_aggregator() -> None:
    (default,) = render()["networkpolicy.yaml"]
    spec = default["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress open unless asked
    http, metrics_api = spec["ingress"]
    assert http["ports"] == [{"port": "http", "protocol": "TCP"}]
    labels = [peer["podSelector"]["matchLabels"] for peer in http["from"]]
    assert labels == [{"app.kubernetes.io/name": "prometheus"}, {"scaler.io/publisher": "true"}]
    assert metrics_api == {"ports": [{"port": "metrics-api", "protocol": "TCP"}]}

    (full,) = render(FULL)["networkpolicy.yaml"]
    assert full["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert full["spec"]["ingress"][1]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    dns, api_server = full["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert api_server["to"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]

    closed = render({"networkPolicy": {"scrapers": [], "publishers": []}})["networkpolicy.yaml"]
    assert [rule["ports"][0]["port"] for rule in closed[0]["spec"]["ingress"]] == [
        "metrics-api"]
    assert render({"networkPolicy": {"enabled": False}}).get("networkpolicy.yaml", []) == []


# -- shipped defaults ------------------------------------------------------------------------

def test_rendered_settings_load_into_the_service_settings(tmp_path: Path) -> None:
    """The shipped values.yaml must parse into the code's Settings (Knative's config/testdata
    idea): a renamed or mistyped key fails here, not in a cluster."""
    for values in ({}, FULL, CERT_MANAGER_MODE, CLUSTER_WIDE,
                   {"settings": {"kube": {"dry_run": True}}}):
        loaded = settings_of(render(values), tmp_path)
        assert loaded.kube.lease.namespace == NAMESPACE
        assert loaded.kube.lease.name == "scaler-leader"
        assert loaded.kube.placeholder.priority_class == "scaler-placeholder"
        assert loaded.kube.placeholder.namespace == NAMESPACE
        assert [str(p) for p in loaded.policies.paths] == ["/etc/scaler/policies"]
    assert loaded.kube.dry_run is True
    defaults = service_settings.Settings()
    # Where the chart does not say otherwise, the code's defaults stand.
    assert loaded.engine == defaults.engine and loaded.audit == defaults.audit
    assert loaded.kube.placeholder.enabled is False


def test_push_on_its_own_port_admits_publishers_there_only() -> None:
    rendered = render({"settings": {"http": {"port": 8080, "push_port": 8081,
                                             "cert_file": "/tls/http/tls.crt",
                                             "key_file": "/tls/http/tls.key"}}})
    (policy,) = rendered["networkpolicy.yaml"]
    scrapers, publishers, _ = policy["spec"]["ingress"]
    assert scrapers["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert [p["podSelector"]["matchLabels"] for p in scrapers["from"]] == [
        {"app.kubernetes.io/name": "prometheus"}]
    assert publishers["ports"] == [{"port": "push", "protocol": "TCP"}]
    assert [p["podSelector"]["matchLabels"] for p in publishers["from"]] == [
        {"scaler.io/publisher": "true"}]
    (deployment,) = rendered["deployment.yaml"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "push", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (service,) = rendered["service.yaml"]
    assert {"name": "push", "port": 8081, "targetPort": "push", "protocol": "TCP"} in (
        service["spec"]["ports"])
    for obj in all_objects(rendered):
        if obj["apiVersion"] != CERT_MANAGER:
            kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)


# -- sharding: a Deployment and a PDB per shard, one Service for every model ----------------

SHARDED = {"sharding": {"shards": 3}}
SHARD_LABEL = "scaler.io/shard"
SHARD_ENV = "SCALER_SHARDING__SHARD"


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _env_values(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _without_shard(deployment: dict[str, Any]) -> dict[str, Any]:
    """The pod spec with the shard's one difference (its env variable) taken out."""
    spec: dict[str, Any] = json.loads(json.dumps(deployment["spec"]["template"]["spec"]))
    (container,) = spec["containers"]
    container["env"] = [e for e in container.get("env", []) if e["name"] != SHARD_ENV]
    if not container["env"]:
        del container["env"]
    return spec


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_each_shard_is_its_own_deployment_of_the_same_pod(kube_version: str,
                                                          tmp_path: Path) -> None:
    rendered = render(SHARDED)
    for obj in all_objects(rendered):
        if obj["apiVersion"] != CERT_MANAGER:
            kubernetes_validate.validate(obj, kube_version, strict=True)
    deployments = rendered["deployment.yaml"]
    assert [d["metadata"]["name"] for d in deployments] == [
        "scaler-shard-0", "scaler-shard-1", "scaler-shard-2"]
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in deployments]
    assert [labels[SHARD_LABEL] for labels in pod_labels] == ["0", "1", "2"]
    # The settings file says how many shards; each Deployment's env says which one.
    settings_file = yaml.safe_load(rendered["configmap.yaml"][0]["data"]["settings.yaml"])
    assert settings_file["sharding"] == {"shards": 3}
    for shard, deployment in enumerate(deployments):
        assert deployment["spec"]["replicas"] == 2  # a leader and a follower per shard
        env = _env_values(deployment)
        assert env == {SHARD_ENV: str(shard)}
        loaded = settings_of(rendered, tmp_path, environ=env).sharding
        assert (loaded.shards, loaded.shard) == (3, shard)
        # Deployments never select each other's pods (each would fight over the others).
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert [_selects(selector, labels) for labels in pod_labels] == [
            other == shard for other in range(3)]
    # Beyond that, the pod is the unsharded one (the settings checksum aside).
    unsharded = render()["deployment.yaml"][0]
    assert all(_without_shard(d) == _without_shard(unsharded) for d in deployments)
    # Any pod answers the metrics API for every model: the Service (so the APIService),
    # the NetworkPolicy and the monitor select every shard's pods.
    (service,) = rendered["service.yaml"]
    (policy,) = rendered["networkpolicy.yaml"]
    (monitor,) = render({**SHARDED, "monitoring": {"serviceMonitor": {
        "enabled": True, "kind": "PodMonitor"}}})["servicemonitor.yaml"]
    for selector in (service["spec"]["selector"], policy["spec"]["podSelector"]["matchLabels"],
                     monitor["spec"]["selector"]["matchLabels"]):
        assert all(_selects(selector, labels) for labels in pod_labels)


def test_each_shard_has_its_own_disruption_budget() -> None:
    budgets = render(SHARDED)["pdb.yaml"]
    assert [b["metadata"]["name"] for b in budgets] == [
        "scaler-shard-0", "scaler-shard-1", "scaler-shard-2"]
    pod_labels = [d["spec"]["template"]["metadata"]["labels"]
                  for d in render(SHARDED)["deployment.yaml"]]
    for shard, budget in enumerate(budgets):
        assert budget["spec"]["minAvailable"] == 1
        assert [_selects(budget["spec"]["selector"]["matchLabels"], labels)
                for labels in pod_labels] == [other == shard for other in range(3)]
    # As unsharded: no budget for one pod a shard, nor when disabled.
    assert render({**SHARDED, "replicaCount": 1}).get("pdb.yaml", []) == []
    assert render({**SHARDED, "podDisruptionBudget": {"enabled": False}}).get(
        "pdb.yaml", []) == []


def test_one_shard_is_the_single_deployment(tmp_path: Path) -> None:
    for values in ({}, {"sharding": {"shards": 1}}):
        rendered = render(values)
        (deployment,) = rendered["deployment.yaml"]
        (budget,) = rendered["pdb.yaml"]
        assert deployment["metadata"]["name"] == budget["metadata"]["name"] == "scaler"
        assert SHARD_LABEL not in deployment["spec"]["template"]["metadata"]["labels"]
        assert SHARD_LABEL not in budget["spec"]["selector"]["matchLabels"]
        assert "env" not in deployment["spec"]["template"]["spec"]["containers"][0]
        settings_file = rendered["configmap.yaml"][0]["data"]["settings.yaml"]
        assert "sharding" not in yaml.safe_load(settings_file)
        sharding = settings_of(rendered, tmp_path).sharding
        assert (sharding.shards, sharding.shard) == (1, 0)


def test_sharded_secret_env_keeps_the_secrets_beside_the_shard() -> None:
    rendered = render({**SHARDED, "secrets": {"env": {
        "nats.token": {"secretName": "t", "key": "k"}}}})
    for shard, deployment in enumerate(rendered["deployment.yaml"]):
        assert deployment["spec"]["template"]["spec"]["containers"][0]["env"] == [
            {"name": "SCALER_NATS__TOKEN",
             "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}},
            {"name": SHARD_ENV, "value": str(shard)}]


def test_sharded_chart_lints_clean() -> None:
    report = helm.lint(str(CHART), SHARDED, strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(("values", "message"), [
    ({"sharding": {"shards": 0}}, "sharding.shards: 0 is not a whole number from 1 to 1024"),
    ({"sharding": {"shards": 1025}}, "sharding.shards: 1025 is not"),
    ({"sharding": {"shards": 2.5}}, "sharding.shards: 2.5 is not"),
    ({"sharding": {"shards": "3"}}, 'sharding.shards: "3" is not'),
    ({"settings": {"sharding": {"shards": 3}}}, "settings.sharding.shards: set sharding.shards"),
    ({"settings": {"sharding": {"shard": 1}}}, "settings.sharding.shard: set sharding.shards"),
], ids=["zero", "too-many", "fraction", "string", "shards-in-settings", "shard-in-settings"])
def test_bad_shard_values_fail_with_what_to_set(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_the_most_shards_render() -> None:
    # Rendered text, not parsed: 1024 Deployments take seconds through PyYAML.
    rendered = helm.Chart.load(str(CHART)).render(
        {"sharding": {"shards": 1024}}, name="scaler", namespace=NAMESPACE, is_install=True)
    text = next(t for path, t in rendered.items() if path.endswith("/deployment.yaml"))
    names = [line.split()[-1] for line in text.splitlines() if line.startswith("  name: ")]
    assert names == [f"scaler-shard-{shard}" for shard in range(1024)]
