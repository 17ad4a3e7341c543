"""Benchmark of the dye router against nginx and against no router, side by side on this machine.

Cases (``--cases``, all by default), each comparison in alternating rounds (``--rounds``) so a
change in the machine's load falls on every side alike; latency percentiles are reported side
by side per run, never subtracted across runs:

- ``hop``: wrk (one thread, ``--connections`` 8) posts chat requests to a fixed-answer nginx
  backend directly, through nginx as a reverse proxy (1 worker, upstream keep-alive) and
  through ``tinct router`` (1 process, table from a file): a trivial request (64 characters,
  every cell at weight 0: the router only parses and forwards) and a realistic one (several
  messages, ~3,000 tokens, every cell at weight 50, a new ``X-Session-Id`` per request, so
  classification of a real prompt, the sticky hash and the candidate choice all run; the
  candidate is the same nginx under another host name). The trivial request also goes
  through a relay in this script (``relay``: uvloop and httptools, a task and a future per
  request, nothing else: the least a Python proxy does) and through ``lean`` (the router's
  necessary work on that request written flat, with no task, future or error path: how fast
  its request path could be in Python), and the CPU each serving process spends per
  request, in user space and in the kernel, is read from ``/proc``.
- ``long``: a ~220 KB chat request (a system prompt, four turns, a long user turn) at 20 and
  150 connections, directly, through nginx, through the router (1 process, weight 50:
  classification and the sticky hash run) and through the router as the chart runs it on
  two CPUs (``--workers 2``). ``long_prompt_rps_ratio`` is router / direct at 150
  connections, ``long_prompt_added_p50_ms`` / ``_p99_ms`` the added latency there; the
  ``_workers`` keys the same for ``--workers 2``, ``_20`` at 20 connections.
  ``long_prompt_rps_ratio_lean`` is the same ratio for ``lean`` (one process; see ``hop``):
  what the router's necessary work on a long prompt allows in Python.
- ``tables``: a router with 100 routing tables (one model each) against one with a single
  table, the request naming one of the models: picking the table by model costs nothing that
  grows with the number of releases.
- ``workers``: a router with two worker processes (``--workers 2``, SO_REUSEPORT) against one
  with ``--workers 1``, both with a metrics port, ``--worker-connections`` connections:
  ``workers_speedup`` is the ratio. On a two-core machine the load generator and the backend
  share the cores with the workers, so it stays well under 2.
- ``sse``: in process, the time to classify a 4k-token chat request; through the router, the
  time from sending a streaming request to an emulated engine (``tinct emulator``) to reading
  its first SSE chunk (and the same straight to the engine); and the median delay of an SSE
  chunk (a chat chunk carrying one token) from the backend's write to the client's read,
  through a router measuring tokens and, in alternating rounds (36 of 40 chunks over six
  sessions), through one started with ``--no-token-metrics``: ``token_metrics_added_us`` is
  the mean over sessions of the median over rounds of the difference of the two routers'
  medians; ``token_metrics_added_us_paired`` the same added delay through one router, whose
  chunks of a chat stream (metered) and of the same stream passed through unclassified (not
  metered) take turns, the median of the pairs' differences; ``token_metrics_paired_reference_us``
  the same pairs through a router started with ``--no-token-metrics`` (what the two paths
  differ by without the meter) and ``token_metrics_added_us_paired_net`` the difference of the
  two, the meter's own share; ``token_meter_us_per_chunk``
  the time the token meter takes to read a chunk, in process.
- ``streams``: ``--streams`` (10,000) concurrent streaming chat requests through one router
  started with ``--workers 2`` to an emulated engine sending one token a second for
  ``--stream-seconds`` (20) s, then the same straight to the engine. Engine and load generator
  are this script in processes of their own (uvloop, bare protocols: as light as they can
  be), every process with its descriptor limit raised to the hard limit (each stream takes two
  descriptors in the router). ``router_kb_per_stream`` is the workers' RSS growth at the
  plateau divided by the streams, ``stream_chunk_added_p99_ms`` the p99 of a chunk's delay
  from the engine's write to the client's read through the router minus the same straight to
  the engine, ``router_fds_after`` the workers' open descriptors once every stream ended
  (``router_fds_cap``: their descriptors before the streams plus the idle upstream
  connections the workers may keep, ``--upstream-keepalive`` per backend each, and the table
  names two backends). Chunk delays count once every stream is open (the plateau);
  ``stream_chunk_ramp_p99_ms`` is the p99 of those relayed while the streams were opening.

``--against REF`` builds REF (a commit, branch or tag) in a temporary worktree with a venv of
its own, and runs its router and this checkout's through the hop (plain request), long-prompt,
workers, SSE and streams cases (those given with ``--cases``) in alternating rounds, printing
each key for both and their ratio (head / ref).

``--cases shadow``: the plain router alternates (``--rounds``, medians) with the same request
through a router that mirrors a 10 % shadow share of every cell (``noiseShare`` 10, budgets
opened wide so that the share, not a budget, decides) to the candidate, sending the pairs to a
receiver in this process that stands in for ``tinct comparer``; there wrk gives each request a
new ``X-Session-Id`` so that the share is drawn per request (a cost the plain run does not
pay): ``shadow_live_*`` is what clients saw, ``shadow_router_*`` the plain router beside it,
``shadow_pairs`` the pairs received over its rounds (warm-ups included), ``shadow_mirrors``
what the router mirrored.

Everything listens on 127.0.0.1; runs are a few seconds each; every process started here is
stopped at the end. wrk and nginx come from Debian and are installed with apt-get if
missing. The last line printed is the JSON summary.

Usage: python bench/router.py [--duration SECONDS] [--cases hop,long,...] [--against REF]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tinct.router.classify import CHAT_PATH
from tinct.router.config import RouterConfig
from tinct_testing.controlplane.harness import free_port
from tinct_testing.controlplane.process import http_ok, wait_ready
from tinct_testing.measure import children, cpu_times, status_mb
from tinct_testing.router_fakes import PairReceiver, table_doc  # the tests' routing table and pair receiver

#: Size of the long-prompt case's request body.
LONG_PROMPT_BYTES = 220_000
#: Idle upstream connections a router worker keeps per backend by default.
UPSTREAM_KEEPALIVE = RouterConfig().upstream_keepalive

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
)
REQUEST = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "Say ok. " * 8}]})


_PROSE = (
    "The scheduler batches requests by prompt length and keeps the KV cache warm for "
    "sessions that come back; when memory runs short it evicts the coldest session first. "
)


def _conversation(system: str, pairs: int, user: int, assistant: int, question: str) -> list[dict[str, str]]:
    """A system turn, then ``pairs`` user and assistant turns of ``user`` and ``assistant``
    paragraphs (the user's ending in ``question``, formatted with the turn's number ``i``)."""
    turns = [{"role": "system", "content": system}]
    for i in range(pairs):
        turns.append({"role": "user", "content": _PROSE * user + question.format(i=i)})
        turns.append({"role": "assistant", "content": _PROSE * assistant})
    return turns


def realistic_request() -> str:
    """A multi-turn chat request of about 3,000 tokens (at 4 characters per token)."""
    system = "You are a concise assistant for an ML platform team. " * 6
    turns = _conversation(system, 6, 8, 4, "Question {i}: what changes at step {i}?")
    turns.append({"role": "user", "content": "Summarise the discussion in three bullet points."})
    return json.dumps({"model": "bench", "messages": turns, "temperature": 0.2, "max_tokens": 256})


def _ensure_tools() -> None:
    missing = [p for p, b in (("wrk", "wrk"), ("nginx", "nginx")) if shutil.which(b) is None]
    if not missing:
        return
    print(f"installing {' '.join(missing)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True

    wait_ready(
        f"{what} listening on {port}",
        listening,
        proc,
        time.monotonic() + timeout,
        interval=0.05,
        ignoring=(OSError,),
    )


def _nginx_conf(tmp: Path, name: str, server: str) -> Path:
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / f"{name}.conf"
    conf.write_text(
        f"""{user}worker_processes 1;
