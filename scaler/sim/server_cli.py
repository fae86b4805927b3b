"""The `scaler sim-server` subcommand: an OpenAI-compatible server timed by a replica profile."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from scaler.sim import profiles, server


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add `sim-server`; its handler returns an exit code."""
    parser = subparsers.add_parser(
        "sim-server",
        help="an OpenAI-compatible model server simulated from a replica profile (no GPU)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
        "vLLM-style /metrics, timed by a replica profile's continuous batching in real time.",
    )
    parser.add_argument("--profile", default="llama-3.1-8b-h100",
                        help=f"bundled profile ({', '.join(profiles.available())}) or a "
                        "profile YAML (default llama-3.1-8b-h100)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default "
                        "127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000, vLLM's; "
                        "0 picks a free one)")
    parser.add_argument("--served-model-name", metavar="NAME",
                        help="the model name clients send (default: the profile's name)")
    parser.add_argument("--speed", type=float, default=1.0, metavar="X",
                        help="run the model X times faster than real time (default 1)")
    parser.add_argument("--output-tokens", choices=("sample", "max"), default="sample",
                        help="'max': every output is max_tokens long; 'sample' (default): "
                        "geometric lengths of mean --output-mean, capped at max_tokens; a "
                        "request with ignore_eos always gets max_tokens")
    parser.add_argument("--output-mean", type=float, default=200.0, metavar="TOKENS",
                        help="mean output length of 'sample' (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampled lengths")
    parser.add_argument("--nats", metavar="URL",
                        help="publish signal messages (DESIGN 4.2) to this NATS server")
    parser.add_argument("--model-key", metavar="NAMESPACE/NAME",
                        help="the model the messages are about (needed with --nats)")
    parser.add_argument("--source", help="the messages' source (default sim-server-<port>)")
    parser.set_defaults(handler=sim_server_command)


def sim_server_command(args: argparse.Namespace) -> int:
    try:
        profile = profiles.load_profile(args.profile)
        lengths = server.Lengths(policy=args.output_tokens, mean_tokens=args.output_mean)
        if (args.nats is None) != (args.model_key is None):
            raise ValueError("--nats and --model-key go together")
        if args.model_key is not None:
            server.split_model_key(args.model_key)
        if not args.speed > 0:
            raise ValueError(f"--speed must be > 0, not {args.speed}")
    except ValueError as exc:  # ProfileError is a ValueError
        print(f"scaler sim-server: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or profile.name

    async def serve() -> None:
        app = server.Server(server.Replica(profile, speed=args.speed), served_model=name,
                            lengths=lengths, seed=args.seed)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with server.running(app, host=args.host, port=args.port, nats_url=args.nats,
                                  model_key=args.model_key, source=args.source) as url:
            print(f"sim-server: model {name!r} ({profile.name}, speed x{args.speed:g}) on "
                  f"{url}/v1", flush=True)
            await stop.wait()

    asyncio.run(serve())
    return 0
