"""Write flow control of a connection: waiting while its transport's buffer is full.

asyncio calls a protocol's ``pause_writing()`` when the transport's write buffer passes its
high-water mark and ``resume_writing()`` when it has drained; the router's client
connections (:mod:`tinct.router.connection`) and backend connections
(:mod:`tinct.router.upstream`) each keep a :class:`WriteFlow` for it, so a body's writer
can wait with :meth:`WriteFlow.drain` instead of piling bytes up in memory.
"""

from __future__ import annotations

import asyncio

__all__ = ["WriteFlow"]


class WriteFlow:
    """Whether writing is paused, and the waiter :meth:`drain` gives while it is."""

    __slots__ = ("_loop", "_waiter", "paused")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.wake()

    def wake(self) -> None:
        """Let a waiting :meth:`drain` return (the buffer drained, or the connection is gone)."""
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    async def drain(self) -> None:
        """Wait while writing is paused."""
        if self.paused:
            if self._waiter is None:
                self._waiter = self._loop.create_future()
            await self._waiter