daemon off;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}.error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/{name}-body;
  proxy_temp_path {tmp}/{name}-proxy;
  fastcgi_temp_path {tmp}/{name}-fastcgi;
  uwsgi_temp_path {tmp}/{name}-uwsgi;
  scgi_temp_path {tmp}/{name}-scgi;
  keepalive_requests 1000000;
{server}
}}
"""
    )
    return conf


def _start_nginx(tmp: Path, name: str, server: str, port: int, procs: list[subprocess.Popen[bytes]]) -> None:
    conf = _nginx_conf(tmp, name, server)
    p = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(tmp)], stderr=subprocess.DEVNULL)
    procs.append(p)
    _wait_port(port, p, f"nginx {name}")


_LAT = re.compile(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _lua(body: str, sessions: bool) -> str:
    """A wrk script posting ``body``; with ``sessions`` a new X-Session-Id on every request."""
    text = (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    if not sessions:
        return text + 'wrk.headers["X-Session-Id"] = "bench"\n'
    return text + (
        "local n = 0\n"
        "request = function()\n"
        "  n = n + 1\n"
        '  wrk.headers["X-Session-Id"] = "s-" .. n\n'
        "  return wrk.format()\n"
        "end\n"
    )


def _warm(url: str, script: Path, connections: int) -> None:
    """A second of load: fills keep-alive pools and settles the caches (JITs nothing)."""
    subprocess.run(
        ["wrk", "-t1", f"-c{connections}", "-d1s", "-s", str(script), url],
        check=True,
        capture_output=True,
    )


def _wrk(url: str, script: Path, duration: float, connections: int, *, warm: bool = True) -> dict[str, float]:
    if warm:
        _warm(url, script, connections)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = {m.group(1): _ms(m.group(2), m.group(3)) for m in _LAT.finditer(out)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} non-2xx responses\n{out}")
    return {"rps": rps, "p50": lat["50"], "p99": lat["99"]}


def _table(stable: str, candidate: str, weight: float = 0) -> dict[str, Any]:
    """The tests' routing table (one specific cell, one default cell), every cell at ``weight``."""
    cell = {"match": {"promptLength": "long", "role": "admin", "latency": "high"}, "weight": weight}
    return table_doc(stable, candidate, release="bench", cells=[cell], default_weight=weight)


def _shadow_table(stable: str, candidate: str, share: float = 10) -> dict[str, Any]:
    """:func:`_table` at weight 0 with every cell mirroring ``share`` percent; budgets wide open."""
    doc = _table(stable, candidate, 0)
    for cell in doc["cells"]:
        cell["shadow"] = share
    doc["shadow"] = {
        "stableModelVersion": "bench-1",
        "candidateModelVersion": "bench-2",
        "maxConcurrent": 256,
        "maxTokensPerMinute": 1_000_000_000,
    }
    return doc


class _Receiver:
    """The tests' :class:`PairReceiver` on an event loop of its own, in a thread."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="pairs")
        self.thread.start()
        self.rx = asyncio.run_coroutine_threadsafe(PairReceiver(keep=False).start(), self.loop).result(10)

    @property
    def received(self) -> int:
        return self.rx.received

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.rx.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()  # not left to the garbage collector at exit, which fails noisily


def _counter(port: int, name: str) -> float:
    """The sum of a counter's samples in the router's /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _start_router(
    tmp: Path,
    tables: dict[str, Any] | list[dict[str, Any]],
    port: int,
    procs: list[subprocess.Popen[bytes]],
    *extra: str,
    python: str = sys.executable,
) -> None:
    argv = [python, "-m", "tinct.cli", "router", "--host", "127.0.0.1"]
    for i, table in enumerate(tables if isinstance(tables, list) else [tables]):
        f = tmp / f"table-{port}-{i}.json"
        f.write_text(json.dumps(table))
        argv += ["--table", str(f)]
    p = subprocess.Popen([*argv, "--port", str(port), "--log-level", "warning", *extra])
    procs.append(p)
    _wait_port(port, p, "tinct router")


