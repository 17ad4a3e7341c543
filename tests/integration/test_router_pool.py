"""The upstream keep-alive pools of a real ``tinct router`` process are bounded: a burst of
concurrent requests (or of mirrors, over the mirrors' own pool) opens as many backend
connections as it needs, but once it is over the router keeps at most
``--upstream-keepalive`` of them idle per backend, and none longer than
``--upstream-idle-timeout``. Connections are counted from the kernel's table (/proc/net/tcp),
as an operator would count them: the router's own sockets to the backend's port, so a
connection another process makes to that port never counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tinct_testing.router_fakes import CHAT, FakeScheduler, PairReceiver, router_process, table_doc
from tinct_testing.wait import eventually_async

WAIT = 30.0  # bound on one wait; never a measured figure


async def _until(what: str, check: Callable[[], bool]) -> None:
    await eventually_async(check, timeout=WAIT, interval=0.05, what=what)


async def _burst(base: str, backend: FakeScheduler, n: int) -> None:
    """``n`` requests held by the backend at once, then all answered."""
    backend.reset("stall")
    backend.release_stall.clear()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one() -> int:
            async with http.post(f"{base}/v1/chat/completions", json=CHAT) as r:
                await r.read()
                return r.status

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await _until(f"{n} requests at the backend", lambda: len(backend.seen) == n)
        backend.release_stall.set()
        assert await asyncio.gather(*tasks) == [200] * n


async def _backend(tmp_path: Path) -> tuple[FakeScheduler, int, str]:
    """A backend, its port, and a table file sending everything to it."""
    backend = await FakeScheduler("v1").start()
    table = tmp_path / "table.json"
    table.write_text(json.dumps(table_doc(backend.url, backend.url.replace("127.0.0.1", "localhost"))))
    return backend, int(backend.url.rsplit(":", 1)[1]), str(table)


async def test_a_burst_leaves_no_more_idle_backend_connections_than_the_cap(tmp_path: Path) -> None:
    backend, port, table = await _backend(tmp_path)
    try:
        # Idle connections kept for an hour: only the cap closes them.
        async with router_process(
            table, "--upstream-keepalive", "3", "--upstream-idle-timeout", "3600"
        ) as router:
            await _burst(router.base, backend, 12)
            # Twelve were open at once; nine are closed as they come back, three stay.
            await _until("the pool keeps three", lambda: router.connections_to(port) == 3)
            # The three are reused: another burst of three opens nothing new.
            await _burst(router.base, backend, 3)
            peers = {s.peer for s in backend.seen}
            assert len(peers) == 3
            assert router.connections_to(port) == 3
    finally:
        await backend.stop()


async def test_idle_backend_connections_close_after_the_idle_timeout(tmp_path: Path) -> None:
    backend, port, table = await _backend(tmp_path)
    try:
        async with router_process(table, "--upstream-idle-timeout", "0.5") as router:
            await _burst(router.base, backend, 4)
            # Four were open at once (the idle timeout may already be closing them).
            assert len({s.peer for s in backend.seen}) == 4
            await _until("idle connections closed", lambda: router.connections_to(port) == 0)
            # A new request after that opens a connection again and is answered.
            await _burst(router.base, backend, 1)
    finally:
        await backend.stop()


async def test_the_mirrors_pool_keeps_no_more_idle_connections_than_the_cap(tmp_path: Path) -> None:
    """Mirrors have a pool of their own, capped like the live one: a burst of mirrors held by
    the candidate at once leaves ``--upstream-keepalive`` connections to it once they end."""
    stable = await FakeScheduler("v1").start()
    candidate = await FakeScheduler("v2").start()
    receiver = await PairReceiver().start()
    table = tmp_path / "table.json"
    shadow = {"noiseShare": 0, "maxConcurrent": 12}
    table.write_text(json.dumps(table_doc(stable.url, candidate.url, default_shadow=100, shadow=shadow)))
    port = int(candidate.url.rsplit(":", 1)[1])
    args = ("--upstream-keepalive", "3", "--upstream-idle-timeout", "3600", "--comparer", receiver.url)
    try:
        async with router_process(str(table), *args) as router:
            candidate.reset("stall")
            candidate.release_stall.clear()
            # Every request is mirrored; stable answers them at once, the candidate holds the mirrors.
            await _burst(router.base, stable, 12)
            await _until("12 mirrors at the candidate", lambda: len(candidate.seen) == 12)
            assert router.connections_to(port) == 12
            candidate.release_stall.set()
            await receiver.wait_for(12)
            await _until("the mirrors' pool keeps three", lambda: router.connections_to(port) == 3)
    finally:
        await receiver.stop()
        await candidate.stop()
        await stable.stop()
