"""Run the router process: event loop (uvloop when installed), signals, graceful shutdown.

SIGTERM/SIGINT: ``/readyz`` turns 503 at once so the Service stops sending new requests, the
listener closes, idle connections and those still sending their request close at once, and
in-flight requests — SSE streams included — get up to ``shutdown_timeout`` seconds (the grace
period) to finish before the upstream connections close. SIGHUP re-reads a table file.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from tinct.router.app import Router
from tinct.router.config import RouterConfig

_log = logging.getLogger(__name__)


async def serve(config: RouterConfig, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set or a termination signal arrives, then drain."""
    router = Router(config)
    st = router.state
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def reload() -> None:
        for r in st.reloaders:
            r()

    loop.add_signal_handler(signal.SIGHUP, reload)
    await router.start()
    _log.info("tinct router listening on %s:%d", config.host, router.port)
    try:
        await stop.wait()
    finally:
        _log.info("shutting down: draining in-flight requests (up to %.0fs)", config.shutdown_timeout)
        await router.stop()
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
