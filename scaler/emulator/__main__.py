"""`python -m scaler.emulator`: serve the Kubernetes API emulator on loopback.

For trying the service by hand without a cluster: point `kube.host` at the printed URL.
It is test infrastructure, so it is not a `scaler` subcommand.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence

from scaler.emulator import controller, server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scaler.emulator",
        description="Serve the Kubernetes API emulator on 127.0.0.1 until interrupted.")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--controller", action="store_true",
                        help="turn Deployment replicas into pods that become Ready")
    parser.add_argument("--schedule-delay", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--start-delay", type=float, default=30.0, metavar="SECONDS",
                        help="scheduled -> containers running (image pull + model load)")
    parser.add_argument("--ready-delay", type=float, default=10.0, metavar="SECONDS")
    return parser


async def serve(args: argparse.Namespace) -> None:
    # SIGINT and SIGTERM stop it cleanly, also when it was started with SIGINT ignored
    # (as a non-interactive shell starts a background job `&`), which Python's own
    # KeyboardInterrupt would not see.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # As a cluster: the deployment controller writes status after every spec change.
    emulator = server.KubeEmulator(clock=time.time,
                                   options=server.EmulatorOptions(status_writer=True))
    url = await emulator.start(port=args.port)
    waits: set[asyncio.Task[object]] = {asyncio.create_task(stop.wait())}
    try:
        print(f"Kubernetes API emulator on {url} (kubeconfig server: {url})", flush=True)
        if args.controller:
            waits.add(asyncio.create_task(controller.EmulatorController(
                emulator, controller.ControllerSettings(
                    schedule_delay_s=args.schedule_delay, start_delay_s=args.start_delay,
                    ready_delay_s=args.ready_delay)).run()))
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a pod controller that failed says why
    finally:
        for task in waits:
            task.cancel()
        await emulator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
