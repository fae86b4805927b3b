"""A real nats-server for tests: the demo's launcher (`scaler.demo.nats_server`), re-exported."""

from __future__ import annotations

from scaler.demo.nats_server import NatsServer, nats_server_binary

__all__ = ["NatsServer", "nats_server_binary"]
