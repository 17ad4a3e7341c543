"""Traffic for the release tests: a `tinct router --watch` process, requests per dye cell,
and a steady background load so every analysis window has data."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from router_fakes import free_port


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
def router(namespace: str, log: Path, release: str | None = None) -> Iterator[Router]:
    """`tinct router --watch` on a free port, believing the role header from loopback;
    with ``release``, it follows only that release's table."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tinct.cli",
        "router",
        "--watch",
        "--namespace",
        namespace,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--trust-role-from",
        "127.0.0.1/32",
        # The tests' schedulers listen on loopback: tables may name it by the allow-list.
        "--allow-backend",
        "127.0.0.1",
    ]
    if release:
        argv += ["--selector", f"tinct.io/routing-table=true,tinct.io/release={release}"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the router exited: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError("the router did not start") from None
                    time.sleep(0.2)
            yield Router(port, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Background:
    """Steady requests over ``cells`` from a thread, until stopped; counts what answered."""

    port: int
    cells: list[CellTraffic]
    pause: float = 0.01
    answered: dict[tuple[str, str], int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            cell = self.cells[i % len(self.cells)]
            try:
                side, reason = ask(self.port, cell, f"bg-{i}")
            except (OSError, http.client.HTTPException):
                side, reason = "error", "-"
            key = (side, reason)
            self.answered[key] = self.answered.get(key, 0) + 1
            i += 1
            self._stop.wait(self.pause)

    def __enter__(self) -> Background:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
