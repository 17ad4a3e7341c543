"""`tinct router --resolve`: a router outside the cluster reaches backends the table names by
their Service DNS names, keeping the Host header they were named with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tinct.router.app import parse_resolve
from tinct_testing.router_fakes import FakeScheduler, router_process, table_doc


async def test_backends_named_by_service_are_reached_at_the_resolved_address(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    stable, candidate = "sched-v1.llm.svc.cluster.local:8000", "sched-v2.llm.svc.cluster.local:8000"
    f = tmp_path / "table.json"
    f.write_text(json.dumps(table_doc(f"http://{stable}", f"http://{candidate}", default_weight=100)))
    resolve = [
        f"{stable}={v1.url.removeprefix('http://')}",
        f"{candidate}={v2.url.removeprefix('http://')}",
    ]
    async with (
        router_process(str(f), "--resolve", resolve[0], "--resolve", resolve[1]) as rp,
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{rp.base}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["X-Scheduler-Active"] == "v2"
    assert [s.headers["Host"] for s in v2.seen] == [candidate]


def test_a_malformed_resolve_is_refused_before_anything_starts() -> None:
    assert parse_resolve(["a.b:80=127.0.0.1:9000", "[::1]:81=[::1]:9001"]) == {
        ("a.b", 80): ("127.0.0.1", 9000),
        ("::1", 81): ("::1", 9001),
    }
    for bad in ("a.b=127.0.0.1:1", "a.b:80", "a.b:80=127.0.0.1:99999"):
        with pytest.raises(ValueError, match="give HOST:PORT=ADDRESS:PORT"):
            parse_resolve([bad])
    proc = subprocess.run(
        [sys.executable, "-m", "tinct.cli", "router", "--table", "t.json", "--resolve", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == "tinct router: --resolve 'nonsense': give HOST:PORT=ADDRESS:PORT\n"
