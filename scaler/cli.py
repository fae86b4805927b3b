"""The `scaler` command line: one subcommand module per area, wired here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scaler.actuators import cli as kube_cli
from scaler.policy import cli as policy_cli
from scaler.service import cli as service_cli
from scaler.sim import cli as sim_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scaler",
        description="Event-driven autoscaler for GPU inference on Kubernetes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (policy_cli, sim_cli, service_cli, kube_cli):
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
