"""Emulated engines (``tinct emulator``) for the tests, the demo and the benchmarks.

:class:`Engines` serves a stable (``v1``) and a candidate (``v2``) emulator from an event loop
of its own, so synchronous code (tests that run the router and the operator as processes,
the demo) can use them and change their behaviour while traffic flows. Each engine answers
with its name as the ``model`` ("Emulated answer from v1."), which tells the sides apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from tinct.emulator import Behaviour, Emulator, serving

#: Answers as fast as the engine's event loop goes (still a stream of four token events): the
#: release tests send hundreds of requests within one step of a few seconds.
QUICK = {"ttft_ms": 0.0, "itl_ms": 0.0, "output_tokens": 4}


class Engines:
    """Two emulated engines on 127.0.0.1, ``v1`` (stable) and ``v2`` (candidate)."""

    def __init__(self, names: tuple[str, str] = ("v1", "v2"), **behaviour: Any) -> None:
        """``names``: the ``model`` each answers with; ``behaviour``: fields of
        :class:`~tinct.emulator.Behaviour` both start with (over :data:`QUICK`)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="engines")
        self.thread.start()
        self._stack = contextlib.AsyncExitStack()
        settings = {**QUICK, **behaviour}
        self.v1: Emulator = self._run(self._serve(Behaviour(model=names[0], **settings)))
        self.v2: Emulator = self._run(self._serve(Behaviour(model=names[1], **settings)))

    async def _serve(self, behaviour: Behaviour) -> Emulator:
        return await self._stack.enter_async_context(serving(behaviour, control=True))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def set(self, engine: Emulator, /, **changes: Any) -> None:
        """Change ``engine``'s behaviour from outside its loop (requests arriving after it)."""

        async def change() -> None:
            engine.set(**changes)

        self._run(change())

    def received(self, engine: Emulator) -> int:
        """Completion requests ``engine`` received so far."""
        return engine.state.received

    def stop(self) -> None:
        self._run(self._stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
