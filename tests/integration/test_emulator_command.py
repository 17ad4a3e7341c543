"""`tinct emulator` as a command, in a process of its own: it serves what its environment says,
its help says it emulates, and a bad flag is a usage error."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import aiohttp

from tinct_testing.controlplane.harness import free_port
from tinct_testing.wait import eventually_async


def test_the_command_serves_and_its_help_says_it_emulates() -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "emulator", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "no model runs" in helped
    assert "--ttft-ms" in helped
    assert "TINCT_EMULATOR_TTFT_MS" in helped
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinct.cli", "emulator", "--host", "127.0.0.1", "--port", str(port),
         "--engine", "tgi", "--log-level", "warning"],
        env={**__import__("os").environ, "TINCT_EMULATOR_MODEL": "from-env"},
    )  # fmt: skip
    try:

        async def check() -> None:
            async with aiohttp.ClientSession() as http:

                async def models() -> dict[str, Any]:
                    async with http.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        doc: dict[str, Any] = await r.json()
                        return doc

                doc = await eventually_async(
                    models,
                    timeout=60,
                    interval=0.1,
                    what="the emulator started",
                    ignoring=(aiohttp.ClientConnectionError,),
                )
                assert doc["data"][0]["id"] == "from-env"
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert "tgi_queue_size" in await r.text()

        asyncio.run(check())
        bad = subprocess.run(
            [sys.executable, "-m", "tinct.cli", "emulator", "--slots", "0"], capture_output=True, text=True
        )
        assert bad.returncode == 2
        assert "slots" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        proc.terminate()
        proc.wait(10)
