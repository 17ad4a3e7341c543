"""Run the router process: event loop (uvloop when installed), signals, graceful shutdown.

SIGTERM/SIGINT: ``/readyz`` turns 503 at once so the Service stops sending new requests, the
listener closes, and in-flight requests — SSE streams included — get up to
``shutdown_timeout`` seconds to finish before the upstream connections close. SIGHUP re-reads
a table file.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from tinct.router.app import STATE, RouterConfig, make_app

_log = logging.getLogger(__name__)


async def serve(config: RouterConfig, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or a termination signal arrives, then drain."""
    app = make_app(config)
    st = app[STATE]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def reload() -> None:
        for r in st.reloaders:
            r()

    loop.add_signal_handler(signal.SIGHUP, reload)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=config.shutdown_timeout,
        keepalive_timeout=75.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=1024)
    await site.start()
    _log.info("tinct router listening on %s:%d", config.host, config.port)
    try:
        await stop.wait()
    finally:
        st.draining = True
        _log.info("shutting down: draining in-flight requests (up to %.0fs)", config.shutdown_timeout)
        await runner.cleanup()
        _log.info("router stopped")


def run(config: RouterConfig) -> None:
    """Blocking entry point of ``tinct router``."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))


__all__ = ["run", "serve"]
