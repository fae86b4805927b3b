"""`scaler run --local`'s options on the `run` command; the mode itself is `scaler.demo.local`.

Light to import (no emulator, no service): the command line builds its parser on every
call, `scaler --version` included.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def parse_seconds(text: str) -> float:
    """A duration as the command line takes it: "20", "20s", "1.5m" or "500ms" -> seconds."""
    value = text.strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if value.endswith(suffix):
            value, scale = value[: -len(suffix)], factor
            break
    try:
        seconds = float(value) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 20s, 1.5m, 500ms)") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration of zero seconds or more")
    return seconds


def _duration(text: str) -> float:
    try:
        return parse_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(run: argparse.ArgumentParser) -> None:
    """Add --local, --cold-start and --load to `scaler run` (registered by the service's
    command line, which may not import this layer); `scaler run` without --local is as it
    was."""
    group = run.add_argument_group(
        "local mode", "try the real service without a cluster (docs/service.md, Local mode)")
    group.add_argument(
        "--local", action="store_true",
        help="start the Kubernetes API emulator seeded from the policies (namespaces, each "
        "target Deployment, a GPU node pool per policy) and an embedded nats-server on "
        "loopback, and run the service against them; --policies defaults to the shipped "
        "examples")
    group.add_argument(
        "--cold-start", type=_duration, metavar="DURATION",
        help="with --local: time from a pod's creation to Ready, e.g. 20s, 1.5m (default 20s)")
    group.add_argument(
        "--load", action="store_true",
        help="with --local: publish a synthetic signal wave to NATS for every model, so "
        "scaling happens without a publisher of your own")
    service: Callable[[argparse.Namespace], int] = run.get_default("handler")

    def handler(args: argparse.Namespace) -> int:
        if not args.local:
            if args.load or args.cold_start is not None:
                run.error("--load and --cold-start go with --local")
            return service(args)
        from scaler.demo import local

        return local.main(local.LocalOptions(
            policies=tuple(args.policies or (local.DEFAULT_POLICIES,)),
            settings_file=args.settings, dry_run=args.dry_run, load=args.load,
            cold_start_s=(local.DEFAULT_COLD_START_S if args.cold_start is None
                          else args.cold_start)))

    run.set_defaults(handler=handler)
