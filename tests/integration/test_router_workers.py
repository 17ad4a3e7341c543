"""``tinct router --workers N``: real worker processes sharing one port, their parent, its metrics port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tinct.router import workers
from tinct.router.summing import Family, MetricsSum, parse, render
from tinct_testing.commands import TINCT
from tinct_testing.controlplane.harness import free_port
from tinct_testing.router_fakes import CHAT, FakeScheduler, router_argv, table_doc
from tinct_testing.wait import eventually_async

WAIT = 60.0  # bound on waiting for processes; never a measured figure


@dataclass
class Fleet:
    proc: asyncio.subprocess.Process
    base: str
    metrics: str
    log: Path
    #: Every worker pid seen, to be sure none is left behind whatever the test did.
    seen: set[int]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _state(pid: int) -> str | None:
    """The process state letter of ``pid``, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if _ppid(int(entry.name)) == pid:
                    out.append(int(entry.name))
    return out


async def _readyz(fleet: Fleet) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"{fleet.metrics}/readyz") as r:
        return r.status, await r.text()


def _worker_pids(readyz: str) -> dict[int, int]:
    return {int(i): int(p) for i, p in re.findall(r"^worker (\d+) pid (\d+):", readyz, re.M)}


async def _until_ready(fleet: Fleet, *, not_pids: set[int] = frozenset()) -> dict[int, int]:  # type: ignore[assignment]
    """Wait until the parent says every worker is ready (none of them ``not_pids``): their pids."""

    async def ready() -> dict[int, int]:
        status, text = await _readyz(fleet)
        pids = _worker_pids(text)
        fleet.seen |= set(pids.values())
        assert status == 200, f"last /readyz: {text}"
        assert not set(pids.values()) & not_pids, f"last /readyz: {text}"
        return pids

    pids: dict[int, int] = await _until(fleet, ready, "every worker ready")
    return pids


