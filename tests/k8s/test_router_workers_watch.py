"""``tinct router --watch --workers 2`` on the real API server: every worker follows the
ConfigMaps, one of them posts the Events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp

from tinct.api.routing import DATA_KEY, routing_configmap
from tinct.router.summing import parse, sample_sum
from tinct.router.watch import EVENT_REASON
from tinct_testing.commands import router_argv
from tinct_testing.controlplane.harness import free_port
from tinct_testing.router_fakes import FakeScheduler, apply_table, table
from tinct_testing.wait import eventually_async

WAIT = 60.0  # upper bound for the watch to deliver; never a measured figure


async def _readyz(metrics: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{metrics}/readyz") as r:
            return r.status, await r.text()
    except aiohttp.ClientConnectionError:
        return 0, ""


async def _all_workers_on(metrics: str, proc: asyncio.subprocess.Process, version: int, log: Path) -> str:
    """Wait until the parent is ready with every worker's table at ``version``."""

    async def on_version() -> str:
        if proc.returncode is not None:
            raise RuntimeError(f"the router exited:\n{log.read_text()}")
        status, text = await _readyz(metrics)
        states = re.findall(r"^worker \d+ pid \d+: (.*)$", text, re.M)
        assert status == 200, text
        assert len(states) == 2, text
        assert all(s.endswith(f"version {version}") for s in states), text
        return text

    text: str = await eventually_async(
        on_version,
        timeout=WAIT,
        interval=0.1,
        what=f"both workers on table version {version}",
        explain=log.read_text,
    )
    return text


async def test_every_worker_follows_the_configmaps_and_events_are_posted_once(
    cluster: Any, namespace: str, backends: tuple[FakeScheduler, FakeScheduler], tmp_path: Path
) -> None:
    v1, v2 = backends
    port, mport = free_port(), free_port()
    metrics = f"http://127.0.0.1:{mport}"
    log = tmp_path / "router.log"
    with log.open("wb") as err:
        argv = router_argv(port, "--watch", "--namespace", namespace, "--kubeconfig", str(cluster.kubeconfig))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *("--metrics-port", str(mport), "--workers", "2", "--allow-backend", "127.0.0.1"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )
    try:
        apply_table(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=1)))
        await _all_workers_on(metrics, proc, 1, log)
        apply_table(
            cluster, namespace, routing_configmap(table(v1.url, v2.url, version=2, default_weight=100))
        )
        await _all_workers_on(metrics, proc, 2, log)

        bad = routing_configmap(table(v1.url, v2.url, version=3))
        doc = json.loads(bad["data"][DATA_KEY])
        doc["cells"].append({"match": {"role": "*"}, "weight": 0})  # a second default cell
        bad["data"][DATA_KEY] = json.dumps(doc)
        apply_table(cluster, namespace, bad)
        # A valid table after it: once both workers have it, both have handled the bad one
        # (each watch handles its events in order, the Event included).
        apply_table(cluster, namespace, routing_configmap(table(v1.url, v2.url, version=4)))
        text = await _all_workers_on(metrics, proc, 4, log)
        async with aiohttp.ClientSession() as http, http.get(f"{metrics}/metrics") as r:
            fams = parse(await r.text())
        assert sample_sum(fams, "tinct_router_table_rejections") == 2, "each worker rejected it"
        out = cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"reason={EVENT_REASON}", "-o", "json"
        ).stdout
        events = [e for e in json.loads(out)["items"] if "exactly one default cell" in e["message"]]
        assert len(events) == 1, f"posted {len(events)} times:\n{text}"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        # The workers die with their parent; make sure of it by their pids (still ours).
        for pid in re.findall(r"worker \d+ started: pid (\d+)", log.read_text()):
            with contextlib.suppress(OSError):
                if f"--worker-of\0{proc.pid}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)
