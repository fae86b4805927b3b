"""The `scaler` command line: one subcommand module per area, wired here."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import scaler
from scaler.actuators import cli as kube_cli
from scaler.actuators import deployment_replicas
from scaler.demo import cli as demo_cli
from scaler.demo import local_cli, nats_server
from scaler.policy import cli as policy_cli
from scaler.service import cli as service_cli

# The modules each extra brings (pyproject.toml): a command that needs a missing one says
# which extra to install, in one line, instead of an ImportError traceback.
EXTRA_OF_MODULE = {"numpy": "sim", "matplotlib": "sim"}
# 128 + SIGPIPE (13): what a shell reports for a writer whose reader went away (`yes | head`).
EXIT_BROKEN_PIPE = 141
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scaler",
        description="Event-driven autoscaler for GPU inference on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    policy_cli.register(subparsers, settings_schema=_settings_schema)
    _register_simulate(subparsers)
    for module in (service_cli, demo_cli, kube_cli):
        module.register(subparsers)
    local_cli.register(subparsers.choices["run"])  # `scaler run --local` (demo layer)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("scaler")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return scaler.__version__


def _missing_extra(error: ModuleNotFoundError) -> str | None:
    """The extra that brings the module `error` could not import, or None (a real bug)."""
    return EXTRA_OF_MODULE.get((error.name or "").partition(".")[0])


def _register_simulate(subparsers: argparse._SubParsersAction[Any]) -> None:
    """`scaler simulate`, or in its place a command that names the extra it needs: its
    options come from the simulator's modules, which need numpy."""
    try:
        from scaler.sim import cli as sim_cli
        from scaler.sim import loadtest_cli, server_cli
    except ModuleNotFoundError as error:
        extra = _missing_extra(error)
        if extra is None:
            raise
        # No option prefix: every word (--help too) is taken, whatever simulate's were.
        for name in ("simulate", "sim-server", "loadtest"):
            stub = subparsers.add_parser(name, add_help=False, prefix_chars="\0",
                                         help=f"(needs the '{extra}' extra)")
            stub.add_argument("words", nargs="*")
            stub.set_defaults(handler=_raise(error))
        return
    sim_cli.register(subparsers)
    server_cli.register(subparsers)
    # The load tester's --kubeconfig reads a Deployment through the actuators' client.
    loadtest_cli.register(subparsers, deployment_source=deployment_replicas.source)


def _raise(error: ModuleNotFoundError) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        raise error

    return handler


def _settings_schema() -> dict[str, Any]:
    # Imported when asked: the settings import every signal source.
    from scaler.service import settings

    return settings.schema_document()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        code: int = handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`scaler schema | head`): nothing is wrong with the command.
        # stdout goes to /dev/null so the interpreter's final flush cannot raise again
        # (the recipe of the Python docs, "Note on SIGPIPE" in the signal module).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as error:
        extra = _missing_extra(error)
        if extra is None:
            raise
        print(f"scaler {args.command}: needs the '{extra}' extra ({error.name} is not "
              f"installed): pip install 'scaler[{extra}]'", file=sys.stderr)
        return EXIT_USAGE
    except nats_server.MissingBinary as error:
        print(f"scaler {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