async def _until(fleet: Fleet, check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """``check()``'s first truthy value while the router runs (a refused connection: not yet)."""

    async def running_check() -> Any:
        if fleet.proc.returncode is not None:
            raise RuntimeError(f"the router exited:\n{fleet.output()}")
        return await check()

    return await eventually_async(
        running_check,
        timeout=WAIT,
        interval=0.1,
        what=what,
        explain=fleet.output,
        ignoring=(aiohttp.ClientConnectionError,),
    )


async def _scrape(fleet: Fleet) -> dict[str, float]:
    """Summed request count, and per worker, from the parent's /metrics."""
    async with aiohttp.ClientSession() as http, http.get(f"{fleet.metrics}/metrics") as r:
        assert r.status == 200
        fams = parse(await r.text())
    out = {
        "total": sum(v for (n, _), v in fams["tinct_router_requests"].samples.items() if n.endswith("_total"))
    }
    for (_, labels), v in fams["tinct_router_worker_requests"].samples.items():
        out[f"worker {dict(labels)['worker']}"] = v
    out["restarts"] = fams["tinct_router_worker_restarts"].samples[("tinct_router_worker_restarts_total", ())]
    return out


async def _post_fresh(fleet: Fleet, n: int) -> None:
    """``n`` chat requests, each on a new connection (so the kernel picks a worker for each)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for _ in range(n):
            async with http.post(f"{fleet.base}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200, await r.text()
                await r.read()


@contextlib.asynccontextmanager
async def _fleet(tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler, *args: str) -> AsyncIterator[Fleet]:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(table_doc(v1.url, v2.url)))
    port, mport = free_port(), free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as err:
        argv = router_argv(str(table), port, "--metrics-port", str(mport), "--log-level", "info", *args)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )
    fleet = Fleet(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}", log, set())
    try:
        yield fleet
    finally:
        seen = fleet.seen | (set(_children(proc.pid)) if proc.returncode is None else set())
        if proc.returncode is None:  # as a user stops it, so it cleans up after itself
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), WAIT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        mine = f"--worker-of\0{proc.pid}\0".encode()
        for pid in seen:  # never leave one of ours behind, whatever the test saw
            with contextlib.suppress(OSError):  # gone (its pid may be another's by now: check)
                if mine in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


async def test_two_workers_both_serve_and_the_metrics_port_sums_them(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "2") as fleet:
        pids = await _until_ready(fleet)
        assert sorted(pids) == [0, 1], pids
        assert len(set(pids.values())) == 2, pids
        assert all(_ppid(p) == fleet.proc.pid for p in pids.values()), "workers are the parent's children"
        sent = 0
        while sent < 400:
            await _post_fresh(fleet, 10)
            sent += 10
            m = await _scrape(fleet)
            if m["worker 0"] > 0 and m["worker 1"] > 0:
                break
        print(f"after {sent} connections: {m}")
        assert m["worker 0"] > 0, f"one worker served everything: {m}"
        assert m["worker 1"] > 0, f"one worker served everything: {m}"
        assert m["total"] == sent == m["worker 0"] + m["worker 1"]
        assert len(v1.seen) == sent
        # A single router's readiness and metrics are no longer on the proxy port.
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{fleet.base}/metrics") as r:
                assert "tinct_router_requests" not in await r.text()
            # The parent's own 404 carries a request id like every answer the router makes.
            async with http.get(f"{fleet.metrics}/v1/models") as r:
                assert r.status == 404
                assert r.headers["X-Request-Id"]


async def test_sigterm_drains_every_worker_then_the_parent_exits(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "2") as fleet:
        pids = set((await _until_ready(fleet)).values())
        rundir = Path(json.loads(_argv(min(pids))[-1])["metrics_socket"]).parent
        v1.reset("gated")
        body = {**CHAT, "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{fleet.base}/v1/chat/completions", json=body) as r:
                lines = [await r.content.readline()]
                fleet.proc.send_signal(signal.SIGTERM)

                async def draining() -> bool:
                    answer = await _readyz(fleet)
                    assert answer == (503, "draining\n"), answer
                    return True

                await eventually_async(
                    draining, timeout=WAIT, interval=0.05, what="the parent saying draining"
                )
                assert not v1.stream_done.is_set()
                lines += await v1.ungate(r.content)
            assert b"data: [DONE]\n" in lines, lines
            assert await asyncio.wait_for(fleet.proc.wait(), WAIT) == 0, fleet.output()
        assert [p for p in pids if _state(p) not in (None, "Z")] == []
        assert "router stopped" in fleet.output()
        assert not rundir.exists(), "the workers' socket directory is removed"


async def test_parent_killed_leaves_no_worker(tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "2") as fleet:
        pids = set((await _until_ready(fleet)).values())
        config = json.loads(_argv(min(pids))[-1])
        rundir = Path(config["metrics_socket"]).parent
        assert rundir.is_dir()
        fleet.proc.kill()
        await fleet.proc.wait()
        await eventually_async(
            lambda: [p for p in pids if _state(p) not in (None, "Z")] == [],
            timeout=WAIT,
            interval=0.05,
            what="no worker outliving its parent",
        )
        shutil.rmtree(rundir)  # a parent killed outright cannot remove its sockets' directory


async def test_a_killed_worker_is_restarted_and_its_counts_stay_in_the_sums(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "2") as fleet:
        pids = await _until_ready(fleet)
        sent = 0
        while sent < 400:
            await _post_fresh(fleet, 10)
            sent += 10
            before = await _scrape(fleet)
            if before["worker 0"] > 0:
                break
        assert before["worker 0"] > 0
        assert before["restarts"] == 0
        os.kill(pids[0], signal.SIGKILL)
        after_pids = await _until_ready(fleet, not_pids={pids[0]})
        assert after_pids[1] == pids[1]
        assert after_pids[0] != pids[0]
        assert _ppid(after_pids[0]) == fleet.proc.pid
        after = await _scrape(fleet)
        print(f"before the kill: {before}; after the restart: {after}")
        assert after["restarts"] == 1
        assert after["worker 0"] == 0, "the new worker starts from zero"
        assert after["total"] == before["total"] == sent, "the dead worker's requests stay counted"
        await _post_fresh(fleet, 10)
        assert (await _scrape(fleet))["total"] == sent + 10
        assert f"worker 0 (pid {pids[0]}) exited with -9; restarting" in fleet.output()


async def test_one_worker_is_the_single_process_router(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "1") as fleet:

        async def ready() -> str | None:
            status, text = await _readyz(fleet)
            return text if status == 200 else None

        text = await _until(fleet, ready, "the router ready")
        assert text == "ready: chat table version 1\n"  # the router's own answer, no parent's
        assert _children(fleet.proc.pid) == []
        await _post_fresh(fleet, 3)
        async with aiohttp.ClientSession() as http, http.get(f"{fleet.metrics}/metrics") as r:
            fams = parse(await r.text())
        assert "tinct_router_worker_requests" not in fams
        assert sum(fams["tinct_router_requests"].samples.values()) == 3


async def test_workers_without_a_metrics_port_are_refused(tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    table.write_text(json.dumps(table_doc("http://127.0.0.1:1", "http://127.0.0.1:2")))
    argv = [*TINCT, "router", "--table", str(table), "--workers", "2"]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"--workers above 1 needs --metrics-port" in err


def test_cpu_limit_reads_the_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert 1 <= workers.cpu_limit() <= len(os.sched_getaffinity(0))
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (tmp_path / "kubepods" / "cpu.max").write_text("max 100000\n")
    (pod / "cpu.max").write_text("150000 100000\n")  # a CPU limit of 1500m
    monkeypatch.setattr(workers, "_CGROUP", tmp_path)
    assert workers._cgroup_v2_quota("0::/kubepods/pod1\n") == 1.5
    (tmp_path / "kubepods" / "cpu.max").write_text("50000 100000\n")  # a parent's limit is tighter
    assert workers._cgroup_v2_quota("0::/kubepods/pod1\n") == 0.5
    assert workers._cgroup_v2_quota("0::/\n") is None


def test_sums_add_counters_take_the_largest_gauge_and_keep_dead_workers_counts() -> None:
    a = parse(
        '# TYPE r_total counter\nr_total{side="stable"} 3\n# TYPE v gauge\nv{release="chat"} 7\n'
        '# TYPE h histogram\nh_bucket{le="1.0"} 2\nh_bucket{le="+Inf"} 2\nh_sum 0.5\nh_count 2\n'
    )
    b = parse('# TYPE r_total counter\nr_total{side="stable"} 4\n# TYPE v gauge\nv{release="chat"} 6\n')
    sums = MetricsSum()
    total = sums.total([a, b])
    assert total["r"].samples[("r_total", (("side", "stable"),))] == 7
    assert total["v"].samples[("v", (("release", "chat"),))] == 7
    assert total["h"].samples[("h_count", ())] == 2
    sums.retire(a)
    after = sums.total([b])
    assert after["r"].samples[("r_total", (("side", "stable"),))] == 7
    assert after["v"].samples[("v", (("release", "chat"),))] == 6, "a dead worker's gauges leave"
    text = render(after.values()).decode()
    assert 'r_total{side="stable"} 7.0' in text
    assert 'h_bucket{le="+Inf"} 2.0' in text


async def _table_version(fleet: Fleet) -> float | None:
    async with aiohttp.ClientSession() as http, http.get(f"{fleet.metrics}/metrics") as r:
        fams = parse(await r.text())
    fam = fams.get("tinct_router_table_version")
    if fam is None:
        return None
    key = ("tinct_router_table_version", (("namespace", "llm"), ("release", "chat")))
    return fam.samples.get(key)


async def test_the_table_version_is_the_lowest_of_the_workers_so_a_lagging_one_shows(
    tmp_path: Path, v1: FakeScheduler, v2: FakeScheduler
) -> None:
    async with _fleet(tmp_path, v1, v2, "--workers", "2") as fleet:
        pids = await _until_ready(fleet)
        assert await _table_version(fleet) == 1
        sock0 = Path(json.loads(_argv(pids[0])[-1])["metrics_socket"])
        # Worker 1 is frozen: it cannot see the new table, and the parent has its last reading.
        os.kill(pids[1], signal.SIGSTOP)
        try:
            (tmp_path / "table.json").write_text(json.dumps(table_doc(v1.url, v2.url, version=2)))

            async def worker0_on_2() -> bool:
                return b"version 2" in (await workers._get(sock0, "/readyz", WAIT))[1]

            await eventually_async(
                worker0_on_2, timeout=WAIT, interval=0.1, what="worker 0 on table version 2"
            )
            lagging = await _table_version(fleet)
        finally:
            os.kill(pids[1], signal.SIGCONT)
        print(f"worker 0 on version 2, worker 1 frozen on 1: the parent says {lagging}")
        assert lagging == 1, "a worker still on version 1 must keep the router's version at 1"

        async def on_2() -> bool:
            version = await _table_version(fleet)
            assert version == 2, f"stuck at {version}"
            return True

        await eventually_async(on_2, timeout=WAIT, interval=0.1, what="the router's table version 2")


def test_sums_take_the_lowest_table_version_and_only_where_every_worker_has_one() -> None:
    def worker(**versions: int) -> dict[str, Family]:
        lines = "".join(
            f'tinct_router_table_version{{namespace="llm",release="{r}"}} {v}\n'
            f'tinct_router_candidate_ejected{{namespace="llm",release="{r}"}} {v % 2}\n'
            for r, v in versions.items()
        )
        return parse(
            f"# TYPE tinct_router_table_version gauge\n# TYPE tinct_router_candidate_ejected gauge\n{lines}"
        )

    def version(total: dict[str, Family], release: str) -> float | None:
        key = ("tinct_router_table_version", (("namespace", "llm"), ("release", release)))
        return total["tinct_router_table_version"].samples.get(key)

    sums = MetricsSum()
    total = sums.total([worker(chat=7, code=3), worker(chat=6)])
    assert version(total, "chat") == 6, "the lagging worker's version"
    assert version(total, "code") is None, "not every worker serves a table of it yet"
    ejected = total["tinct_router_candidate_ejected"].samples
    assert ejected[("tinct_router_candidate_ejected", (("namespace", "llm"), ("release", "chat")))] == 1
    # A running worker not read yet serves no table the parent knows of.
    assert version(sums.total([worker(chat=7), {}]), "chat") is None
    assert version(sums.total([worker(chat=7), worker(chat=7)]), "chat") == 7
