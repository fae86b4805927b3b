"""Starting and stopping aiohttp apps on a host and port, optionally over TLS."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class RunningServer:
    """An app being served; `port` is the bound port (useful when 0 was asked for)."""

    runner: web.AppRunner
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> RunningServer:
    """Serve `app` until `close()`; port 0 binds a free port."""
    # No access log: /metrics is scraped every few seconds and the HPA polls every 15 s;
    # one line each is noise next to the decision log.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host=host, port=port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound = int(address[1])
            break
    return RunningServer(runner=runner, host=host, port=bound, tls=ssl_context is not None)


def new_app() -> web.Application:
    """An empty app, for an endpoint served on a port of its own (HTTP push)."""
    return web.Application()
