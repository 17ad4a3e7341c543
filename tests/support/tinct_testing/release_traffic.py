"""Traffic for the release tests: a `tinct router --watch` process, requests per dye cell,
and a steady background load so every analysis window has data."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinct_testing.commands import router_argv
from tinct_testing.controlplane.harness import free_port
from tinct_testing.controlplane.process import http_ok, spawned, wait_ready
from tinct_testing.repeat import Repeating


@dataclass(frozen=True)
class CellTraffic:
    """Requests of one dye cell: the role and latency headers and a prompt of ``words``."""

    role: str
    latency: str
    words: int
    stream: bool = False
    model: str = "llama3-8b"

    def body(self) -> bytes:
        prompt = "tell me about dye tags " * self.words
        doc: dict[str, object] = {"model": self.model, "messages": [{"role": "user", "content": prompt}]}
        if self.stream:
            doc["stream"] = True
        return json.dumps(doc).encode()


LONG_ADMIN_HIGH = CellTraffic("admin", "high", 1200)  # ~5,500 tokens: the `long` bucket
MEDIUM_AUDIT_LOW = CellTraffic("audit", "low", 300)  # the default cell
STREAMED = CellTraffic("audit", "low", 300, stream=True)  # the default cell, answered as SSE
LONG_ADMIN_HIGH_STREAMED = CellTraffic("admin", "high", 1200, stream=True)  # the long cell, as SSE


@dataclass(frozen=True)
class Answer:
    """What a chat completion got back."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.body or b"{}")
        return doc


def complete(
    port: int,
    model: str,
    session: str | None = None,
    *,
    host: str = "127.0.0.1",
    prompt: str = "hi",
    timeout: float = 30.0,
) -> Answer:
    """One chat completion for ``model`` to ``host:port`` on a new connection (``session``: its
    X-Session-Id)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]})
    headers = {"Content-Type": "application/json", **({"X-Session-Id": session} if session else {})}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def ask(
    port: int, cell: CellTraffic, session: str, conn: http.client.HTTPConnection | None = None
) -> tuple[str, str]:
    """One chat completion through the router: (X-Scheduler-Active, X-Fallback-Reason or '-')."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {
        "Content-Type": "application/json",
        "X-Session-Id": session,
        "X-User-Role": cell.role,
        "X-Latency-Class": cell.latency,
    }
    try:
        c.request("POST", "/v1/chat/completions", body=cell.body(), headers=headers)
        resp = c.getresponse()
        side = resp.getheader("X-Scheduler-Active", "?")
        try:
            resp.read()
        except http.client.IncompleteRead:
            return side, "truncated"  # the answer was cut after its headers
        return side, resp.getheader("X-Fallback-Reason", "-")
    finally:
        if conn is None:
            c.close()


def burst(port: int, cell: CellTraffic, prefix: str, n: int) -> dict[str, str]:
    """``n`` sessions of ``cell``: session -> the side that answered."""
    out: dict[str, str] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for i in range(n):
            session = f"{prefix}-{i}"
            out[session] = ask(port, cell, session, conn)[0]
    finally:
        conn.close()
    return out


@dataclass
class Router:
    port: int
    proc: subprocess.Popen[bytes]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text: str = r.read().decode()
            return text

    def table_version(self, release: str = "chat") -> int | None:
        m = re.search(
            rf'^tinct_router_table_version{{namespace="[^"]*",release="{release}"}} ([0-9.e+]+)$',
            self.metrics(),
            re.M,
        )
        return int(float(m.group(1))) if m else None


@contextmanager
def router(
    namespace: str,
    log: Path,
    release: str | None = None,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> Iterator[Router]:
    """`tinct router --watch` on a free port, believing the role header from loopback, once it
    serves; with ``release``, it follows only that release's table. ``env``: its environment
    (default: this process'); ``extra``: more of its arguments."""
    port = free_port()
    argv = router_argv(
        port,
        "--watch",
        "--namespace",
        namespace,
        "--trust-role-from",
        "127.0.0.1/32",
        # The tests' schedulers listen on loopback: tables may name it by the allow-list.
        "--allow-backend",
        "127.0.0.1",
    )
    if release:
        argv += ["--selector", f"tinct.io/routing-table=true,tinct.io/release={release}"]
    argv += list(extra)
    with spawned(argv, log, env) as proc:
        metrics = f"http://127.0.0.1:{port}/metrics"
        wait_ready("the router", lambda: http_ok(metrics), proc, time.monotonic() + 60, log=log)
        yield Router(port, proc)


@dataclass
class Background(Repeating):
    """Steady requests over ``cells`` from a thread for the block; counts what answered."""

    port: int
    cells: list[CellTraffic]
    pause: float = 0.01

    def step(self, worker: int, i: int) -> None:
        cell = self.cells[i % len(self.cells)]
        try:
            side, reason = ask(self.port, cell, f"bg-{i}")
        except (OSError, http.client.HTTPException):
            side, reason = "error", "-"
        self.tally((side, reason))

    @property
    def answered(self) -> Counter[object]:
        """(X-Scheduler-Active, X-Fallback-Reason) of each answer, counted; ("error", "-"): none."""
        return self.outcomes