def _wait_ready(metrics_port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until the router's /readyz on ``metrics_port`` is 200 (with workers: all of them)."""
    url = f"http://127.0.0.1:{metrics_port}/readyz"
    wait_ready("tinct router", lambda: http_ok(url), proc, time.monotonic() + timeout, interval=0.1)


def _workers_router(
    tmp: Path,
    table: dict[str, Any],
    procs: list[subprocess.Popen[bytes]],
    workers: int,
    python: str = sys.executable,
) -> int:
    """A router with ``workers`` worker processes serving ``table``, all ready; its port."""
    port, metrics_port = free_port(), free_port()
    extra = ("--workers", str(workers), "--metrics-port", str(metrics_port))
    _start_router(tmp, table, port, procs, *extra, python=python)
    _wait_ready(metrics_port, procs[-1])
    return port


def _figures(prefix: str, runs: dict[str, dict[str, float]], measures: tuple[str, ...]) -> dict[str, float]:
    """``<prefix><side>_rps`` (and ``_p50_ms``, ``_p99_ms`` when asked) of each side's run."""
    return {
        f"{prefix}{side}_{m}" + ("" if m == "rps" else "_ms"): round(run[m], 1 if m == "rps" else 3)
        for m in measures
        for side, run in runs.items()
    }


def _release_tables(stable: str, candidate: str, n: int) -> list[dict[str, Any]]:
    """``n`` releases, each serving one model ``model-<i>``, all on the same backends."""
    return [
        table_doc(stable, candidate, release=f"release-{i}", models=[f"model-{i}"], default_weight=50)
        for i in range(n)
    ]


def classify_us() -> float:
    """Median microseconds to classify a ~4k-token chat request (body parse included)."""
    from tinct.api.routing import RoutingTable
    from tinct.router.classify import classify
    from tinct.router.table import CompiledTable

    ct = CompiledTable(RoutingTable.model_validate(_table("http://127.0.0.1:1", "http://127.0.0.1:2")))
    words = "the quick brown fox jumps over the lazy dog, "
    turns = [
        {"role": "system", "content": "You are a careful assistant. " * 20},
        *[
            {"role": "user" if i % 2 == 0 else "assistant", "content": words * 40 + f"turn {i}\n"}
            for i in range(8)
        ],
    ]
    body = json.dumps({"model": "bench", "messages": turns, "stream": True, "temperature": 0.2}).encode()
    headers = {"X-User-Role": "admin", "X-Session-Id": "abc"}
    route = classify(CHAT_PATH, body, headers, ct, role_trusted=True)
    assert route.tag.startswith("len:medium"), route.tag  # ~4k tokens at 4 chars per token
    samples = []
    for _ in range(30):
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            classify(CHAT_PATH, body, headers, ct, role_trusted=True)
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def _event(i: int) -> bytes:
    """An SSE event shaped like an engine's: a chat chunk carrying one token of content."""
    doc = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _sse_backend(
    port: int, chunks: int, paths: dict[str, tuple[asyncio.Event | None, dict[int, float]]]
) -> Any:
    """An SSE backend on ``port``: on each of ``paths``, ``chunks`` token events, each after
    its path's event (or at once, for None), stamped in its path's dictionary when written
    (the relay delay needs the exact write time, which an emulated engine's schedule does not
    give)."""
    from aiohttp import web

    def answer(go: asyncio.Event | None, sent: dict[int, float]) -> Any:
        async def sse(request: web.Request) -> web.StreamResponse:
            await request.read()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(chunks):
                if go is not None:
                    await go.wait()
                    go.clear()
                sent[i] = time.perf_counter()
                await resp.write(_event(i))
            await resp.write(b"data: [DONE]\n\n")
            return resp

        return sse

    app = web.Application()
    for path, (go, sent) in paths.items():
        app.router.add_post(path, answer(go, sent))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


#: Alternating rounds, and chunks per round, of the SSE chunk relay delay.
#: Rounds of chunks timed through each router. A chunk's delay moves by some 20 us from one
#: round to the next on two busy cores; with 12 rounds token_metrics_added_us read anything
#: from -1 to 24 us for a meter that spends 2 us a chunk, with 36 from 2 to 8.
RELAY_ROUNDS, RELAY_CHUNKS = 36, 40
#: Sessions of routers started afresh that share the rounds (:func:`_relay_in_both_orders`).
RELAY_SESSIONS = 6


async def _chunk_relay_delays(
    router_ports: dict[str, int], backend_port: int, chunks: int = RELAY_CHUNKS, rounds: int = RELAY_ROUNDS
) -> dict[str, list[list[float]]]:
    """ms from the SSE backend's write of a chunk to the client's read of it, via each router,
    in alternating rounds of ``chunks`` chunks (a change in load falls on every router alike),
    the routers' order reversed every other round (whichever goes first in a round does not
    always go first); per router, the delays of each round."""
    import aiohttp

    sent: dict[int, float] = {}
    go = asyncio.Event()
    runner = await _sse_backend(backend_port, chunks, {CHAT_PATH: (go, sent)})
    delays: dict[str, list[list[float]]] = {name: [] for name in router_ports}
    try:
        body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            order = list(router_ports.items())
            for n in range(rounds):
                for name, port in order if n % 2 == 0 else order[::-1]:
                    sent.clear()
                    delays[name].append([])
                    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                        for i in range(chunks):
                            await asyncio.sleep(0.01)
                            go.set()
                            line = await r.content.readline()
                            got = time.perf_counter()
                            assert line == _event(i)[:-1], line
                            await r.content.readline()
                            delays[name][-1].append((got - sent[i]) * 1000)
                        await r.read()
    finally:
        await runner.cleanup()
    return delays


#: The path of the paired measure's stream that is not measured: under the router's default
#: pass-through prefix, so relayed to stable unclassified, without a meter.
PASS_THROUGH_SSE = "/v1/bench/unmetered"


async def _paired_relay_delays(
    router_port: int, backend_port: int, chunks: int = RELAY_CHUNKS, rounds: int = RELAY_ROUNDS
) -> tuple[list[float], list[float]]:
    """ms from the SSE backend's write of a chunk to the client's read of it, through one
    router, for two streams open side by side: a chat request (classified, so its answer
    passes the token meter) and the same request on :data:`PASS_THROUGH_SSE` (passed through
    unclassified: no meter). Their chunks take turns, 10 ms apart, the order turned every
    chunk, so both streams' chunks meet the same process, CPUs and load; per chunk pair, the
    two delays."""
    import aiohttp

    triggers = {name: asyncio.Event() for name in ("metered", "unmetered")}
    stamps: dict[str, dict[int, float]] = {name: {} for name in triggers}
    paths = {"metered": CHAT_PATH, "unmetered": PASS_THROUGH_SSE}
    runner = await _sse_backend(
        backend_port, chunks, {paths[name]: (triggers[name], stamps[name]) for name in triggers}
    )
    metered: list[float] = []
    unmetered: list[float] = []
    got = {"metered": metered, "unmetered": unmetered}
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(rounds):
                for stamp in stamps.values():
                    stamp.clear()
                url = f"http://127.0.0.1:{router_port}"
                async with (
                    http.post(url + paths["metered"], json=body) as a,
                    http.post(url + paths["unmetered"], json=body) as b,
                ):
                    streams = {"metered": a, "unmetered": b}
                    for i in range(chunks):
                        order = ("metered", "unmetered") if i % 2 == 0 else ("unmetered", "metered")
                        for name in order:
                            await asyncio.sleep(0.01)
                            triggers[name].set()
                            line = await streams[name].content.readline()
                            read = time.perf_counter()
                            assert line == _event(i)[:-1], line
                            await streams[name].content.readline()
                            got[name].append((read - stamps[name][i]) * 1000)
                    await a.read()
                    await b.read()
    finally:
        await runner.cleanup()
    return metered, unmetered


def _paired_added_us(metered: list[float], unmetered: list[float]) -> float:
    """Microseconds the meter adds to a chunk's relay: the median of the pairs' differences."""
    return statistics.median(m - u for m, u in zip(metered, unmetered, strict=True)) * 1000


def _all(rounds: list[list[float]]) -> list[float]:
    return [x for r in rounds for x in r]


RouterSpec = tuple[str, tuple[str, ...], str]


def _relay_in_both_orders(
    tmp: Path,
    table: dict[str, Any],
    backend_port: int,
    routers: list[RouterSpec],
    rounds: int = RELAY_ROUNDS,
    sessions: int = RELAY_SESSIONS,
) -> list[dict[str, list[list[float]]]]:
    """:func:`_chunk_relay_delays` through ``routers`` (name, extra arguments, python), in
    ``sessions`` sessions sharing the rounds, each with the routers started afresh, in the
    order given and in the reverse order by turns. Of two identical routers started one after
    the other, the first relayed chunks 0.8 to 10.5 us later in five runs out of five; and
    what a process brings of its own (the CPU it lands on, where its memory lies) stays with
    it for all its rounds. Both are averaged out over the sessions
    (:func:`_added_us_both_orders`)."""
    out = []
    for n in range(sessions):
        ports: dict[str, int] = {}
        started: list[subprocess.Popen[bytes]] = []
        try:
            for name, extra, python in routers if n % 2 == 0 else routers[::-1]:
                ports[name] = free_port()
                _start_router(tmp, table, ports[name], started, *extra, python=python)
            delays = asyncio.run(_chunk_relay_delays(ports, backend_port, rounds=max(1, rounds // sessions)))
        finally:
            for proc in started:
                proc.kill()
                proc.wait()
        out.append({name: delays[name] for name, _, _ in routers})
    return out


def _added_us_both_orders(sessions: list[dict[str, list[list[float]]]], with_: str, without: str) -> float:
    """:func:`_added_us` of router ``with_`` over ``without``: the mean over the sessions of
    :func:`_relay_in_both_orders`."""
    return statistics.mean(_added_us(s[with_], s[without]) for s in sessions)


def _all_sessions(sessions: list[dict[str, list[list[float]]]], name: str) -> list[float]:
    """Every chunk delay through router ``name`` in the sessions."""
    return [x for s in sessions for x in _all(s[name])]


def _added_us(with_: list[list[float]], without: list[list[float]]) -> float:
    """Microseconds ``with_`` adds to ``without``: the median over rounds of the difference of
    the two rounds' medians (each pair ran back to back, under the same load)."""
    return (
        statistics.median(
            statistics.median(a) - statistics.median(b) for a, b in zip(with_, without, strict=True)
        )
        * 1000
    )


async def _time_to_first_chunk(ports: dict[str, int], backend_port: int, requests: int) -> dict[str, float]:
    """Median ms from sending a streaming request to reading its first SSE chunk, per target
    port, from an emulated engine (tinct emulator: first token at once) on ``backend_port``."""
    import aiohttp

    from tinct.emulator import Behaviour, serving

    out: dict[str, float] = {}
    behaviour = Behaviour(model="bench", ttft_ms=0, itl_ms=0, output_tokens=3)
    async with serving(behaviour, port=backend_port), aiohttp.ClientSession() as http:
        body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        for name, port in ports.items():
            samples = []
            for _ in range(requests):
                t0 = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                    line = await r.content.readline()
                    samples.append((time.perf_counter() - t0) * 1000)
                    assert line.startswith(b"data: {"), line
                    await r.read()
            out[name] = statistics.median(samples)
    return out


def _candidate_share(port: int) -> float:
    """Share of the router's proxied requests that the candidate answered (from /metrics)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    sides = {"stable": 0.0, "candidate": 0.0}
    for line in text.splitlines():
        m = re.match(r'tinct_router_requests_total\{.*side="(stable|candidate)".*\} ([\d.e+]+)$', line)
        if m:
            sides[m.group(1)] += float(m.group(2))
    total = sides["stable"] + sides["candidate"]
    return sides["candidate"] / total if total else 0.0


# --- ten thousand streams --------------------------------------------------------------------
#
# The engine and the load generator run as processes of their own (this script with
# ``--engine`` / ``--load``), on uvloop with bare asyncio protocols: as light as they can be,
# so what the router costs shows.

_STREAM_REQUEST = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Tell me a story."}]}
).encode()
_T = re.compile(rb'"t":([0-9.]+)\}')


def _raise_nofile() -> None:
    """Raise this process's descriptor limit to its hard limit (20,000 on these machines);
    processes started after inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _engine_main(port: int, tokens: int, interval: float) -> None:
    """An emulated engine: every request gets an SSE stream of ``tokens`` one-token events,
    one per ``interval`` seconds (the first after a random part of it, so streams spread
    over the interval), each stamped with ``time.monotonic()`` as it is written, then
    ``[DONE]``. Chunked, keep-alive."""
    import random

    import uvloop

    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    done = chunk_of(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    class Engine(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""
            self.t: asyncio.Transport | None = None
            self.left = 0
            self.timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = re.search(rb"(?i)content-length:\s*(\d+)", self.buf[:end])
            need = end + 4 + (int(m.group(1)) if m else 0)
            if len(self.buf) < need:
                return
            self.buf = self.buf[need:]
            assert self.t is not None
            self.t.write(head)
            self.left = tokens
            self.timer = loop.call_later(random.random() * interval, self.tick)

        def tick(self) -> None:
            assert self.t is not None
            if self.t.is_closing():
                return
            if self.left == 0:
                self.t.write(done)
                return
            self.left -= 1
            event = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"}}],"t":%.6f}\n\n'
            self.t.write(chunk_of(event % time.monotonic()))
            self.timer = loop.call_later(interval, self.tick)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.timer is not None:
                self.timer.cancel()

    async def serve() -> None:
        server = await loop.create_server(Engine, "127.0.0.1", port, backlog=4096)
        print("ready", flush=True)
        async with server:
            await asyncio.Future()

    _raise_nofile()
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(serve())


def _relay_main(port: int, upstream: int) -> None:
    """The least an HTTP/1.1 proxy in Python can do per request, as a reference for the
    router's own cost: uvloop and httptools as the router uses them, one upstream connection
    per client connection, and per request a task awaiting a future for the answer (as the
    router's handler does); no classification, header rewriting, metrics or timeouts."""
    import httptools
    import uvloop

    class Upstream(asyncio.Protocol):
        def __init__(self, client: Client) -> None:
            self.client = client
            self.parser = httptools.HttpResponseParser(self)
            self.pieces: list[bytes] = []
            self.t: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.pieces.append(data)
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            answer, self.pieces = b"".join(self.pieces), []
            if self.client.answer is not None:
                self.client.answer.set_result(answer)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client.t is not None:
                self.client.t.close()

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.pieces: list[bytes] = []
            self.t: asyncio.Transport | None = None
            self.answer: asyncio.Future[bytes] | None = None
            self.up: asyncio.Task[tuple[asyncio.BaseTransport, Upstream]] | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport  # type: ignore[assignment]
            self.up = loop.create_task(loop.create_connection(lambda: Upstream(self), "127.0.0.1", upstream))

        def data_received(self, data: bytes) -> None:
            self.pieces.append(data)
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            request, self.pieces = b"".join(self.pieces), []
            loop.create_task(self.exchange(request))

        async def exchange(self, request: bytes) -> None:
            assert self.up is not None
            assert self.t is not None
            up = (await self.up)[1]
            assert up.t is not None
            self.answer = loop.create_future()
            up.t.write(request)
            answer = await self.answer
            self.answer = None
            if not self.t.is_closing():
                self.t.write(answer)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.up is not None and self.up.done() and not self.up.exception():
                self.up.result()[0].close()

    async def serve() -> None:
        server = await loop.create_server(Client, "127.0.0.1", port, backlog=1024)
        async with server:
            await asyncio.Future()

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(serve())


def _lean_main(port: int, upstream: int) -> None:
    """The router's necessary work on the plain request, written flat: how fast the router's
    request path could be in Python, as a reference for its design (the relay is the floor of
    a proxy that does nothing). Per request, with no task, future or object of its own:

    - the request parsed by httptools (target, each header, body), its framing checked (one
      ``Content-Length`` of digits);
    - classification: the body parsed by orjson, the model looked up, the prompt's characters
      summed over the messages, the length bucket found, role and latency headers read;
    - the forwarded head built (hop-by-hop headers, ``Host`` and length dropped,
      ``X-Forwarded-For`` extended, ``X-Scheduler-Version`` added) and written with the body,
      on a keep-alive upstream connection from a pool;
    - the answer parsed by httptools (status, each header, body), its head rebuilt (hop-by-hop,
      ``Server`` and length dropped, ``Content-Length`` and ``X-Scheduler-Active`` added, the
      backend's ``Date`` kept) and written with the body;
    - a request counter, a duration and a time-to-first-byte histogram; the answer's
      ``choices`` and usage found by the two scans token metrics make.

    What it leaves out: every error path (a malformed request, a failed backend, timeouts,
    flow control), streaming bodies, fallback, mirroring and sessions. It serves the trivial
    request only (one table, weight 0).
    """
    import httptools
    import orjson
    import uvloop

    from tinct.histogram import Histogram

    hops = {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
    drop_request = hops | {b"host", b"content-length", b"expect", b"x-scheduler-version", b"x-tinct-shadow"}
    drop_answer = hops | {b"content-length", b"server"}
    bounds = ((512.0, "short"), (4096.0, "medium"), (float("inf"), "long"))
    roles, latencies = {"user", "admin"}, {"low", "high"}
    routes = {(b, r, lat): f"{b}-{r}-{lat}" for _, b in bounds for r in roles for lat in latencies}
    models = {"bench": routes}
    seconds = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    duration, ttfb = Histogram(seconds), Histogram(seconds)
    counts: dict[tuple[str, int], int] = {}
    choices, usage = re.compile(rb'"choices"\s*:'), re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
    idle: list[Upstream] = []

    class Message(asyncio.Protocol):
        """What both sides do alike: feed httptools, keep the header lines and body pieces."""

        parser: httptools.HttpRequestParser | httptools.HttpResponseParser

        def __init__(self) -> None:
            self.t: asyncio.Transport | None = None
            self.fields: list[tuple[bytes, bytes, bytes]] = []
            self.pieces: list[bytes] = []

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.fields.append((name.lower(), name, value))

        def on_body(self, body: bytes) -> None:
            self.pieces.append(body)

    class Upstream(Message):
        def __init__(self) -> None:
            super().__init__()
            self.parser = httptools.HttpResponseParser(self)
            self.client: Client | None = None
            self.reason = b""

        def on_message_begin(self) -> None:
            self.reason, self.fields, self.pieces = b"", [], []

        def on_status(self, status: bytes) -> None:
            self.reason += status

        def on_message_complete(self) -> None:
            client, self.client = self.client, None
            if self.parser.should_keep_alive():
                idle.append(self)
            elif self.t is not None:
                self.t.close()
            if client is not None:
                client.answered(self, self.parser.get_status_code())

        def connection_lost(self, exc: Exception | None) -> None:
            if self in idle:
                idle.remove(self)

    class Client(Message):
        def __init__(self) -> None:
            super().__init__()
            self.parser = httptools.HttpRequestParser(self)
            self.remote = b""
            self.target = b""
            self.started = 0.0
            self.route = ""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self.remote = str(transport.get_extra_info("peername")[0]).encode()

        def on_message_begin(self) -> None:
            self.target, self.fields, self.pieces = b"", [], []

        def on_url(self, url: bytes) -> None:
            self.target += url

        def on_headers_complete(self) -> None:
            lengths = [v for n, _, v in self.fields if n == b"content-length"]
            if len(lengths) != 1 or not lengths[0].isdigit():
                raise ValueError("framing")

        def on_message_complete(self) -> None:
            self.started = time.perf_counter()
            body = b"".join(self.pieces)
            doc = orjson.loads(body)
            table = models[doc["model"]]
            chars = 0
            for m in doc["messages"]:
                c = m.get("content")
                chars += len(c) if isinstance(c, str) else 0
            estimate = chars / 4
            bucket = next(name for bound, name in bounds if estimate <= bound)
            by_name = {n: v for n, _, v in self.fields}
            role = by_name.get(b"x-user-role", b"user").decode()
            latency = by_name.get(b"x-latency-class", b"low").decode()
            self.route = table[
                (bucket, role if role in roles else "user", latency if latency in latencies else "low")
            ]
            lines = [b"POST %b HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (self.target, upstream)]
            prior = None
            for n, name, value in self.fields:
                if n in drop_request:
                    continue
                if n == b"x-forwarded-for":
                    prior = prior or value
                    continue
                lines.append(b"%b: %b\r\n" % (name, value))
            xff = prior + b", " + self.remote if prior else self.remote
            lines.append(b"X-Forwarded-For: %b\r\nX-Scheduler-Version: v1\r\n" % xff)
            lines.append(b"Content-Length: %d\r\n\r\n" % len(body))
            lines.append(body)
            if idle:
                up = idle.pop()
                up.client = self
                assert up.t is not None
                up.t.write(b"".join(lines))
            else:
                loop.create_task(self.connect(b"".join(lines)))

        async def connect(self, request: bytes) -> None:
            _, up = await loop.create_connection(Upstream, "127.0.0.1", upstream)
            up.client = self
            assert up.t is not None
            up.t.write(request)

        def answered(self, up: Upstream, status: int) -> None:
            first = time.perf_counter() - self.started
            out = [b"HTTP/1.1 %d %b\r\n" % (status, up.reason)]
            for n, name, value in up.fields:
                if n not in drop_answer:
                    out.append(b"%b: %b\r\n" % (name, value))
            body = b"".join(up.pieces)
            out.append(b"Content-Length: %d\r\nX-Scheduler-Active: v1\r\n\r\n" % len(body))
            out.append(body)
            if self.t is not None and not self.t.is_closing():
                self.t.write(b"".join(out))
            if choices.search(body) is not None:
                usage.search(body)
            duration.observe(time.perf_counter() - self.started)
            ttfb.observe(first)
            key = (self.route, status)
            counts[key] = counts.get(key, 0) + 1

    async def serve() -> None:
        server = await loop.create_server(Client, "127.0.0.1", port, backlog=1024)
        async with server:
            await asyncio.Future()

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(serve())


def chunk_of(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _load_main(port: int, streams: int, rate: float) -> None:
    """``streams`` concurrent streaming chat requests to ``port``, opened at ``rate`` per
    second, each read to its end. Prints ``open`` once every stream has its first token,
    then one JSON line: streams completed, errors, and each chunk's delay from the engine's
    write to this process's read (ms)."""
    import uvloop

    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(_STREAM_REQUEST), _STREAM_REQUEST)
    )
    delays: list[float] = []  # once every stream is open
    ramp: list[float] = []  # while they open
    state = {"started": 0, "first": 0, "ok": 0, "errors": 0, "ended": 0}
    all_open = asyncio.Event()
    all_ended = asyncio.Event()

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""
            self.got_first = False
            self.saw_done = False
            self.finished = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.write(request)  # type: ignore[attr-defined]
            self.t = transport

        def data_received(self, data: bytes) -> None:
            now = time.monotonic()
            buf = self.buf + data if self.buf else data
            cut = buf.rfind(b"\n\n")
            if cut >= 0:
                into = delays if all_open.is_set() else ramp
                for m in _T.finditer(buf, 0, cut):
                    into.append((now - float(m.group(1))) * 1000.0)
                    if not self.got_first:
                        self.got_first = True
                        state["first"] += 1
                        if state["first"] == streams:
                            all_open.set()
                if b"data: [DONE]" in buf:
                    self.saw_done = True
                buf = buf[cut + 2 :]
            if self.saw_done and buf.endswith(b"0\r\n\r\n"):
                self.finished = True
                state["ok"] += 1
                self.t.close()
                return
            self.buf = buf

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.finished:
                state["errors"] += 1
                if not self.got_first:
                    state["first"] += 1  # it never will: do not wait for it
                    if state["first"] == streams:
                        all_open.set()
            state["ended"] += 1
            if state["ended"] == streams:
                all_ended.set()

    async def run() -> None:
        start = loop.time()
        pending: set[asyncio.Task[Any]] = set()

        async def one() -> None:
            try:
                await loop.create_connection(Client, "127.0.0.1", port)
            except OSError:
                state["errors"] += 1
                state["first"] += 1
                state["ended"] += 1
                if state["first"] == streams:
                    all_open.set()
                if state["ended"] == streams:
                    all_ended.set()

        for i in range(streams):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
        await all_open.wait()
        print("open", flush=True)
        await all_ended.wait()
        delays.sort()
        ramp.sort()
        n = len(delays)
        print(
            json.dumps(
                {
                    "streams": state["ok"],
                    "errors": state["errors"],
                    "chunks": n + len(ramp),
                    "p50": delays[n // 2] if n else None,
                    "p99": delays[min(n - 1, int(n * 0.99))] if n else None,
                    "ramp_p99": ramp[min(len(ramp) - 1, int(len(ramp) * 0.99))] if ramp else None,
                }
            ),
            flush=True,
        )

    _raise_nofile()
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(run())


def long_prompt_request() -> str:
    """A chat request of about 220 KB: a system prompt, four earlier turns and a long user
    turn (a pasted document), as an LLM agent sends them."""
    turns = _conversation(
        "You are a careful assistant for an ML platform team. " * 12, 4, 20, 6, "Question {i}?"
    )
    doc = json.dumps({"model": "bench", "messages": turns, "temperature": 0.2, "max_tokens": 256})
    long_turn = _PROSE * ((LONG_PROMPT_BYTES - len(doc)) // len(_PROSE))
    turns.append({"role": "user", "content": "Summarise this document:\n" + long_turn})
    return json.dumps({"model": "bench", "messages": turns, "temperature": 0.2, "max_tokens": 256})


def _median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over the rounds: a round that something else on the machine slowed
    (a first run at half the speed of the rest has been seen) does not move it."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _shadow_case(
    args: argparse.Namespace,
    tmp: Path,
    procs: list[subprocess.Popen[bytes]],
    stable_url: str,
    candidate_url: str,
    url: str,
    trivial_lua: Path,
) -> dict[str, Any]:
    """The plain router against one mirroring 10 %, in alternating rounds (a change in load
    falls on both alike), and the pairs a stand-in comparer received."""
    receiver = _Receiver()
    try:
        router, shadow_router = free_port(), free_port()
        _start_router(tmp, _table(stable_url, candidate_url, 0), router, procs)
        _start_router(
            tmp, _shadow_table(stable_url, candidate_url), shadow_router, procs, "--comparer", receiver.rx.url
        )
        shadow_lua = tmp / "shadow.lua"
        shadow_lua.write_text(_lua(REQUEST, sessions=True))
        got: dict[str, list[dict[str, float]]] = {"router": [], "shadow_live": []}
        for _ in range(max(args.rounds, 3)):  # medians: one disturbed round does not decide
            for name, port, lua in (
                ("router", router, trivial_lua),
                ("shadow_live", shadow_router, shadow_lua),
            ):
                got[name].append(_wrk(url.format(port), lua, args.duration, args.connections))
                print(f"shadow {name:>11}: {got[name][-1]}", file=sys.stderr)
        runs = {
            name: {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50", "p99")}
            for name, rs in got.items()
        }
        mirrors = _counter(shadow_router, "tinct_router_shadow_mirrors_total")
        deadline = time.monotonic() + 10
        while receiver.received < mirrors and time.monotonic() < deadline:
            time.sleep(0.1)  # the last batches (250 ms apart at most)
        pairs = receiver.received
        print(f"shadow run: {mirrors:.0f} mirrored, {pairs} pairs received", file=sys.stderr)
    finally:
        receiver.stop()
    return {
        "shadow_router_rps": round(runs["router"]["rps"], 1),
        "shadow_router_p50_ms": round(runs["router"]["p50"], 3),
        "shadow_router_p99_ms": round(runs["router"]["p99"], 3),
        "shadow_live_rps": round(runs["shadow_live"]["rps"], 1),
        "shadow_live_p50_ms": round(runs["shadow_live"]["p50"], 3),
        "shadow_live_p99_ms": round(runs["shadow_live"]["p99"], 3),
        "shadow_live_vs_router": round(runs["shadow_live"]["rps"] / runs["router"]["rps"], 3),
        "shadow_pairs": pairs,
        "shadow_mirrors": round(mirrors),
    }


def _alternate(
    targets: dict[str, str],
    script: Path,
    duration: float,
    connections: int,
    rounds: int,
    label: str,
    pids: dict[str, int] | None = None,
) -> dict[str, dict[str, float]]:
    """wrk against each of ``targets`` (name -> URL) in alternating rounds; the median of each.
    For the sides ``pids`` names (name -> the one process serving it), also the CPU that
    process spent per request, in user space (``user_us``) and in the kernel (``sys_us``)."""
    got: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, url in targets.items():
            pid = (pids or {}).get(name)
            _warm(url, script, connections)  # apart: its requests are not in the CPU read below
            before = cpu_times(pid) if pid else (0.0, 0.0)
            run = _wrk(url, script, duration, connections, warm=False)
            if pid:
                requests = run["rps"] * duration
                after = cpu_times(pid)
                run["user_us"] = (after[0] - before[0]) / requests * 1e6
                run["sys_us"] = (after[1] - before[1]) / requests * 1e6
            got[name].append(run)
            print(f"{label} {name:>8}: {got[name][-1]}", file=sys.stderr)
    return {name: _median_runs(r) for name, r in got.items()}


def token_meter_us() -> float:
    """In-process median microseconds a :class:`~tinct.router.tokens.Meter` spends reading one
    SSE chunk carrying one token (in the router its reading waits for the
    :class:`~tinct.router.tokens.MeterSweep`, apart from the chunk's relay)."""
    from tinct.histogram import Histogram
    from tinct.router.metrics import ITL_BUCKETS
    from tinct.router.tokens import Meter

    events = [_event(i) for i in range(1000)]
    samples = []
    for _ in range(30):
        meter = Meter(time.perf_counter(), 200, True, True, Histogram(ITL_BUCKETS))
        t0 = time.perf_counter()
        for ev in events:
            meter.feed(ev)
        samples.append((time.perf_counter() - t0) / len(events) * 1e6)
    return statistics.median(samples)


def _rss_kb(pids: list[int]) -> int:
    """Resident kB of the router's workers ``pids``; an error naming one that ended (a zombie
    has no resident memory to read) rather than a sum that is not a number."""
    total = 0.0
    for pid in pids:
        mb = status_mb(pid)
        if math.isnan(mb):
            raise RuntimeError(f"router worker {pid} ended during the streams case; see its log above")
        total += mb
    return round(total * 1024)


def _fds(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


def _helper(args: list[str], procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    procs.append(p)  # type: ignore[arg-type]
    return p


def streams_case(
    tmp: Path,
    procs: list[subprocess.Popen[bytes]],
    *,
    streams: int,
    seconds: int,
    rate: float,
    rounds: int,
    workers: int,
    keepalive: int,
    python: str = sys.executable,
) -> dict[str, Any]:
    """``streams`` concurrent streams through a router with ``workers`` workers, and the
    same straight to the engine, in alternating rounds (see the module docstring)."""
    engine = free_port()
    eng = _helper(["--engine", str(engine), "--tokens", str(seconds)], procs)
    assert eng.stdout is not None
    assert eng.stdout.readline().strip() == "ready"
    port, metrics_port = free_port(), free_port()
    table = _table(f"http://127.0.0.1:{engine}", f"http://localhost:{engine}", 50)
    _start_router(
        tmp, table, port, procs, "--workers", str(workers), "--metrics-port", str(metrics_port), python=python
    )
    router = procs[-1]
    _wait_ready(metrics_port, router)
    pids = children(router.pid)
    time.sleep(1.0)
    rss_before, fds_before = _rss_kb(pids), _fds(pids)
    out: dict[str, list[dict[str, Any]]] = {"router": [], "direct": []}
    plateau: list[int] = []
    fds_after: list[int] = []
    for _ in range(rounds):
        for name, target in (("router", port), ("direct", engine)):
            load = _helper(["--load", str(target), "--streams", str(streams), "--rate", str(rate)], procs)
            assert load.stdout is not None
            assert load.stdout.readline().strip() == "open"
            if name == "router":
                plateau.append(_rss_kb(pids))
            got = json.loads(load.stdout.readline())
            load.wait()
            procs.remove(load)  # type: ignore[arg-type]
            if name == "router":
                time.sleep(2.0)  # the client's closes reach the router
                fds_after.append(_fds(pids))
            print(f"streams {name:>6}: {got}", file=sys.stderr)
            out[name].append(got)
    for p in (router, eng):  # ten thousand streams' worth of descriptors go with them
        p.terminate()
        p.wait()
        procs.remove(p)  # type: ignore[arg-type]
    r, d = out["router"], out["direct"]
    return {
        "streams": min(x["streams"] for x in r),
        "stream_errors": sum(x["errors"] for x in r),
        "stream_errors_direct": sum(x["errors"] for x in d),
        "router_kb_per_stream": round((max(plateau) - rss_before) / streams, 2),
        "router_rss_before_mb": round(rss_before / 1024, 1),
        "stream_chunk_p50_ms": round(statistics.mean(x["p50"] for x in r), 3),
        "stream_chunk_p99_ms": round(statistics.mean(x["p99"] for x in r), 3),
        "stream_chunk_direct_p50_ms": round(statistics.mean(x["p50"] for x in d), 3),
        "stream_chunk_direct_p99_ms": round(statistics.mean(x["p99"] for x in d), 3),
        "stream_chunk_ramp_p99_ms": round(statistics.mean(x["ramp_p99"] for x in r), 3),
        "stream_chunk_direct_ramp_p99_ms": round(statistics.mean(x["ramp_p99"] for x in d), 3),
        "stream_chunk_added_p99_ms": round(
            statistics.mean(x["p99"] for x in r) - statistics.mean(x["p99"] for x in d), 3
        ),
        "router_fds_before": fds_before,
        "router_fds_after": max(fds_after),
        "router_fds_cap": fds_before + workers * keepalive * 2,
    }


# --- one commit against another ----------------------------------------------------------------


def _build_ref(ref: str, tmp: Path) -> str:
    """``ref`` checked out in a temporary worktree with a venv of its own; its python."""
    root = Path(__file__).resolve().parent.parent
    where = tmp / "ref"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(where), ref], check=True)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    python = str(where / ".venv" / "bin" / "python")
    if uv:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(where / ".venv")], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", python, "-e", f"{where}[fast]"], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(where / ".venv")], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "-e", f"{where}[fast]"], check=True)
    return python


def against(
    ref: str, args: argparse.Namespace, cases: set[str], tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """This checkout's router and ``ref``'s through the same cases (hop, long, workers, sse,
    streams; those in ``cases``) in alternating rounds; each key for both and their ratio."""
    ref_python = _build_ref(ref, tmp)
    pythons = {"head": sys.executable, "ref": ref_python}
    backend = free_port()
    _start_nginx(tmp, "backend", _backend_server(backend), backend, procs)
    stable, candidate = f"http://127.0.0.1:{backend}", f"http://localhost:{backend}"
    trivial, long_lua = tmp / "trivial.lua", tmp / "long.lua"
    trivial.write_text(_lua(REQUEST, sessions=False))
    long_lua.write_text(_lua(long_prompt_request(), sessions=False))
    url = "http://127.0.0.1:{}/v1/chat/completions"
    keys: dict[str, dict[str, float]] = {n: {} for n in pythons}

    def routers(weight: float, *extra: str) -> dict[str, str]:
        urls = {}
        for name, python in pythons.items():
            port = free_port()
            _start_router(tmp, _table(stable, candidate, weight), port, procs, *extra, python=python)
            urls[name] = url.format(port)
        return urls

    if "hop" in cases:
        plain = _alternate(routers(0), trivial, args.duration, args.connections, args.rounds, "plain")
        for n, got in plain.items():
            keys[n].update({"router_rps": got["rps"], "router_p50_ms": got["p50"]})
    if "long" in cases:
        long150 = _alternate(routers(50), long_lua, args.duration, 150, args.rounds, "long150")
        for n, got in long150.items():
            keys[n].update(
                {
                    "long_prompt_rps": got["rps"],
                    "long_prompt_p50_ms": got["p50"],
                    "long_prompt_p99_ms": got["p99"],
                }
            )
    if "workers" in cases:
        urls = {}
        for workers in (1, 2):
            for name, python in pythons.items():
                port = _workers_router(tmp, _table(stable, candidate, 0), procs, workers, python)
                urls[f"{name}/{workers}"] = url.format(port)
        w = _alternate(urls, trivial, args.duration, args.worker_connections, args.rounds, "workers")
        for n in pythons:
            keys[n]["workers_speedup"] = w[f"{n}/2"]["rps"] / w[f"{n}/1"]["rps"]
    if "sse" in cases:
        sse_backend = free_port()
        sse = _table(f"http://127.0.0.1:{sse_backend}", f"http://localhost:{sse_backend}")
        specs: list[RouterSpec] = [
            (f"{name}/{kind}", extra, python)
            for name, python in pythons.items()
            for kind, extra in (("sse", ()), ("sse_unmeasured", ("--no-token-metrics",)))
        ]
        sessions = _relay_in_both_orders(tmp, sse, sse_backend, specs)
        for n, python in pythons.items():
            keys[n]["chunk_relay_delay_median_ms"] = statistics.median(_all_sessions(sessions, f"{n}/sse"))
            keys[n]["token_metrics_added_us"] = _added_us_both_orders(
                sessions, f"{n}/sse", f"{n}/sse_unmeasured"
            )
            port = free_port()
            _start_router(tmp, sse, port, procs, python=python)
            keys[n]["token_metrics_added_us_paired"] = _paired_added_us(
                *asyncio.run(_paired_relay_delays(port, sse_backend))
            )
    if "streams" in cases:
        for _ in range(args.stream_rounds):
            for n, python in pythons.items():
                got = streams_case(
                    tmp,
                    procs,
                    streams=args.streams,
                    seconds=args.stream_seconds,
                    rate=args.stream_rate,
                    rounds=1,
                    workers=2,
                    keepalive=UPSTREAM_KEEPALIVE,
                    python=python,
                )
                for k in (
                    "stream_errors",
                    "router_kb_per_stream",
                    "stream_chunk_added_p99_ms",
                    "router_fds_after",
                ):
                    keys[n].setdefault(k, 0.0)
                    keys[n][k] += got[k] / args.stream_rounds
    summary: dict[str, Any] = {"against": ref}
    for key in keys["head"]:
        h, r = keys["head"][key], keys["ref"][key]
        summary[key] = {"head": round(h, 3), "ref": round(r, 3), "ratio": round(h / r, 3) if r else None}
    return summary


def _backend_server(port: int) -> str:
    answer = ANSWER.replace("'", "\\'")
    return f"""  server {{
    listen 127.0.0.1:{port};
    client_body_buffer_size 1m;
    client_max_body_size 8m;
    location / {{ default_type application/json; return 200 '{answer}'; }}
  }}"""


CASES = ("hop", "shadow", "long", "tables", "workers", "sse", "streams")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default: %(default)s)")
    ap.add_argument("--connections", type=int, default=8, help="wrk connections (default: %(default)s)")
    ap.add_argument(
        "--worker-connections",
        type=int,
        default=32,
        help="wrk connections of the one-worker vs two-workers runs: enough that the kernel's "
        "per-connection spreading gives both workers a share (default: %(default)s)",
    )
    ap.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds of each comparison (default: %(default)s)"
    )
    ap.add_argument(
        "--cases",
        default=",".join(CASES),
        help="comma-separated cases to run, of %(default)s (default: all); keys of the others are left out",
    )
    ap.add_argument("--streams", type=int, default=10_000, help="concurrent streams (default: %(default)s)")
    ap.add_argument(
        "--stream-seconds",
        type=int,
        default=20,
        help="tokens of each stream, one a second (default: %(default)s)",
    )
    ap.add_argument(
        "--stream-rate", type=float, default=2000.0, help="streams opened per second (default: %(default)s)"
    )
    ap.add_argument(
        "--stream-rounds", type=int, default=1, help="router/direct rounds of streams (default: %(default)s)"
    )
    ap.add_argument(
        "--against",
        metavar="REF",
        help="instead: build REF (a commit, branch or tag) in a temporary worktree and venv, and run "
        "its router and this checkout's through the same cases in alternating rounds",
    )
    ap.add_argument("--engine", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=20, help=argparse.SUPPRESS)
    ap.add_argument("--load", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--relay", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lean", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--to", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=2000.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine is not None:
        _engine_main(args.engine, args.tokens, 1.0)
        return 0
    if args.relay is not None:
        _relay_main(args.relay, args.to)
        return 0
    if args.lean is not None:
        _lean_main(args.lean, args.to)
        return 0
    if args.load is not None:
        _load_main(args.load, args.streams, args.rate)
        return 0
    cases = set(args.cases.split(","))
    if unknown := cases - set(CASES):
        ap.error(f"unknown cases {sorted(unknown)}; give some of {','.join(CASES)}")
    _ensure_tools()
    _raise_nofile()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="tinct-bench-router-"))
    summary: dict[str, Any] = {}
    try:
        summary = (
            against(args.against, args, cases, tmp, procs) if args.against else _run(args, cases, tmp, procs)
        )
    finally:
        for p in reversed(procs):  # routers before their backends
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if args.against:
            root = Path(__file__).resolve().parent.parent
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(tmp / "ref")], check=False
            )
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(summary))
    return 0


def _run(
    args: argparse.Namespace, cases: set[str], tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    trivial_lua = tmp / "trivial.lua"
    trivial_lua.write_text(_lua(REQUEST, sessions=False))
    real_lua = tmp / "realistic.lua"
    real_lua.write_text(_lua(realistic_request(), sessions=True))
    long_lua = tmp / "long.lua"
    long_lua.write_text(_lua(long_prompt_request(), sessions=False))
    backend, proxy = free_port(), free_port()
    _start_nginx(tmp, "backend", _backend_server(backend), backend, procs)
    _start_nginx(
        tmp,
        "proxy",
        f"""  upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{proxy};
    client_body_buffer_size 1m;
    client_max_body_size 8m;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}""",
        proxy,
        procs,
    )
    nginx_proxy = procs[-1].pid  # its master; the worker serves
    stable_url, candidate_url = f"http://127.0.0.1:{backend}", f"http://localhost:{backend}"
    path = "/v1/chat/completions"
    url = "http://127.0.0.1:{}" + path
    if "hop" in cases:
        router, router50, relay, lean = free_port(), free_port(), free_port(), free_port()
        _start_router(tmp, _table(stable_url, candidate_url, 0), router, procs)
        pids = {"router": procs[-1].pid, "nginx": children(nginx_proxy)[0]}
        _start_router(tmp, _table(stable_url, candidate_url, 50), router50, procs)
        _wait_port(relay, _helper(["--relay", str(relay), "--to", str(backend)], procs), "relay")
        pids["relay"] = procs[-1].pid
        _wait_port(lean, _helper(["--lean", str(lean), "--to", str(backend)], procs), "lean")
        pids["lean"] = procs[-1].pid
        runs: dict[str, dict[str, float]] = {}
        runs.update(
            _alternate(
                {
                    "direct": url.format(backend),
                    "nginx": url.format(proxy),
                    "relay": url.format(relay),
                    "lean": url.format(lean),
                    "router": url.format(router),
                },
                trivial_lua,
                args.duration,
                args.connections,
                args.rounds,
                "plain",
                pids,
            )
        )
        real = _alternate(
            {"direct": url.format(backend), "nginx": url.format(proxy), "router": url.format(router50)},
            real_lua,
            args.duration,
            args.connections,
            args.rounds,
            "realistic",
        )
        share = _candidate_share(router50)
        print(f"realistic run: candidate answered {share:.1%} of the routed requests", file=sys.stderr)
        summary.update(_figures("", runs, ("rps", "p50", "p99")))
        summary["router_vs_nginx"] = round(runs["router"]["rps"] / runs["nginx"]["rps"], 3)
        summary["router_vs_relay"] = round(runs["router"]["rps"] / runs["relay"]["rps"], 3)
        summary["router_vs_lean"] = round(runs["router"]["rps"] / runs["lean"]["rps"], 3)
        summary["lean_vs_nginx"] = round(runs["lean"]["rps"] / runs["nginx"]["rps"], 3)
        for side in pids:
            summary[f"{side}_user_us_per_request"] = round(runs[side]["user_us"], 1)
            summary[f"{side}_sys_us_per_request"] = round(runs[side]["sys_us"], 1)
        summary.update(_figures("realistic_", real, ("rps",)))
        summary.update(
            realistic_router_vs_nginx=round(real["router"]["rps"] / real["nginx"]["rps"], 3),
            realistic_nginx_p99_ms=round(real["nginx"]["p99"], 3),
            realistic_router_p99_ms=round(real["router"]["p99"], 3),
            realistic_candidate_share=round(share, 3),
        )
    if "shadow" in cases:
        summary.update(_shadow_case(args, tmp, procs, stable_url, candidate_url, url, trivial_lua))
    if "long" in cases:
        long_router, workers_router, workers_metrics = free_port(), free_port(), free_port()
        _start_router(tmp, _table(stable_url, candidate_url, 50), long_router, procs)
        long_pids = {"router": procs[-1].pid, "nginx": children(nginx_proxy)[0]}
        long_lean = free_port()
        _wait_port(long_lean, _helper(["--lean", str(long_lean), "--to", str(backend)], procs), "lean")
        long_pids["lean"] = procs[-1].pid
        _start_router(
            tmp,
            _table(stable_url, candidate_url, 50),
            workers_router,
            procs,
            *("--workers", "2", "--metrics-port", str(workers_metrics)),
        )
        _wait_ready(workers_metrics, procs[-1])
        targets = {
            "direct": url.format(backend),
            "nginx": url.format(proxy),
            "router": url.format(long_router),
            "workers": url.format(workers_router),
            "lean": url.format(long_lean),
        }
        for conns in (20, 150):
            got = _alternate(targets, long_lua, args.duration, conns, args.rounds, f"long{conns}", long_pids)
            d, r, w = got["direct"], got["router"], got["workers"]
            for name, run in got.items():
                summary[f"long_prompt_{name}_rps_{conns}"] = round(run["rps"], 1)
                summary[f"long_prompt_{name}_p50_ms_{conns}"] = round(run["p50"], 3)
                summary[f"long_prompt_{name}_p99_ms_{conns}"] = round(run["p99"], 3)
            suffix = "" if conns == 150 else f"_{conns}"
            summary[f"long_prompt_rps_ratio{suffix}"] = round(r["rps"] / d["rps"], 3)
            summary[f"long_prompt_added_p50_ms{suffix}"] = round(r["p50"] - d["p50"], 3)
            summary[f"long_prompt_added_p99_ms{suffix}"] = round(r["p99"] - d["p99"], 3)
            summary[f"long_prompt_rps_ratio_workers{suffix}"] = round(w["rps"] / d["rps"], 3)
            summary[f"long_prompt_added_p50_ms_workers{suffix}"] = round(w["p50"] - d["p50"], 3)
            summary[f"long_prompt_added_p99_ms_workers{suffix}"] = round(w["p99"] - d["p99"], 3)
            summary[f"long_prompt_rps_ratio_lean{suffix}"] = round(got["lean"]["rps"] / d["rps"], 3)
            for side in long_pids:
                summary[f"long_prompt_{side}_user_us_per_request{suffix}"] = round(got[side]["user_us"], 1)
                summary[f"long_prompt_{side}_sys_us_per_request{suffix}"] = round(got[side]["sys_us"], 1)
    if "tables" in cases:
        # One table vs a hundred: the request's model picks its table among them.
        one_table, hundred_tables = free_port(), free_port()
        _start_router(tmp, _release_tables(stable_url, candidate_url, 100)[57:58], one_table, procs)
        _start_router(tmp, _release_tables(stable_url, candidate_url, 100), hundred_tables, procs)
        model_lua = tmp / "model.lua"
        model_lua.write_text(_lua(REQUEST.replace('"bench"', '"model-57"'), sessions=True))
        tables = _alternate(
            {"tables_1": url.format(one_table), "tables_100": url.format(hundred_tables)},
            model_lua,
            args.duration,
            args.connections,
            args.rounds,
            "tables",
        )
        summary.update(
            {
                "rps_1_table": round(tables["tables_1"]["rps"], 1),
                "rps_100_tables": round(tables["tables_100"]["rps"], 1),
                "rps_100_tables_vs_1": round(tables["tables_100"]["rps"] / tables["tables_1"]["rps"], 3),
            }
        )
    if "workers" in cases:
        # One worker against two (SO_REUSEPORT), same table, same request, same connections.
        worker_urls: dict[str, str] = {}
        for workers in (1, 2):
            port = _workers_router(tmp, _table(stable_url, candidate_url, 0), procs, workers)
            worker_urls[f"workers_{workers}"] = url.format(port)
        wr = _alternate(
            worker_urls, trivial_lua, args.duration, args.worker_connections, args.rounds, "workers"
        )
        summary.update(
            {
                "router_1_worker_rps": round(wr["workers_1"]["rps"], 1),
                "router_workers_rps": round(wr["workers_2"]["rps"], 1),
                "workers_speedup": round(wr["workers_2"]["rps"] / wr["workers_1"]["rps"], 3),
            }
        )
    if "sse" in cases:
        us = classify_us()
        print(f"classify 4k-token chat: {us:.1f} us", file=sys.stderr)
        sse_backend, sse_router = free_port(), free_port()
        sse_table = _table(f"http://127.0.0.1:{sse_backend}", f"http://localhost:{sse_backend}")
        sessions = _relay_in_both_orders(
            tmp,
            sse_table,
            sse_backend,
            [("measured", (), sys.executable), ("unmeasured", ("--no-token-metrics",), sys.executable)],
        )
        medians = {}
        for name in ("measured", "unmeasured"):
            delays = _all_sessions(sessions, name)
            medians[name] = statistics.median(delays)
            print(
                f"SSE chunk backend write -> client read via router ({name} tokens): median "
                f"{medians[name]:.3f} ms, max {max(delays):.3f} ms",
                file=sys.stderr,
            )
        _start_router(tmp, sse_table, sse_router, procs)
        ttfc = asyncio.run(
            _time_to_first_chunk({"router": sse_router, "direct": sse_backend}, sse_backend, 50)
        )
        print(f"time to first SSE chunk (median of 50): {ttfc}", file=sys.stderr)
        metered, unmetered = asyncio.run(_paired_relay_delays(sse_router, sse_backend))
        paired_us = _paired_added_us(metered, unmetered)
        print(
            f"SSE chunk via one router, metered / passed through: median {statistics.median(metered):.3f} / "
            f"{statistics.median(unmetered):.3f} ms, {paired_us:.1f} us apart (median of "
            f"{len(metered)} pairs)",
            file=sys.stderr,
        )
        # The same pairs through a router that meters nothing: what the two paths differ by
        # without the meter, this machine's zero for the key above.
        reference_router = free_port()
        _start_router(tmp, sse_table, reference_router, procs, "--no-token-metrics")
        reference_us = _paired_added_us(*asyncio.run(_paired_relay_delays(reference_router, sse_backend)))
        print(
            f"the same through a router with --no-token-metrics: {reference_us:.1f} us apart", file=sys.stderr
        )
        summary.update(
            {
                "classify_us_4k_tokens": round(us, 2),
                "time_to_first_chunk_ms": round(ttfc["router"], 3),
                "time_to_first_chunk_direct_ms": round(ttfc["direct"], 3),
                "chunk_relay_delay_median_ms": round(medians["measured"], 3),
                "chunk_relay_delay_median_ms_unmeasured": round(medians["unmeasured"], 3),
                "token_metrics_added_us": round(_added_us_both_orders(sessions, "measured", "unmeasured"), 1),
                "token_metrics_added_us_paired": round(paired_us, 1),
                "token_metrics_paired_reference_us": round(reference_us, 1),
                "token_metrics_added_us_paired_net": round(paired_us - reference_us, 1),
                "token_meter_us_per_chunk": round(token_meter_us(), 2),
            }
        )
    if "streams" in cases:
        summary.update(
            streams_case(
                tmp,
                procs,
                streams=args.streams,
                seconds=args.stream_seconds,
                rate=args.stream_rate,
                rounds=args.stream_rounds,
                workers=2,
                keepalive=UPSTREAM_KEEPALIVE,
            )
        )
    return summary


if __name__ == "__main__":
    sys.exit(main())
