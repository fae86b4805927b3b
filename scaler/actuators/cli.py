"""`scaler kube ...`: print the exact RBAC, or run the Kubernetes API emulator for demos."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

import yaml

from scaler.actuators import rbac
from scaler.actuators import settings as kube_settings


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    kube = subparsers.add_parser("kube", help="Kubernetes helpers: RBAC, API emulator")
    commands = kube.add_subparsers(dest="kube_command", metavar="KUBE_COMMAND", required=True)

    defaults = kube_settings.KubeSettings()
    rules = commands.add_parser("rbac", help="print the ClusterRole and Roles the scaler needs")
    rules.add_argument("--name", default="scaler")
    rules.add_argument("--lease-namespace", default=defaults.lease.namespace)
    rules.add_argument("--placeholder-namespace", default=defaults.placeholder.namespace)
    rules.add_argument("--clusterapi-namespace", default=defaults.clusterapi_namespace)
    rules.set_defaults(handler=_rbac)

    emulator = commands.add_parser(
        "emulator", help="serve the Kubernetes API emulator on 127.0.0.1 until interrupted")
    emulator.add_argument("--port", type=int, default=8001)
    emulator.add_argument("--controller", action="store_true",
                          help="turn Deployment replicas into pods that become Ready")
    emulator.add_argument("--schedule-delay", type=float, default=1.0, metavar="SECONDS")
    emulator.add_argument("--start-delay", type=float, default=30.0, metavar="SECONDS",
                          help="scheduled -> containers running (image pull + model load)")
    emulator.add_argument("--ready-delay", type=float, default=10.0, metavar="SECONDS")
    emulator.set_defaults(handler=_emulator)


def _rbac(args: argparse.Namespace) -> int:
    documents = rbac.manifests(name=args.name, lease_namespace=args.lease_namespace,
                               placeholder_namespace=args.placeholder_namespace,
                               clusterapi_namespace=args.clusterapi_namespace)
    print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    return 0


def _emulator(args: argparse.Namespace) -> int:
    # Test infrastructure, imported only when asked for.
    from scaler.testing.kube_emulator import ControllerSettings, EmulatorController, KubeEmulator

    async def serve() -> None:
        emulator = KubeEmulator(clock=time.time)
        url = await emulator.start(port=args.port)
        try:
            print(f"Kubernetes API emulator on {url} (kubeconfig server: {url})", flush=True)
            if not args.controller:
                await asyncio.Event().wait()
            controller = EmulatorController(emulator, ControllerSettings(
                schedule_delay_s=args.schedule_delay, start_delay_s=args.start_delay,
                ready_delay_s=args.ready_delay))
            await controller.run()
        finally:
            await emulator.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0
