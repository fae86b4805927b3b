"""`scaler kube ...`: Kubernetes helpers (the exact RBAC the service needs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import config

from scaler.actuators import client as kube
from scaler.actuators import rbac
from scaler.actuators import settings as kube_settings
from scaler.policy import loader


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    kube = subparsers.add_parser("kube", help="Kubernetes helpers: RBAC")
    commands = kube.add_subparsers(dest="kube_command", metavar="KUBE_COMMAND", required=True)

    rules = commands.add_parser(
        "rbac", help="print the ServiceAccount, Roles, ClusterRoles and bindings the scaler "
        "needs with the given settings (exactly what the Helm chart grants)")
    rules.add_argument("--settings", type=Path, metavar="FILE",
                       help="service settings file whose kube group decides (namespaces, "
                       "cluster_wide, lease, placeholder); the flags below override it")
    rules.add_argument("--policies", type=Path, action="append", default=[], metavar="PATH",
                       help="policy files or folders: their namespaces get the target Roles "
                       "when kube.watch_namespaces is empty, and their targets' kinds "
                       "(spec.target and each variant's) their scale rules")
    rules.add_argument("--watch-namespace", action="append", default=[], metavar="NS",
                       dest="watch_namespaces", help="a namespace with targets (repeat)")
    rules.add_argument("--cluster-wide", action="store_true",
                       help="ClusterRoles for targets and pods in every namespace")
    rules.add_argument("--name", default="scaler", help="prefix of the role names")
    rules.add_argument("--namespace", default="scaler-system", metavar="NS",
                       help="where the scaler runs: its ServiceAccount (and, without "
                       "--settings, its Lease and placeholders)")
    rules.add_argument("--service-account", metavar="NAME", help="default: --name")
    rules.add_argument("--lease-namespace", metavar="NS")
    rules.add_argument("--placeholder", action="store_true",
                       help="the placeholder node-pool actuator is on (Deployment create)")
    rules.add_argument("--placeholder-namespace", metavar="NS")
    rules.add_argument("--capacitybuffer", action="store_true",
                       help="the capacitybuffer node-pool actuator is on (CapacityBuffer and "
                       "PodTemplate create)")
    rules.add_argument("--capacitybuffer-namespace", metavar="NS")
    rules.add_argument("--clusterapi", action="store_true", help="Cluster API node pools")
    rules.add_argument("--policy-resources", action="store_true",
                       help="ScalePolicy resources are read and their status written "
                       "(policies.resources)")
    rules.add_argument("--clusterapi-namespace", metavar="NS")
    rules.add_argument("--scale-target", action="append", default=[],
                       metavar="GROUP/RESOURCE", help="another kind to scale, e.g. "
                       "example.com/llamas (repeat)")
    rules.add_argument("--no-metrics-api", action="store_true",
                       help="the external metrics APIService is not registered")
    rules.set_defaults(handler=_rbac)


def _rbac(args: argparse.Namespace) -> int:
    try:
        data = (rbac.kube_settings_file(args.settings) if args.settings
                else kube_settings.KubeSettings(
                    lease=kube_settings.LeaseSettings(namespace=args.namespace),
                    placeholder=kube_settings.PlaceholderSettings(namespace=args.namespace),
                    capacitybuffer=kube_settings.CapacityBufferSettings(
                        namespace=args.namespace),
                )).model_dump()
        if args.watch_namespaces:
            data["watch_namespaces"] = args.watch_namespaces
        data["cluster_wide"] = data["cluster_wide"] or args.cluster_wide
        data["placeholder"]["enabled"] = data["placeholder"]["enabled"] or args.placeholder
        data["capacitybuffer"]["enabled"] = (data["capacitybuffer"]["enabled"]
                                             or args.capacitybuffer)
        for key, value in (("lease", args.lease_namespace),
                           ("placeholder", args.placeholder_namespace),
                           ("capacitybuffer", args.capacitybuffer_namespace)):
            if value:
                data[key]["namespace"] = value
        if args.clusterapi_namespace:
            data["clusterapi_namespace"] = args.clusterapi_namespace
        settings = kube_settings.KubeSettings.model_validate(data)
        policies = loader.load_paths(args.policies) if args.policies else loader.LoadResult()
        for error in policies.errors:
            print(f"error {error}", file=sys.stderr)
        if policies.errors:
            return 1
        grants = rbac.plan(
            settings, name=args.name, namespace=args.namespace,
            service_account=args.service_account,
            policy_namespaces=[p.metadata.namespace for p in policies.policies],
            clusterapi=args.clusterapi or bool(args.clusterapi_namespace),
            metrics_api=not args.no_metrics_api,
            extra_scale_targets=list(dict.fromkeys([
                *(rbac.ScaleTarget.parse(t) for t in args.scale_target),
                *rbac.policy_scale_targets(policies.policies,
                                           plurals=settings.resource_plurals)])),
            policy_resources=args.policy_resources)
    except ValueError as error:
        print(f"scaler kube rbac: {error}", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(rbac.manifests(grants), sort_keys=False), end="")
    return 0


async def cluster_problem(settings: kube_settings.KubeSettings) -> str | None:
    """Why the service could not talk to the Kubernetes API, in one line, or None.

    `scaler run` asks before it starts, so a laptop without a cluster hears what is
    missing instead of a client library's traceback. One GET /version, not retried:
    reachable is all this checks (rights are the service's own to find out).
    """
    try:
        api_client = await kube.make_api_client(settings)
    except (config.ConfigException, OSError) as error:
        return ("no Kubernetes cluster to talk to: not in a pod with a service account, and "
                "no kube.kubeconfig or kube.host set (e.g. SCALER_KUBE__KUBECONFIG="
                f"~/.kube/config): {error}")
    try:
        api = kube.KubeApi(api_client, timeout_s=settings.request_timeout_s,
                           retry=settings.retry.model_copy(update={"max_attempts": 1}))
        await api.get("/version")
    except kube.KubeError as error:
        if error.status == 0:  # no answer at all; any HTTP status means someone is there
            return (f"cannot reach the Kubernetes API at {api_client.configuration.host}: "
                    f"{error}")
    finally:
        await api_client.close()
    return None
