"""Launchers for the real servers tests and demos run against (NATS, Prometheus)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

STOP_TIMEOUT_S = 10.0


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
