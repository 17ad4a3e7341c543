"""The emulated engine's state: its batch slots, its waiting queue, its KV cache, its counts.

A request takes a slot to be generated; while all :attr:`Behaviour.slots` are taken it waits
in the queue (first come, first served) and counts as waiting, so the queue depth and the
KV-cache usage move with the load as an engine's do. The KV cache holds the prompt and the
tokens generated so far of every running request, as a share of ``kv_capacity_tokens``
(capped at 1). Nothing here computes a token: the times come from the behaviour.

Every figure the engines export is kept as a plain number or a histogram
(:class:`~tinct.histogram.Histogram`) here and turned into metric families only when
scraped (:mod:`tinct.emulator.metrics`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from tinct.emulator.behaviour import Behaviour
from tinct.emulator.names import BUCKETS
from tinct.histogram import Histogram

__all__ = ["Adapter", "EngineState", "Slot"]


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the engine holds: its served name, where it was loaded from, its rank."""

    name: str
    path: str
    rank: int
    base_model: str | None = None
    loaded_at: int = 0


def _count(counts: dict[str, int], name: str | None, delta: int) -> None:
    if name is None:
        return
    n = counts.get(name, 0) + delta
    if n:
        counts[name] = n
    else:
        counts.pop(name, None)


@dataclass
class Slot:
    """One running request's hold on the engine: the tokens it keeps in the KV cache."""

    state: EngineState
    prompt_tokens: int
    generated: int = 0

    def token(self) -> None:
        """One more output token, held in the KV cache until the request ends."""
        self.generated += 1
        self.state.kv_tokens += 1
        self.state.generation_tokens += 1


@dataclass
class EngineState:
    """Slots, queue and counters of one emulated engine."""

    behaviour: Behaviour
    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    requests: int = 0
    #: Requests received on the completion endpoints, whatever became of them.
    received: int = 0
    #: finished_reason -> requests
    finished: dict[str, int] = field(default_factory=dict)
    #: LoRA adapters loaded at run time, by served name (:mod:`tinct.emulator.lora`)
    adapters: dict[str, Adapter] = field(default_factory=dict)
    #: adapter name -> requests waiting for a slot / being generated / answered
    adapter_waiting: dict[str, int] = field(default_factory=dict)
    adapter_running: dict[str, int] = field(default_factory=dict)
    adapter_requests: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    _queue: deque[asyncio.Future[None]] = field(default_factory=deque)
    _hit_carry: float = 0.0

    def __post_init__(self) -> None:
        self.histograms = {role: Histogram(b) for role, b in BUCKETS.items()}

    @property
    def kv_usage(self) -> float:
        """Share of the KV cache in use, 0 to 1."""
        return min(1.0, self.kv_tokens / self.behaviour.kv_capacity_tokens)

    @property
    def cache_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def observe(self, role: str, value: float) -> None:
        self.histograms[role].observe(value)

    def resized(self) -> None:
        """The slots changed: let waiting requests in while slots are free."""
        while self._queue and self.running < self.behaviour.slots:
            fut = self._queue.popleft()
            if not fut.done():
                self.running += 1
                fut.set_result(None)

    @asynccontextmanager
    async def slot(self, prompt_tokens: int, adapter: str | None = None) -> AsyncIterator[Slot]:
        """Hold a slot (after waiting for one) for a request of ``prompt_tokens`` (to the LoRA
        ``adapter``, if any); its KV cache is freed and the slot given to the next waiting
        request on exit, however the request ends (a client gone mid-answer included)."""
        arrived = time.monotonic()
        if self.running < self.behaviour.slots and not self._queue:
            self.running += 1
        else:
            fut = asyncio.get_running_loop().create_future()
            self._queue.append(fut)
            self.waiting += 1
            _count(self.adapter_waiting, adapter, 1)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self.running -= 1  # the slot was handed over just as the request went
                    self.resized()
                raise
            finally:
                self.waiting -= 1
                _count(self.adapter_waiting, adapter, -1)
                if fut in self._queue:
                    self._queue.remove(fut)
        self.observe("queue_time", time.monotonic() - arrived)
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.prefix_queries += prompt_tokens
        # Exactly prefix_hit_rate of the prompt tokens over time, whole tokens per request.
        self._hit_carry += prompt_tokens * self.behaviour.prefix_hit_rate
        hits = min(prompt_tokens, int(self._hit_carry))
        self._hit_carry -= hits
        self.prefix_hits += hits
        self.observe("input_tokens", prompt_tokens)
        held = Slot(self, prompt_tokens)
        self.kv_tokens += prompt_tokens
        _count(self.adapter_running, adapter, 1)
        _count(self.adapter_requests, adapter, 1)
        try:
            yield held
        finally:
            self.kv_tokens -= prompt_tokens + held.generated
            self.running -= 1
            _count(self.adapter_running, adapter, -1)
            self.resized()

    def finish(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1
