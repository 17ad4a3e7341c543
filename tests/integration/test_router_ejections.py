"""Ejections count ejections, failures and 426s have counters of their own, and a 426 says Upgrade.

Against real ``tinct router`` processes. A scheduler outage that fails a crowd of requests in
flight takes the candidate out of rotation once: the requests that fail after it was ejected
count as failures (``tinct_router_candidate_failures_total``), not as more ejections. A 426
from a backend that serves another scheduler version (``tinct emulator`` with
``accept_versions``) is counted in ``tinct_router_version_mismatches_total``; the candidate's
falls back to stable, stable's reaches the client with the ``Upgrade`` header RFC 9110
requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest

from tinct.emulator import Behaviour, serving
from tinct_testing.engines import QUICK
from tinct_testing.router_fakes import (
    CHAT,
    FakeScheduler,
    HostileBackend,
    RouterProcess,
    router_process,
    table_doc,
)
from tinct_testing.wait import eventually_async

WAIT = 30.0  # bound on one wait; never a measured figure


class Outage:
    """What a scheduler going down with requests in flight does: hold every request until
    :meth:`cut`, then drop them all unanswered (a :class:`HostileBackend` whose ``requests``
    counts those held)."""

    def __init__(self) -> None:
        self._cut = asyncio.Event()
        self.backend = HostileBackend(self._hold)

    async def _hold(self, writer: asyncio.StreamWriter) -> None:
        await self._cut.wait()  # then the backend closes the connection

    def cut(self) -> None:
        self._cut.set()

    def restore(self) -> None:
        self._cut = asyncio.Event()


async def _metric(http: aiohttp.ClientSession, rp: RouterProcess, pattern: str) -> float:
    async with http.get(f"{rp.base}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if re.match(pattern, line))


async def _until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    await eventually_async(check, timeout=WAIT, interval=0.05, what=what)


async def test_three_outages_with_requests_in_flight_are_three_ejections(
    tmp_path: Path, v1: FakeScheduler
) -> None:
    in_flight = 12
    fallback = {"consecutiveFailures": 3, "latencyMs": 120_000, "cooldownSeconds": 1}
    candidate = Outage()
    await candidate.backend.start()
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(v1.url, candidate.backend.url, default_weight=100, fallback=fallback)))
    try:
        async with router_process(str(f)) as rp, aiohttp.ClientSession() as http:
            ejected = r"tinct_router_candidate_ejected\{"

            async def back_in_rotation() -> bool:
                return await _metric(http, rp, ejected) == 0

            async def ask() -> tuple[int, str | None]:
                async with http.post(f"{rp.base}/v1/chat/completions", json=CHAT) as r:
                    await r.read()
                    return r.status, r.headers.get("X-Fallback-Reason")

            for n in range(1, 4):
                await _until("the candidate is back after its cooldown", back_in_rotation)
                candidate.restore()
                answers = [asyncio.create_task(ask()) for _ in range(in_flight)]

                async def all_held(held: int = n * in_flight) -> bool:
                    return candidate.backend.requests == held

                await _until("every request reached the candidate", all_held)
                candidate.cut()
                # Every request falls back to stable, in the same request.
                assert await asyncio.gather(*answers) == [(200, "upstream_error")] * in_flight
                ejections = await _metric(http, rp, r"tinct_router_candidate_ejections_total\{")
                failures = await _metric(
                    http, rp, r'tinct_router_candidate_failures_total\{.*reason="upstream_error"'
                )
                fallbacks = await _metric(
                    http, rp, r'tinct_router_fallbacks_total\{.*reason="upstream_error"'
                )
                print(
                    f"outage {n}: {ejections:.0f} ejections, {failures:.0f} failures, {fallbacks:.0f} fallbacks"
                )
                assert ejections == n
                assert failures == n * in_flight
                assert fallbacks == n * in_flight
                assert await _metric(http, rp, ejected) == 1
    finally:
        candidate.cut()
        await candidate.backend.stop()
    assert len(v1.seen) == 3 * in_flight


@contextlib.asynccontextmanager
async def v1_only() -> AsyncIterator[str]:
    """An emulated engine that serves scheduler version v1 only: any other gets a 426."""
    async with serving(Behaviour(model="v1", accept_versions=["v1"], **QUICK)) as emu:
        yield emu.url


def _table(tmp_path: Path, stable: str, candidate: str, stable_version: str, weight: float) -> str:
    doc = table_doc(stable, candidate, default_weight=weight)
    doc["stable"]["schedulerVersion"] = stable_version
    f = tmp_path / "table.json"
    f.write_text(json.dumps(doc))
    return str(f)


async def test_426s_are_counted_and_the_one_the_client_gets_says_upgrade(
    tmp_path: Path, v2: FakeScheduler
) -> None:
    async with v1_only() as stable, v1_only() as candidate, aiohttp.ClientSession() as http:
        # The candidate is sent v2, refuses it: the request falls back to stable, sent v1.
        async with router_process(_table(tmp_path, stable, candidate, "v1", 100)) as rp:
            async with http.post(f"{rp.base}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
                assert r.headers["X-Fallback-Reason"] == "version_mismatch"
                assert "Upgrade" not in r.headers
            mismatches = r"tinct_router_version_mismatches_total\{.*side=\"%s\""
            assert await _metric(http, rp, mismatches % "candidate") == 1
            assert await _metric(http, rp, mismatches % "stable") == 0
            assert (
                await _metric(http, rp, r'tinct_router_candidate_failures_total\{.*reason="version_mismatch"')
                == 1
            )
            assert await _metric(http, rp, r"tinct_router_candidate_ejections_total\{") == 0
        # Stable is sent a version it does not serve: its 426 reaches the client, with Upgrade
        # naming what the backend serves, and the connection option RFC 9110 §7.8 asks for.
        async with router_process(_table(tmp_path, stable, v2.url, "v3", 0)) as rp:
            async with http.post(f"{rp.base}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 426
                assert r.headers["Upgrade"] == "tinct-scheduler/v1"
                assert "upgrade" in [t.strip().lower() for t in r.headers.getall("Connection")[0].split(",")]
                assert (await r.json())["error"]["code"] == "version_mismatch"
            assert await _metric(http, rp, mismatches % "stable") == 1
            # The connection stays usable, and an OpenAI client reads the 426 as an error.
            async with http.post(f"{rp.base}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 426
            client = openai.AsyncOpenAI(base_url=f"{rp.base}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            await client.close()
            assert caught.value.status_code == 426
    # A backend whose 426 names no protocol: the router names the scheduler protocol.
    v1 = FakeScheduler("v1", mode="mismatch")
    await v1.start()
    try:
        async with (
            router_process(_table(tmp_path, v1.url, v2.url, "v1", 0)) as rp,
            aiohttp.ClientSession() as http,
            http.get(f"{rp.base}/v1/models") as r,
        ):
            assert r.status == 426
            assert r.headers["Upgrade"] == "tinct-scheduler"
    finally:
        await v1.stop()
