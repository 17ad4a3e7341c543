"""A real HTTP server that records the webhooks the operator posts, for the notification tests.

Each path is a receiver with its own behaviour: ``/ok/*`` answers 200, ``/flaky/*`` answers
503 to its first ``flaky`` requests and 200 after, ``/gone/*`` answers 410, ``/hang/*`` never
answers (until the server stops) while ``hang`` is true, and answers 200 once it is set false.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tinct_testing.controlplane.harness import free_port


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    #: When it arrived (epoch seconds).
    at: float = field(default_factory=time.time)


@dataclass
class Receiver:
    port: int
    flaky: int = 2
    #: ``/hang/*`` never answers while true.
    hang: bool = True
    received: list[Received] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, prefix: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path.startswith(prefix)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        with self._lock:
            self.attempts[path] = self.attempts.get(path, 0) + 1
            n = self.attempts[path]
        if path.startswith("/hang/") and self.hang:
            await asyncio.sleep(3600)
        if path.startswith("/flaky/") and n <= self.flaky:
            return web.Response(status=503)
        if path.startswith("/gone/"):
            return web.Response(status=410)
        body = json.loads(await request.read())
        with self._lock:
            self.received.append(Received(path, dict(request.headers), body))
        return web.Response(text="ok")


@contextmanager
def receiver(flaky: int = 2) -> Iterator[Receiver]:
    """A :class:`Receiver` on a free loopback port, served from a thread of its own."""
    rec = Receiver(free_port(), flaky)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", rec.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", rec.port).start()
        runner_box.append(runner)
        started.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, name="notify-receiver", daemon=True)
    thread.start()
    if not started.wait(30):
        raise AssertionError("the webhook receiver did not start")
    try:
        yield rec
    finally:

        async def stop() -> None:
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()
            await runner_box[0].cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
