"""Benchmark of the dye router against nginx, side by side on this machine.

wrk (one thread, 8 connections) posts chat requests to a fixed-answer nginx backend:

- directly,
- through nginx as a reverse proxy (1 worker, upstream keep-alive),
- through ``tinct router`` (1 process, table from a file),

twice: a trivial request (64 characters, every cell at weight 0: the router only parses and
forwards) and a realistic one (several messages, ~3,000 tokens, every cell at weight 50, a
new ``X-Session-Id`` per request, so classification of a real prompt, the sticky hash and
the candidate choice all run; the candidate is the same nginx under another host name).
Latency percentiles are reported side by side per run, never subtracted across runs.

The trivial run through the router alternates (three rounds each, medians) with the same
run through a router that mirrors a 10 % shadow share of every cell (``noiseShare`` 10,
budgets opened wide so that the share, not a budget, decides) to the candidate, sending the
pairs to a receiver in this process that stands in for ``tinct comparer``; there wrk gives
each request a new ``X-Session-Id`` so that the share is drawn per request (a cost the plain
run does not pay): ``shadow_live_*`` is what clients saw, ``shadow_pairs`` the pairs
received over its rounds (warm-ups included), ``shadow_mirrors`` what the router mirrored.

A router with two worker processes (``--workers 2``, SO_REUSEPORT) against one with
``--workers 1``, both with a metrics port, same request, ``--worker-connections``
connections: ``workers_speedup`` is the ratio. On a two-core machine the load generator and
the backend share the cores with the workers, so it stays well under 2.

A router with 100 routing tables (one model each) against one with a single table, the
request naming one of the models, in alternating rounds, shows that picking the table by model costs nothing that
grows with the number of releases.

Then, in process: the time to classify a 4k-token chat request; through the router, the
time from sending a streaming request to an emulated engine (``tinct emulator``) to reading
its first SSE chunk (and the same straight to the engine); and the median delay of an SSE
chunk (a chat chunk carrying one token) from the backend's write to the client's read,
through a router measuring tokens (time to first token, inter-token latency, contract) and,
in alternating rounds of the same run, through one started with ``--no-token-metrics``.

Everything listens on 127.0.0.1; runs are a few seconds each; every process started here is
stopped at the end. wrk and nginx come from Debian and are installed with apt-get if
missing. The last line printed is the JSON summary.

Usage: python bench/router.py [--duration SECONDS] [--connections N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from tinct_testing.controlplane.harness import free_port
from tinct_testing.controlplane.process import http_ok, terminate, wait_ready
from tinct_testing.router_fakes import PairReceiver, table_doc  # the tests' routing table and pair receiver

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


def realistic_request() -> str:
    """A multi-turn chat request of about 3,000 tokens (at 4 characters per token)."""
    prose = (
        "The scheduler batches requests by prompt length and keeps the KV cache warm for "
        "sessions that come back; when memory runs short it evicts the coldest session first. "
    )
    turns = [{"role": "system", "content": "You are a concise assistant for an ML platform team. " * 6}]
    for i in range(6):
        turns.append({"role": "user", "content": prose * 8 + f"Question {i}: what changes at step {i}?"})
        turns.append({"role": "assistant", "content": prose * 4})
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


def _wrk(url: str, script: Path, duration: float, connections: int) -> dict[str, float]:
    # A short warm-up fills keep-alive pools and JITs nothing, but settles the caches.
    subprocess.run(
        ["wrk", "-t1", f"-c{connections}", "-d1s", "-s", str(script), url],
        check=True,
        capture_output=True,
    )
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
) -> None:
    argv = [sys.executable, "-m", "tinct.cli", "router", "--host", "127.0.0.1"]
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


def _release_tables(stable: str, candidate: str, n: int) -> list[dict[str, Any]]:
    """``n`` releases, each serving one model ``model-<i>``, all on the same backends."""
    return [
        table_doc(stable, candidate, release=f"release-{i}", models=[f"model-{i}"], default_weight=50)
        for i in range(n)
    ]


def classify_us() -> float:
    """Median microseconds to classify a ~4k-token chat request (body parse included)."""
    from tinct.api.routing import RoutingTable
    from tinct.router.classify import CHAT_PATH, classify
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


async def _sse_backend(port: int, chunks: int, go: asyncio.Event | None, sent: dict[int, float]) -> Any:
    """An SSE backend on ``port``: ``chunks`` token events, each after ``go`` (or at once),
    stamped when written (the relay delay needs the exact write time, which an emulated
    engine's schedule does not give)."""
    from aiohttp import web

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

    app = web.Application()
    app.router.add_post("/v1/chat/completions", sse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def _chunk_relay_delays(
    router_ports: dict[str, int], backend_port: int, chunks: int, rounds: int
) -> dict[str, list[float]]:
    """ms from the SSE backend's write of a chunk to the client's read of it, via each router,
    in alternating rounds of ``chunks`` chunks (a change in load falls on every router alike)."""
    import aiohttp

    sent: dict[int, float] = {}
    go = asyncio.Event()
    runner = await _sse_backend(backend_port, chunks, go, sent)
    delays: dict[str, list[float]] = {name: [] for name in router_ports}
    try:
        body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            for _ in range(rounds):
                for name, port in router_ports.items():
                    sent.clear()
                    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                        for i in range(chunks):
                            await asyncio.sleep(0.01)
                            go.set()
                            line = await r.content.readline()
                            got = time.perf_counter()
                            assert line == _event(i)[:-1], line
                            await r.content.readline()
                            delays[name].append((got - sent[i]) * 1000)
                        await r.read()
    finally:
        await runner.cleanup()
    return delays


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
    args = ap.parse_args()
    _ensure_tools()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="tinct-bench-router-"))
    try:
        trivial_lua = tmp / "trivial.lua"
        trivial_lua.write_text(_lua(REQUEST, sessions=False))
        real_lua = tmp / "realistic.lua"
        real_lua.write_text(_lua(realistic_request(), sessions=True))
        backend, proxy, router, router50, sse_router, sse_backend = (free_port() for _ in range(6))
        answer = ANSWER.replace("'", "\\'")
        _start_nginx(
            tmp,
            "backend",
            f"""  server {{
    listen 127.0.0.1:{backend};
    client_body_buffer_size 64k;
    location / {{ default_type application/json; return 200 '{answer}'; }}
  }}""",
            backend,
            procs,
        )
        _start_nginx(
            tmp,
            "proxy",
            f"""  upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{proxy};
    client_body_buffer_size 64k;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}""",
            proxy,
            procs,
        )
        stable_url, candidate_url = f"http://127.0.0.1:{backend}", f"http://localhost:{backend}"
        _start_router(tmp, _table(stable_url, candidate_url, 0), router, procs)
        _start_router(tmp, _table(stable_url, candidate_url, 50), router50, procs)
        path = "/v1/chat/completions"
        runs: dict[str, dict[str, float]] = {}
        for name, port, lua in (
            ("direct", backend, trivial_lua),
            ("nginx", proxy, trivial_lua),
            ("real_direct", backend, real_lua),
            ("real_nginx", proxy, real_lua),
            ("real_router", router50, real_lua),
        ):
            runs[name] = _wrk(f"http://127.0.0.1:{port}{path}", lua, args.duration, args.connections)
            print(f"{name:>11}: {runs[name]}", file=sys.stderr)
        # The plain router against one mirroring 10 %, alternating: a change in load falls
        # on both alike.
        receiver = _Receiver()
        try:
            shadow_router = free_port()
            _start_router(
                tmp,
                _shadow_table(stable_url, candidate_url),
                shadow_router,
                procs,
                "--comparer",
                receiver.rx.url,
            )
            shadow_lua = tmp / "shadow.lua"
            shadow_lua.write_text(_lua(REQUEST, sessions=True))
            shadow_rounds: dict[str, list[dict[str, float]]] = {"router": [], "shadow_live": []}
            for _ in range(3):
                for name, port, lua in (
                    ("router", router, trivial_lua),
                    ("shadow_live", shadow_router, shadow_lua),
                ):
                    got = _wrk(f"http://127.0.0.1:{port}{path}", lua, args.duration, args.connections)
                    shadow_rounds[name].append(got)
                    print(f"{name:>11}: {got}", file=sys.stderr)
            for name, got_rounds in shadow_rounds.items():  # one disturbed round does not decide
                runs[name] = {k: statistics.median(r[k] for r in got_rounds) for k in ("rps", "p50", "p99")}
            mirrors = _counter(shadow_router, "tinct_router_shadow_mirrors_total")
            deadline = time.monotonic() + 10
            while receiver.received < mirrors and time.monotonic() < deadline:
                time.sleep(0.1)  # the last batches (250 ms apart at most)
            shadow_pairs = receiver.received
            print(f"shadow run: {mirrors:.0f} mirrored, {shadow_pairs} pairs received", file=sys.stderr)
        finally:
            receiver.stop()
        # One table vs a hundred: the request's model picks its table among them.
        one_table, hundred_tables = free_port(), free_port()
        _start_router(tmp, _release_tables(stable_url, candidate_url, 100)[57:58], one_table, procs)
        _start_router(tmp, _release_tables(stable_url, candidate_url, 100), hundred_tables, procs)
        model_lua = tmp / "model.lua"
        model_lua.write_text(_lua(REQUEST.replace('"bench"', '"model-57"'), sessions=True))
        # Alternating rounds, as for the workers below: a change in load falls on both alike.
        table_rounds: dict[str, list[dict[str, float]]] = {"tables_1": [], "tables_100": []}
        for _ in range(2):
            for name, port in (("tables_1", one_table), ("tables_100", hundred_tables)):
                got = _wrk(f"http://127.0.0.1:{port}{path}", model_lua, args.duration, args.connections)
                table_rounds[name].append(got)
                print(f"{name:>11}: {got}", file=sys.stderr)
        for name, got_rounds in table_rounds.items():
            runs[name] = {k: statistics.mean(r[k] for r in got_rounds) for k in ("rps", "p50", "p99")}
        # One worker against two (SO_REUSEPORT), same table, same request, same connections;
        # the runs alternate so a change in the machine's load falls on both alike.
        worker_urls: dict[int, str] = {}
        for n in (1, 2):
            port, metrics_port = free_port(), free_port()
            _start_router(
                tmp,
                _table(stable_url, candidate_url, 0),
                port,
                procs,
                "--workers",
                str(n),
                "--metrics-port",
                str(metrics_port),
            )
            _wait_ready(metrics_port, procs[-1])
            worker_urls[n] = f"http://127.0.0.1:{port}{path}"
        rounds: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        for _ in range(2):
            for n in (1, 2):
                rounds[n].append(_wrk(worker_urls[n], trivial_lua, args.duration, args.worker_connections))
                print(f"  workers_{n}: {rounds[n][-1]}", file=sys.stderr)
        for n in (1, 2):
            runs[f"workers_{n}"] = {
                k: statistics.mean(r[k] for r in rounds[n]) for k in ("rps", "p50", "p99")
            }
        share = _candidate_share(router50)
        print(f"realistic run: candidate answered {share:.1%} of the routed requests", file=sys.stderr)

        us = classify_us()
        print(f"classify 4k-token chat: {us:.1f} us", file=sys.stderr)

        sse_table = _table(f"http://127.0.0.1:{sse_backend}", f"http://localhost:{sse_backend}")
        _start_router(tmp, sse_table, sse_router, procs)
        unmeasured_router = free_port()
        _start_router(tmp, sse_table, unmeasured_router, procs, "--no-token-metrics")
        relay = asyncio.run(
            _chunk_relay_delays(
                {"measured": sse_router, "unmeasured": unmeasured_router}, sse_backend, 100, 3
            )
        )
        for name, delays in relay.items():
            print(
                f"SSE chunk backend write -> client read via router ({name} tokens): median "
                f"{statistics.median(delays):.3f} ms, max {max(delays):.3f} ms",
                file=sys.stderr,
            )
        ttfc = asyncio.run(
            _time_to_first_chunk({"router": sse_router, "direct": sse_backend}, sse_backend, 50)
        )
        print(f"time to first SSE chunk (median of 50): {ttfc}", file=sys.stderr)
        trivial = {name: runs[name] for name in ("direct", "nginx", "router")}
        real = {name: runs[f"real_{name}"] for name in ("direct", "nginx", "router")}
        summary = {
            **{f"{name}_rps": round(run["rps"], 1) for name, run in trivial.items()},
            "router_vs_nginx": round(trivial["router"]["rps"] / trivial["nginx"]["rps"], 3),
            **{f"{name}_{q}_ms": round(run[q], 3) for q in ("p50", "p99") for name, run in trivial.items()},
            **{f"realistic_{name}_rps": round(run["rps"], 1) for name, run in real.items()},
            "realistic_router_vs_nginx": round(real["router"]["rps"] / real["nginx"]["rps"], 3),
            **{f"realistic_{name}_p99_ms": round(real[name]["p99"], 3) for name in ("nginx", "router")},
            "shadow_live_rps": round(runs["shadow_live"]["rps"], 1),
            "shadow_live_p50_ms": round(runs["shadow_live"]["p50"], 3),
            "shadow_live_p99_ms": round(runs["shadow_live"]["p99"], 3),
            "shadow_pairs": shadow_pairs,
            "shadow_mirrors": round(mirrors),
            "realistic_candidate_share": round(share, 3),
            "rps_1_table": round(runs["tables_1"]["rps"], 1),
            "rps_100_tables": round(runs["tables_100"]["rps"], 1),
            "rps_100_tables_vs_1": round(runs["tables_100"]["rps"] / runs["tables_1"]["rps"], 3),
            "router_1_worker_rps": round(runs["workers_1"]["rps"], 1),
            "router_workers_rps": round(runs["workers_2"]["rps"], 1),
            "workers_speedup": round(runs["workers_2"]["rps"] / runs["workers_1"]["rps"], 3),
            "classify_us_4k_tokens": round(us, 2),
            "time_to_first_chunk_ms": round(ttfc["router"], 3),
            "time_to_first_chunk_direct_ms": round(ttfc["direct"], 3),
            "chunk_relay_delay_median_ms": round(statistics.median(relay["measured"]), 3),
            "chunk_relay_delay_median_ms_unmeasured": round(statistics.median(relay["unmeasured"]), 3),
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:  # all told to stop first: they stop together
            terminate(p, 10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
