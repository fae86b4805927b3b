"""A real Prometheus (Debian's binary) on a free loopback port scraping given targets, for tests."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaler.testing import ServerProcess

READY_TIMEOUT_S = 30.0


def prometheus_binary() -> Path | None:
    """The `prometheus` executable (Debian's package puts it in /usr/bin), or None."""
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    fallback = Path("/usr/bin/prometheus")
    return fallback if fallback.is_file() else None


class PrometheusServer(ServerProcess):
    """Prometheus on 127.0.0.1 with a temp config and TSDB, scraping `targets` (host:port).

    scrape_interval_s: 1 s so rate() over 1 m has points within a few seconds.
    """

    name = "prometheus"

    def __init__(
        self,
        *,
        targets: Sequence[str],
        scrape_interval_s: float = 1.0,
        job: str = "exporter",
    ) -> None:
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        super().__init__()
        self.binary = binary
        self.targets = tuple(targets)
        self.scrape_interval_s = scrape_interval_s
        self.job = job

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": list(self.targets)}],
                }
            ],
        }
        return json.dumps(config, indent=2)  # JSON is YAML

    def command(self) -> list[str]:
        config = self.dir / "prometheus.yml"
        config.write_text(self.config_text())
        return [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def wait_ready(self) -> None:
        # Ready = /-/ready answers 200. Bounded: 30 s, 50 ms steps.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.exited():
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"prometheus not ready in {READY_TIMEOUT_S} s: {self.log_tail()}")

    def query(self, promql: str) -> list[Any]:
        """An instant query's result list (raises on HTTP errors)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        result: list[Any] = body["data"]["result"]
        return result

    def wait_for(self, promql: str, *, timeout_s: float = 30.0) -> list[Any]:
        """Poll `promql` until it returns a non-empty result (bounded by timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no result for {promql!r} in {timeout_s} s")
            time.sleep(self.scrape_interval_s / 4)
