"""Hostile and instrumented backends and helpers shared by the router tests (unit and k8s).

A :class:`FakeScheduler` is a real aiohttp server on 127.0.0.1 that answers OpenAI-style
requests, records every request it saw (headers, body, peer), and can be told to fail (5xx),
reject the scheduler version (426), stall before answering, or stream SSE one event per
``gate`` release so a test can observe the ordering of chunk arrival without clocks; a
:class:`HostileBackend` answers whatever bytes a test writes. Tests that need an LLM engine
rather than these exact behaviours use the emulator (:mod:`tinct_testing.engines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
from aiohttp import web

from tinct.api.routing import RoutingTable, routing_configmap
from tinct.router.app import Router
from tinct.router.config import RouterConfig
from tinct.router.table import TableHolder
from tinct_testing import commands
from tinct_testing.controlplane.harness import Cluster, free_port
from tinct_testing.wait import eventually_async

#: The smallest chat completion request a fake answers.
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    #: The router's end of the connection the request came on (host, port).
    peer: tuple[str, int] | None = None
    #: Every header line as received, repeated names included.
    items: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class FakeScheduler:
    version: str
    #: ok | error | mismatch | stall | gated | die (one SSE event, then the connection drops)
    #: | hang (one SSE event, then silence with the connection open until release_stall)
    mode: str = "ok"
    seen: list[Seen] = field(default_factory=list)
    release_stall: asyncio.Event = field(default_factory=asyncio.Event)
    #: gated SSE: the server sends event i+1 only after gate is set by the test (then cleared).
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    stream_done: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    #: Called with each request as it is seen, before the answer (e.g. to move a test clock).
    on_request: Callable[[], None] | None = None
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.seen.append(
            Seen(
                request.path,
                request.method,
                dict(request.headers),
                body,
                tuple(peer) if peer else None,
                list(request.headers.items()),
            )
        )
        if self.on_request is not None:
            self.on_request()
        if self.mode == "error":
            return web.json_response({"error": {"message": f"{self.version} broke"}}, status=503)
        if self.mode == "mismatch":
            return web.json_response({"error": {"message": "scheduler version not supported"}}, status=426)
        if self.mode == "stall":
            await self.release_stall.wait()
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": self.version, "object": "model"}]})
        if request.path not in ("/v1/chat/completions", "/v1/completions"):
            return web.json_response({"path": request.path, "bytes": len(body), "served_by": self.version})
        doc = json.loads(body) if body else {}
        if doc.get("stream"):
            return await self._sse(request, doc)
        return web.json_response(self._completion(request.path, doc), headers={"X-Served-By": self.version})

    def _completion(self, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        text = f"hello from {self.version}"
        usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        if path == "/v1/completions":
            return {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": self.version,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                "usage": usage,
            }
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": self.version,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }

    async def _sse(self, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        words = ["hello", " from", f" {self.version}"]
        for i, w in enumerate(words):
            if self.mode == "gated" and i > 0:
                await self.gate.wait()
                self.gate.clear()
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": self.version,
                "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.mode == "die":
                assert request.transport is not None
                request.transport.close()
                return resp
            if self.mode == "hang":
                await self.release_stall.wait()
                return resp
        await resp.write(b"data: [DONE]\n\n")
        self.stream_done.set()
        await resp.write_eof()
        return resp

    async def start(self) -> FakeScheduler:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.release_stall.set()
        self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def ungate(self, content: aiohttp.StreamReader) -> list[bytes]:
        """Let a ``gated`` answer run to its end, opening the gate for each event read from
        ``content`` (the client's side of it): the lines read."""
        lines: list[bytes] = []
        self.gate.set()
        async for line in content:
            lines.append(line)
            if line.startswith(b"data: "):
                self.gate.set()
        return lines

    def reset(self, mode: str = "ok") -> None:
        self.mode = mode
        self.seen.clear()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The body of the next request on ``reader`` (its head read, its ``Content-Length`` body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


async def raw_server(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, str]:
    """An asyncio server on 127.0.0.1 running ``serve`` per connection, and its base URL."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def stop_raw_server(server: asyncio.Server | None) -> None:
    if server is not None:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


class RawBackend:
    """A raw asyncio server on 127.0.0.1 at ``url`` once started, running :meth:`_serve` per
    connection; a subclass says how it answers."""

    url: str
    _server: asyncio.Server | None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        self._server, self.url = await raw_server(self._serve)
        return self

    async def stop(self) -> None:
        await stop_raw_server(self._server)


@dataclass
class HostileBackend(RawBackend):
    """A raw asyncio server on 127.0.0.1 that reads each request (head and a
    ``Content-Length`` body) and answers with whatever ``answer`` writes, framing or not."""

    answer: Callable[[asyncio.StreamWriter], Awaitable[None]]
    url: str = ""
    requests: int = 0
    _server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            self.requests += 1
            await self.answer(writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the router hung up on it: what a hostile backend gets
        finally:
            writer.close()


def table_doc(
    stable: str,
    candidate: str,
    *,
    version: int = 1,
    default_weight: float = 0,
    cells: list[dict[str, Any]] | None = None,
    fallback: dict[str, Any] | None = None,
    release: str = "chat",
    models: list[str] | None = None,
    namespace: str | None = "llm",
    uid: str | None = None,
    standing: bool = False,
    default_shadow: float = 0,
    shadow: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A routing-table document in wire form (camelCase), shaped like examples/grayrelease.yaml.

    ``default_shadow`` is the default cell's shadow share; ``shadow`` the table's shadow
    settings (camelCase, over the API's defaults), needed for any cell to mirror."""
    doc = {
        "models": models or [],
        "schema": "tinct.io/routing/v1",
        "release": release,
        "namespace": namespace,
        "uid": uid,
        "standing": standing,
        "version": version,
        "state": "Progressing",
        "step": 1,
        "stable": {"url": stable, "schedulerVersion": "v1", "modelVersion": "llama3-8b-1-4-0"},
        "candidate": {"url": candidate, "schedulerVersion": "v2", "modelVersion": "llama3-8b-2-0-0"},
        "dye": {
            "promptLength": {
                "buckets": [
                    {"name": "short", "maxTokens": 512},
                    {"name": "medium", "maxTokens": 4096},
                    {"name": "long"},
                ],
                "charsPerToken": 4,
            },
            "role": {"header": "X-User-Role", "values": ["user", "admin", "audit"], "default": "user"},
            "latency": {
                "header": "X-Latency-Class",
                "values": ["low", "high"],
                "default": "low",
                "streamClass": "high",
            },
            "stickyKey": {"header": "X-Session-Id"},
        },
        "cells": [*(cells or []), {"match": {}, "weight": default_weight, "shadow": default_shadow}],
        "fallback": fallback or {"consecutiveFailures": 3, "latencyMs": 800, "cooldownSeconds": 30},
    }
    if shadow is not None:
        doc["shadow"] = {
            "stableModelVersion": "llama3-8b-1-4-0",
            "candidateModelVersion": "llama3-8b-2-0-0",
            **shadow,
        }
    return doc


@dataclass
class PairReceiver:
    """Stands in for ``tinct comparer``'s ``POST /v1/pairs``: a real aiohttp server on
    127.0.0.1 that checks the bearer token (401 without it when ``token`` is set) and keeps
    every pair it is sent (parsed), and every batch's size."""

    token: str | None = None
    #: Parse and keep the pairs; False: count them only (``received``), as a benchmark does.
    keep: bool = True
    pairs: list[dict[str, Any]] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    received: int = 0
    #: Requests refused for their token.
    unauthorized: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def _handle(self, request: web.Request) -> web.Response:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            return web.json_response({"error": "a bearer token is needed"}, status=401)
        assert request.content_type == "application/x-ndjson", request.content_type
        body = await request.read()
        if not self.keep:
            self.received += body.count(b"\n")
            return web.json_response({"accepted": body.count(b"\n"), "refused": 0}, status=202)
        lines = [line for line in body.split(b"\n") if line.strip()]
        self.pairs.extend(json.loads(line) for line in lines)
        self.received += len(lines)
        self.batches.append(len(lines))
        self._arrived.set()
        return web.json_response({"accepted": len(lines), "refused": 0}, status=202)

    async def wait_for(self, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The pairs once at least ``n`` arrived."""
        async with asyncio.timeout(timeout):
            while len(self.pairs) < n:
                self._arrived.clear()
                await self._arrived.wait()
        return self.pairs

    async def start(self, port: int = 0) -> PairReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/pairs", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def table(stable: str, candidate: str, **kw: Any) -> RoutingTable:
    return RoutingTable.model_validate(table_doc(stable, candidate, **kw))


#: /proc/net/tcp state codes
ESTABLISHED = "01"
CLOSE_WAIT = "08"


@dataclass
class RouterProcess:
    """A ``tinct router`` process started by :func:`router_process`."""

    proc: asyncio.subprocess.Process
    port: int
    base: str
    stderr: bytearray
    #: Base URL of /metrics, /healthz, /readyz (the proxy's own without --metrics-port).
    local: str = ""

    def rss(self) -> int:
        """Resident memory of the process, in bytes."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def connections_to(self, port: int, states: tuple[str, ...] = (ESTABLISHED,)) -> int:
        """The router's own TCP connections to 127.0.0.1:``port`` in ``states`` (kernel state
        codes of /proc/net/tcp; established by default), its worker processes' included.
        Sockets are matched by inode to the process tree's descriptors, so a connection some
        other process makes to the same port is never counted; each is counted once, from a
        consistent view of the kernel's table (:func:`_tcp_sockets`)."""
        mine = _socket_inodes(self.proc.pid)
        return sum(1 for remote, state in _tcp_sockets(mine).values() if state in states and remote == port)


#: Reads of /proc/net/tcp before the last one is taken as it is.
TCP_READS = 50


def _tcp_sockets(inodes: set[str]) -> dict[str, tuple[int, str]]:
    """Remote port and state of each socket of ``inodes`` in /proc/net/tcp, by inode.

    The kernel writes that table a page at a time while sockets come and go, so one read can
    list a socket twice or not at all: with a benchmark opening and closing connections beside
    it, one read of 2,500 lines listed 57 sockets twice, and a test counting a router's twelve
    connections once read 136. Each socket is kept once (by its inode), and the table is read
    again until two reads in a row agree on these sockets."""
    last: dict[str, tuple[int, str]] | None = None
    for _ in range(TCP_READS):
        now: dict[str, tuple[int, str]] = {}
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                now[fields[9]] = (int(fields[2].rsplit(":", 1)[1], 16), fields[3])
        if now == last:
            break
        last = now
    assert last is not None
    return last


def _socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets held by ``pid`` and its descendants."""
    inodes: set[str] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for fd in os.scandir(f"/proc/{p}/fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
            for task in os.scandir(f"/proc/{p}/task"):
                with open(f"{task.path}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue  # the process ended meanwhile
    return inodes


async def _wait_ready(base: str, proc: asyncio.subprocess.Process, wait: float) -> None:
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            if proc.returncode is not None:
                raise RuntimeError(f"the router exited with code {proc.returncode}")
            try:
                async with http.get(f"{base}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await eventually_async(ready, timeout=wait, interval=0.05, what="the router ready (/readyz)")


def router_argv(table_file: str, port: int, *args: str) -> list[str]:
    """The argv of ``tinct router --table FILE`` listening on 127.0.0.1:``port``."""
    return commands.router_argv(port, "--table", table_file, *args)


@contextlib.asynccontextmanager
async def router_process(
    table_file: str, *args: str, wait: float = 60.0, metrics_port: int | None = None
) -> AsyncIterator[RouterProcess]:
    """``tinct router --table FILE`` as a child process on 127.0.0.1, ready; its stderr collected."""
    port = free_port()
    if metrics_port is not None:
        args = (*args, "--metrics-port", str(metrics_port))
    proc = await asyncio.create_subprocess_exec(
        *router_argv(table_file, port, *args), stderr=asyncio.subprocess.PIPE
    )
    err = bytearray()

    async def collect() -> None:
        assert proc.stderr is not None
        while data := await proc.stderr.read(65536):
            err.extend(data)

    reader = asyncio.create_task(collect())
    base = f"http://127.0.0.1:{port}"
    local = f"http://127.0.0.1:{metrics_port}" if metrics_port is not None else base
    try:
        await _wait_ready(local, proc, wait)
        yield RouterProcess(proc, port, base, err, local)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader


#: Seconds a router watching the API server gets to take a table: an upper bound, never a
#: measured figure.
WATCH_WAIT = 60.0


@contextlib.asynccontextmanager
async def watching_router(
    namespace: str, kubeconfig: Path
) -> AsyncIterator[tuple[str, TableHolder, aiohttp.ClientSession]]:
    """A router watching ``namespace``'s routing tables as ``kubeconfig``: its base URL, its
    table holder and a client. The fake schedulers listen on loopback, which tables may name
    only by the allow-list: it allows loopback."""
    cfg = RouterConfig(
        watch=True, namespace=namespace, kubeconfig=kubeconfig, allow_backends=("127.0.0.1/32",)
    )
    async with running_router(None, cfg) as (base, router), aiohttp.ClientSession() as http:
        yield base, router.state.holder, http


def apply_table(cluster: Cluster, namespace: str, configmap: dict[str, Any]) -> None:
    """A routing table's ConfigMap (:func:`~tinct.api.routing.routing_configmap`) in ``namespace``."""
    configmap["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=json.dumps(configmap))


async def publish(cluster: Cluster, namespace: str, holder: TableHolder, tbl: RoutingTable) -> None:
    """``tbl`` applied as its ConfigMap, once the watching router has it in force."""
    apply_table(cluster, namespace, routing_configmap(tbl))

    def in_force() -> bool:
        return holder.current is not None and holder.current.version == tbl.version

    await eventually_async(in_force, timeout=WATCH_WAIT, interval=0.05, what=f"table v{tbl.version}")


async def side(http: aiohttp.ClientSession, base: str) -> str:
    """The scheduler that answers a chat completion of session ``s-1`` (X-Scheduler-Active)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers={"X-Session-Id": "s-1"}) as r:
        assert r.status == 200
        return r.headers["X-Scheduler-Active"]


@contextlib.asynccontextmanager
async def running_router(
    tbl: RoutingTable | None, config: RouterConfig | None = None
) -> AsyncIterator[tuple[str, Router]]:
    """The router served on 127.0.0.1 with ``tbl`` in force; yields (base URL, router)."""
    holder = TableHolder()
    # The tests' clients are on loopback and play the trusted gateway that sets the role.
    cfg = dataclasses.replace(
        config or RouterConfig(trust_role_from=("127.0.0.1/32",)),
        host="127.0.0.1",
        port=0,
        shutdown_timeout=5,
    )
    router = Router(cfg, holder)
    await router.start()
    if tbl is not None:
        holder.swap(tbl, "test")
    try:
        yield f"http://127.0.0.1:{router.port}", router
    finally:
        await router.stop()
