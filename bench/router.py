"""Benchmark of the dye router against nginx, side by side on this machine.

wrk (one thread, 8 connections) posts a chat request to a fixed-answer nginx backend:

- directly,
- through nginx as a reverse proxy (1 worker, upstream keep-alive),
- through ``tinct router`` (1 process, table from a file, every cell on stable).

Then, in process: the time to classify a 4k-token chat request, and how long an SSE chunk
takes from the backend's write to the client's read through the router.

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


def _ensure_tools() -> None:
    missing = [p for p, b in (("wrk", "wrk"), ("nginx", "nginx")) if shutil.which(b) is None]
    if not missing:
        return
    print(f"installing {' '.join(missing)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


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


def _table(stable: str, candidate: str) -> dict[str, Any]:
    return {
        "schema": "tinct.io/routing/v1",
        "release": "bench",
        "version": 1,
        "state": "Progressing",
        "step": 0,
        "stable": {"url": stable, "schedulerVersion": "v1"},
        "candidate": {"url": candidate, "schedulerVersion": "v2"},
        "dye": {
            "promptLength": {
                "buckets": [
                    {"name": "short", "maxTokens": 512},
                    {"name": "medium", "maxTokens": 4096},
                    {"name": "long"},
                ]
            },
            "role": {"header": "X-User-Role", "values": ["user", "admin", "audit"], "default": "user"},
            "latency": {
                "header": "X-Latency-Class",
                "values": ["low", "high"],
                "default": "low",
                "streamClass": "high",
            },
        },
        "cells": [
            {"match": {"promptLength": "long", "role": "admin", "latency": "high"}, "weight": 0},
            {"match": {}, "weight": 0},
        ],
    }


def _start_router(tmp: Path, table: dict[str, Any], port: int, procs: list[subprocess.Popen[bytes]]) -> None:
    f = tmp / f"table-{port}.json"
    f.write_text(json.dumps(table))
    argv = [sys.executable, "-m", "tinct.cli", "router", "--table", str(f), "--host", "127.0.0.1"]
    p = subprocess.Popen([*argv, "--port", str(port), "--log-level", "warning"])
    procs.append(p)
    _wait_port(port, p, "tinct router")


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


async def _first_chunk_delays(router_port: int, backend_port: int, chunks: int) -> list[float]:
    """ms from the SSE backend's write of a chunk to the client's read of it, via the router."""
    import aiohttp
    from aiohttp import web

    sent: dict[int, float] = {}
    go = asyncio.Event()

    async def sse(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            await go.wait()
            go.clear()
            sent[i] = time.perf_counter()
            await resp.write(f"data: {i}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", sse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", backend_port).start()
    delays: list[float] = []
    try:
        body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{router_port}/v1/chat/completions", json=body) as r,
        ):
            for i in range(chunks):
                await asyncio.sleep(0.01)
                go.set()
                line = await r.content.readline()
                got = time.perf_counter()
                assert line == f"data: {i}\n".encode(), line
                await r.content.readline()
                delays.append((got - sent[i]) * 1000)
    finally:
        await runner.cleanup()
    return delays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default: %(default)s)")
    ap.add_argument("--connections", type=int, default=8, help="wrk connections (default: %(default)s)")
    args = ap.parse_args()
    _ensure_tools()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="tinct-bench-router-"))
    try:
        script = tmp / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(REQUEST)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            'wrk.headers["X-Session-Id"] = "bench"\n'
        )
        backend, proxy, router, sse_router, sse_backend = (_port() for _ in range(5))
        answer = ANSWER.replace("'", "\\'")
        _start_nginx(
            tmp,
            "backend",
            f"""  server {{
    listen 127.0.0.1:{backend};
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
        _start_router(
            tmp, _table(f"http://127.0.0.1:{backend}", f"http://localhost:{backend}"), router, procs
        )
        path = "/v1/chat/completions"
        runs = {}
        for name, port in (("direct", backend), ("nginx", proxy), ("router", router)):
            runs[name] = _wrk(f"http://127.0.0.1:{port}{path}", script, args.duration, args.connections)
            print(f"{name:>7}: {runs[name]}", file=sys.stderr)

        us = classify_us()
        print(f"classify 4k-token chat: {us:.1f} us", file=sys.stderr)

        sse_table = _table(f"http://127.0.0.1:{sse_backend}", f"http://localhost:{sse_backend}")
        _start_router(tmp, sse_table, sse_router, procs)
        delays = asyncio.run(_first_chunk_delays(sse_router, sse_backend, 100))
        print(
            f"SSE chunk backend write -> client read via router: median {statistics.median(delays):.3f} ms, "
            f"max {max(delays):.3f} ms",
            file=sys.stderr,
        )
        d, n, r = runs["direct"], runs["nginx"], runs["router"]
        summary = {
            "direct_rps": round(d["rps"], 1),
            "nginx_rps": round(n["rps"], 1),
            "router_rps": round(r["rps"], 1),
            "router_vs_nginx": round(r["rps"] / n["rps"], 3),
            "router_added_p50_ms": round(r["p50"] - d["p50"], 3),
            "router_added_p99_ms": round(r["p99"] - d["p99"], 3),
            "classify_us_4k_tokens": round(us, 2),
            "first_chunk_delay_ms": round(statistics.median(delays), 3),
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
