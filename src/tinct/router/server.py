"""The router's HTTP/1.1 server: listens, tracks connections, closes idle ones, drains on shutdown.

Each accepted connection is a :class:`~tinct.router.connection.ServerConnection`, which
parses requests, runs the handler and writes the answers. The server closes connections
idle for ``keepalive_timeout`` and those whose request head takes longer than
``head_timeout``; :meth:`HttpServer.shutdown` stops listening, closes idle connections and
those still sending their request, and gives answers in progress a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os

from tinct.router.connection import Handler, ServerConnection

_log = logging.getLogger(__name__)


class HttpServer:
    """Listens, tracks connections, closes idle ones, and drains on shutdown."""

    def __init__(
        self,
        handler: Handler,
        *,
        keepalive_timeout: float = 75.0,
        head_timeout: float = 10.0,
        body_timeout: float | None = 30.0,
    ) -> None:
        self.handler = handler
        self.keepalive_timeout = keepalive_timeout
        #: Seconds a request head may take to arrive whole.
        self.head_timeout = head_timeout
        #: Seconds a classified body may take in all; a streamed one may pause between pieces.
        self.body_timeout = body_timeout
        self.loop = asyncio.get_running_loop()
        self.connections: set[ServerConnection] = set()
        self.draining = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()

    async def start(self, host: str, port: int, backlog: int = 1024, *, reuse_port: bool = False) -> None:
        """Listen on ``host:port``; with ``reuse_port`` beside the other workers of a router."""
        self._server = await self.loop.create_server(
            lambda: ServerConnection(self),
            host,
            port,
            backlog=backlog,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )
        self._sweeper = self.loop.create_task(self._sweep(), name="tinct-router-keepalive-sweep")

    async def start_unix(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (created owner-only)."""
        self._server = await self.loop.create_unix_server(lambda: ServerConnection(self), path)
        os.chmod(path, 0o600)
        self._sweeper = self.loop.create_task(self._sweep(), name="tinct-router-keepalive-sweep")

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def forget(self, conn: ServerConnection) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._empty.set()

    async def _sweep(self) -> None:
        every = min(5.0, self.keepalive_timeout / 2, self.head_timeout / 2)
        while True:
            await asyncio.sleep(every)
            now = self.loop.time()
            deadline = now - self.keepalive_timeout
            head_deadline = now - self.head_timeout
            for c in [
                c
                for c in self.connections
                if c.idle and (c.last_active < deadline or c.head_overdue(head_deadline))
            ]:
                c.close()

    async def shutdown(self, timeout: float) -> None:
        """Stop listening, let answers in progress finish within ``timeout``, then close all."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for c in list(self.connections):
            c.shut_down()
        if self.connections:
            self._empty.clear()
            try:
                await asyncio.wait_for(self._empty.wait(), timeout)
            except TimeoutError:
                _log.warning(
                    "%d connections still busy after %.0fs; closing them", len(self.connections), timeout
                )
        for c in list(self.connections):
            c.cancel()
        await asyncio.sleep(0)


__all__ = ["HttpServer"]
