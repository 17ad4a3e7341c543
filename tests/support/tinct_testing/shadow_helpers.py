"""Pairs made of real answers, a small OpenAI-compatible judge, and a comparer process, for
the comparer's tests.

:func:`mirror` does what a router does for one mirrored request: the same body to stable
and to the candidate (or to stable twice, for the noise floor), both answers kept byte for
byte, as one pair line of ``POST /v1/pairs``. :class:`JudgeServer` answers the judge's
questions as a test tells it to: agree, disagree, depend on which answer it reads first,
be unsure, be slow, or fail. :func:`comparer` runs ``tinct comparer --watch`` as a process and
:class:`PairPump` feeds it pairs from a thread, as routers would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from tinct.api.routing import RoutingTable

TAG = "len:short+role:user+latency:low"


async def _answer(http: aiohttp.ClientSession, url: str, path: str, body: bytes) -> dict[str, Any]:
    started = time.monotonic()
    headers = {"Content-Type": "application/json", "X-Tinct-Shadow": "1"}
    async with http.post(url + path, data=body, headers=headers) as r:
        raw = await r.read()
        return {
            "status": r.status,
            "content_type": r.headers.get("Content-Type", ""),
            "body_b64": base64.b64encode(raw).decode(),
            "truncated": False,
            "ms": (time.monotonic() - started) * 1000,
            "error": None,
        }


async def mirror(
    http: aiohttp.ClientSession,
    stable: str,
    candidate: str,
    request: dict[str, Any],
    *,
    target: str = "candidate",
    release: str = "chat",
    namespace: str = "llm",
    uid: str = "uid-1",
    dye_tag: str = TAG,
    path: str = "/v1/chat/completions",
) -> dict[str, Any]:
    """One pair: ``request`` answered by ``stable`` and by ``candidate`` (``stable`` again
    for ``target="stable"``), concurrently."""
    body = json.dumps(request).encode()
    other = stable if target == "stable" else candidate
    a, b = await asyncio.gather(_answer(http, stable, path, body), _answer(http, other, path, body))
    return {
        "v": 1, "namespace": namespace, "release": release, "uid": uid, "table_version": 1,
        "dye_tag": dye_tag, "target": target, "time": time.time(),
        "request": {"path": path, "body": body.decode(), "prompt_tokens": len(body) // 4},
        "stable": a, "candidate": b,
    }  # fmt: skip


async def post_pairs(
    http: aiohttp.ClientSession, comparer: str, pairs: list[dict[str, Any]], token: str | None
) -> tuple[int, dict[str, Any]]:
    """POST ``pairs`` as NDJSON; the status and the JSON answer."""
    headers = {"Content-Type": "application/x-ndjson"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = b"".join(json.dumps(p).encode() + b"\n" for p in pairs)
    async with http.post(f"{comparer}/v1/pairs", data=data, headers=headers) as r:
        return r.status, await r.json()


@dataclass
class JudgeServer:
    """An OpenAI-compatible chat endpoint that judges as ``mode`` says.

    ``match`` / ``mismatch``: that, confidently; ``first``: a match only when answer A is
    stable's (it says whatever favours the first answer: swapped orders disagree);
    ``unsure``: a match at confidence 0.5; ``slow``: waits ``delay`` seconds first;
    ``broken``: answers 500; ``prose``: answers text that is not the JSON asked for.
    """

    mode: str = "match"
    delay: float = 30.0
    #: The user messages it was asked, in order.
    asked: list[str] = field(default_factory=list)
    stable_marker: str = "Emulated answer"
    url: str = ""

    async def _chat(self, request: web.Request) -> web.Response:
        doc = await request.json()
        question = doc["messages"][-1]["content"]
        self.asked.append(question)
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if self.mode == "broken":
            return web.json_response({"error": {"message": "judge down"}}, status=500)
        match, confidence = self.mode == "match", 0.95
        if self.mode == "first":
            a = question.split("Answer A:\n", 1)[1].split("\n\nAnswer B:", 1)[0]
            match = self.stable_marker in a
        elif self.mode == "unsure":
            match, confidence = True, 0.5
        content = json.dumps(
            {"semantic_match": match, "reasoning": f"judged as {self.mode}", "confidence": confidence}
        )
        if self.mode == "prose":
            content = "They look alike to me."
        return web.json_response(
            {
                "id": "judge-1",
                "object": "chat.completion",
                "created": 0,
                "model": doc.get("model", "judge"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            }
        )


@asynccontextmanager
async def judge_server(mode: str = "match") -> AsyncIterator[JudgeServer]:
    judge = JudgeServer(mode)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge._chat)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    judge.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield judge
    finally:
        await runner.cleanup()


@dataclass
class Comparer:
    port: int
    url: str
    token: str


def _get(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@contextlib.contextmanager
def comparer(namespace: str, log: Path, lineage: Path, token: str = "test-token") -> Iterator[Comparer]:
    """`tinct comparer --watch` on the table namespace ``namespace``, on a free port, recording
    to ``lineage``; ready once it listed the tables."""
    from tinct_testing.controlplane.harness import free_port

    port = free_port()
    argv = [
        sys.executable, "-m", "tinct.cli", "comparer", "--watch", "--namespace", namespace,
        "--host", "127.0.0.1", "--port", str(port), "--lineage-root", str(lineage),
        # The tables name the emulated engines on loopback, allowed as the routers allow them.
        "--allow-backend", "127.0.0.1",
    ]  # fmt: skip
    env = {**os.environ, "TINCT_COMPARER_TOKEN": token}
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the comparer exited: {log.read_text()[-2000:]}")
                try:
                    if _get(f"http://127.0.0.1:{port}/readyz") == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError("the comparer did not get ready")
                time.sleep(0.2)
            yield Comparer(port, f"http://127.0.0.1:{port}", token)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Mirrored:
    """What a router mirrors of one cell: requests of ``dye_tag`` saying ``prompt``."""

    dye_tag: str
    prompt: str


@dataclass
class PairPump:
    """From a thread: mirror ``cells``' requests to the engines and post the pairs to the
    comparer, as routers do, until stopped; every ``noise_every``-th pair is a noise pair.
    ``uid`` is asked each round until it answers (the release's, once it exists), then kept:
    it reads the cluster (a ``kubectl`` process), which on a loaded machine takes long enough
    to starve an analysis window of pairs. A round's cells are mirrored concurrently."""

    comparer: Comparer
    stable: str
    candidate: str
    cells: list[Mirrored]
    uid: Callable[[], str | None]
    namespace: str
    release: str = "chat"
    noise_every: int = 5
    request: dict[str, Any] = field(default_factory=lambda: {"model": "m", "temperature": 0})
    accepted: int = 0
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    async def _run(self) -> None:
        i = 0
        uid: str | None = None
        async with aiohttp.ClientSession() as http:
            while not self._stop.is_set():
                uid = uid or self.uid()
                if uid is None:
                    await asyncio.sleep(0.2)
                    continue
                mirrors = []
                for cell in self.cells:
                    target = "stable" if i % self.noise_every == self.noise_every - 1 else "candidate"
                    body = {**self.request, "messages": [{"role": "user", "content": f"{cell.prompt} #{i}"}]}
                    mirrors.append(
                        mirror(
                            http,
                            self.stable,
                            self.candidate,
                            body,
                            target=target,
                            release=self.release,
                            namespace=self.namespace,
                            uid=uid,
                            dye_tag=cell.dye_tag,
                        )
                    )
                    i += 1
                batch = list(await asyncio.gather(*mirrors))
                try:
                    status, got = await post_pairs(http, self.comparer.url, batch, self.comparer.token)
                except (aiohttp.ClientError, OSError):
                    status, got = 0, {}
                if status == 202:
                    self.accepted += got["accepted"]
                    self.refused += got["refused"]
                await asyncio.sleep(0.05)

    def __enter__(self) -> PairPump:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True, name="pairs")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def example_table(
    shadow: dict[str, Any] | None = None, *, cell_shadow: float = 10, uid: str = "uid-1"
) -> RoutingTable:
    """The routing table of ``examples/grayrelease.yaml`` in namespace llm at its first step:
    its second cell mirrors ``cell_shadow`` percent; ``shadow`` the release's shadow settings."""
    import yaml

    from tinct.api.routing import routing_table_from
    from tinct.api.v1alpha1 import GrayRelease
    from tinct_testing.paths import EXAMPLES

    doc = yaml.safe_load((EXAMPLES / "grayrelease.yaml").read_text())
    doc["metadata"].update(namespace="llm", uid=uid)
    doc["spec"]["cells"][1].update(weights=[0, 1, 10, 100], shadow=[cell_shadow, 0, 0, 0])
    if shadow is not None:
        doc["spec"]["shadow"] = shadow
    return routing_table_from(GrayRelease.model_validate(doc), 0, "Progressing", version=1)
