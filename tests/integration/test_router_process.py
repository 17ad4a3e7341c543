"""``tinct router`` as a process: table file, SIGHUP reload, SIGTERM drains in-flight streams."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp

from tinct_testing.controlplane.harness import free_port
from tinct_testing.router_fakes import FakeScheduler, router_argv, table_doc
from tinct_testing.wait import eventually_async

WAIT = 60.0  # bound on waiting for the process; never a measured figure


async def _ready_text(
    http: aiohttp.ClientSession, base: str, needle: str, proc: asyncio.subprocess.Process
) -> None:
    async def ready() -> bool:
        if proc.returncode is not None:
            raise RuntimeError(f"the router exited with code {proc.returncode}")
        async with http.get(f"{base}/readyz") as r:
            return r.status == 200 and needle in await r.text()

    await eventually_async(
        ready,
        timeout=WAIT,
        interval=0.1,
        what=f"the router ready with {needle!r}",
        ignoring=(aiohttp.ClientConnectionError,),
    )


async def _stopped_accepting(base: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:

        async def refusing() -> bool:
            try:
                async with fresh.get(f"{base}/readyz") as r:
                    return r.status == 503
            except aiohttp.ClientConnectionError:
                return True

        await eventually_async(
            refusing, timeout=WAIT, interval=0.05, what="the router to stop accepting after SIGTERM"
        )


async def test_router_process_reloads_on_sighup_and_drains_on_sigterm(
    tmp_path: Path, backends: tuple[FakeScheduler, FakeScheduler]
) -> None:
    v1, v2 = backends
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(v1.url, v2.url, version=1)))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(*router_argv(str(f), port, "--log-level", "warning"))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await _ready_text(http, base, "version 1", proc)
            f.write_text(json.dumps(table_doc(v1.url, v2.url, version=2, default_weight=100)))
            proc.send_signal(signal.SIGHUP)
            await _ready_text(http, base, "version 2", proc)

            v2.reset("gated")
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                assert r.headers["X-Scheduler-Active"] == "v2"
                lines = [await r.content.readline()]
                proc.send_signal(signal.SIGTERM)
                await _stopped_accepting(base)  # the stream is still held back by the backend
                assert not v2.stream_done.is_set()
                lines += await v2.ungate(r.content)
            assert b"data: [DONE]\n" in lines
            assert await asyncio.wait_for(proc.wait(), WAIT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
