"""Real servers for tests (NATS, Prometheus) and the Kubernetes API emulator.

The process launcher itself is production code (the demo embeds a nats-server):
`scaler.demo.nats_server`. This package re-exports it for the tests.
"""

from __future__ import annotations

from scaler.demo.nats_server import ServerProcess, free_port

__all__ = ["ServerProcess", "free_port"]
