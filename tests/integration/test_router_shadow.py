"""Mirroring through real ``tinct router`` processes: what clients get, what backends see,
what budgets allow, what the comparer is sent, and what the live metrics do not show.

Backends are the tests' fake schedulers (deterministic answers, every request recorded), the
engine emulator, and a candidate that accepts and never answers; a :class:`PairReceiver`
stands in for ``tinct comparer``'s ``POST /v1/pairs``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tinct.emulator import Behaviour, serving
from tinct_testing.controlplane.harness import free_port
from tinct_testing.router_fakes import (
    FakeScheduler,
    HostileBackend,
    PairReceiver,
    RawBackend,
    router_process,
    table_doc,
)
from tinct_testing.wait import eventually_async

TOKEN = "shadow-token-for-tests"
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "What is a dye cell?"}]}


def _table_file(tmp_path: Path, stable: str, candidate: str, **kw: Any) -> str:
    shadow = {"noiseShare": 0, **kw.pop("shadow", {})}
    doc = table_doc(stable, candidate, shadow=shadow, **{"default_shadow": 100, **kw})
    path = tmp_path / f"table-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _token_file(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / "comparer-token"
    path.write_text(token + "\n")
    return str(path)


@pytest.fixture
async def receiver() -> AsyncIterator[PairReceiver]:
    rx = await PairReceiver(token=TOKEN).start()
    yield rx
    await rx.stop()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


async def _metrics(base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        return _samples(await r.text())


def _sum(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def _until(base: str, name: str, value: float, timeout: float = 60.0, **labels: str) -> None:
    """Wait until the router's ``name`` samples (with ``labels``) sum to ``value``."""

    async def summed() -> bool:
        return _sum(await _metrics(base), name, **labels) == value

    await eventually_async(
        summed, timeout=timeout, interval=0.05, what=f"{name}{labels or ''} summing to {value}"
    )


def _shadowed(seen: list[Any]) -> list[Any]:
    return [s for s in seen if any(k.lower() == "x-tinct-shadow" for k, _ in s.items)]


def _live(seen: list[Any]) -> list[Any]:
    return [s for s in seen if not any(k.lower() == "x-tinct-shadow" for k, _ in s.items)]


def _body(answer: dict[str, Any]) -> bytes:
    return base64.b64decode(answer["body_b64"])


async def _post(http: aiohttp.ClientSession, base: str, doc: dict[str, Any], **headers: str) -> bytes:
    async with http.post(f"{base}/v1/chat/completions", json=doc, headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def test_clients_get_stables_bytes_and_the_pair_carries_both_answers(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    """Through the official openai client, JSON and SSE: the client's bytes are stable's
    (the same as straight from stable), the mirror reaches the candidate, and each pair
    holds the request as sent and each side's answer byte for byte."""
    v1, v2 = backends
    direct = openai.AsyncOpenAI(base_url=f"{v1.url}/v1", api_key="k", max_retries=0)
    direct_candidate = openai.AsyncOpenAI(base_url=f"{v2.url}/v1", api_key="k", max_retries=0)
    table = _table_file(tmp_path, v1.url, v2.url)
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    async with router_process(table, *args) as router:
        client = openai.AsyncOpenAI(base_url=f"{router.base}/v1", api_key="k", max_retries=0)
        messages: Any = [{"role": "user", "content": "Name three colours of dye, please."}]
        try:
            via = await client.chat.completions.with_raw_response.create(model="llama3", messages=messages)
            assert via.parse().choices[0].message.content == "hello from v1"
            straight = await direct.chat.completions.with_raw_response.create(
                model="llama3", messages=messages
            )
            candidates = await direct_candidate.chat.completions.with_raw_response.create(
                model="llama3", messages=messages
            )
            json_bytes = via.http_response.content
            assert json_bytes == straight.http_response.content

            async with client.chat.completions.with_streaming_response.create(
                model="llama3", messages=messages, stream=True
            ) as r:
                sse_bytes = await r.read()
            async with direct.chat.completions.with_streaming_response.create(
                model="llama3", messages=messages, stream=True
            ) as r:
                assert sse_bytes == await r.read()
            async with direct_candidate.chat.completions.with_streaming_response.create(
                model="llama3", messages=messages, stream=True
            ) as r:
                candidate_sse = await r.read()
            stream = await client.chat.completions.create(model="llama3", messages=messages, stream=True)
            parts = [
                c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content
            ]
            assert "".join(parts) == "hello from v1"
        finally:
            for c in (client, direct, direct_candidate):
                await c.close()
        pairs = await receiver.wait_for(3)
        await _until(router.base, "tinct_router_shadow_pairs_sent_total", 3)
    assert len(pairs) == 3
    # What the backends saw: the router's mirrors (X-Tinct-Shadow: 1) at the candidate only.
    live = _live(v1.seen)
    assert len(live) == 3 + 2  # three through the router, two straight
    assert not _shadowed(v1.seen)
    mirrors = _shadowed(v2.seen)
    assert len(mirrors) == 3
    for m in mirrors:
        assert [(k, v) for k, v in m.items if k.lower() == "x-tinct-shadow"] == [("X-Tinct-Shadow", "1")]
        assert m.headers["X-Scheduler-Version"] == "v2"
    routed = [s for s in live if s.headers.get("X-Forwarded-For")]
    assert sorted(m.body for m in mirrors) == sorted(s.body for s in routed)

    chars = len("Name three colours of dye, please.")
    # Pairs go out as each mirror ends, not necessarily in the order of the requests.
    pairs = sorted(pairs, key=lambda p: json.loads(p["request"]["body"]).get("stream", False))
    for pair, client_bytes, candidate_bytes, tag in zip(
        pairs,
        (json_bytes, sse_bytes, sse_bytes),
        (candidates.http_response.content, candidate_sse, candidate_sse),
        ("len:short+role:user+latency:low", *["len:short+role:user+latency:high"] * 2),
        strict=True,
    ):
        assert pair["v"] == 1
        assert (pair["namespace"], pair["release"], pair["table_version"]) == ("llm", "chat", 1)
        assert pair["dye_tag"] == tag
        assert pair["target"] == "candidate"
        assert pair["request"]["path"] == "/v1/chat/completions"
        assert pair["request"]["prompt_tokens"] == math.ceil(chars / 4)
        stable, candidate = pair["stable"], pair["candidate"]
        assert _body(stable) == client_bytes
        assert _body(candidate) == candidate_bytes
        assert stable["status"] == candidate["status"] == 200
        assert not stable["truncated"]
        assert not candidate["truncated"]
        assert candidate["error"] is None
        assert stable["ms"] > 0
        assert candidate["ms"] > 0
    assert pairs[0]["stable"]["content_type"].startswith("application/json")
    assert pairs[1]["stable"]["content_type"] == pairs[1]["candidate"]["content_type"] == "text/event-stream"
    assert sorted(p["request"]["body"].encode() for p in pairs) == sorted(s.body for s in routed)


async def test_a_clients_x_tinct_shadow_never_reaches_a_backend(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    v1, v2 = backends
    # Admins' cell mirrors nothing; everyone else's everything.
    cells = [{"match": {"role": "admin"}, "weight": 0, "shadow": 0}]
    table = _table_file(tmp_path, v1.url, v2.url, cells=cells)
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    async with router_process(table, *args, "--trust-role-from", "127.0.0.1/32") as router:
        async with aiohttp.ClientSession() as http:
            forged = [("X-Tinct-Shadow", "1"), ("x-tinct-shadow", "0"), ("X-TINCT-SHADOW", "yes")]
            for role in ("user", "admin"):
                headers = [*forged, ("X-User-Role", role), ("Content-Type", "application/json")]
                async with http.post(
                    f"{router.base}/v1/chat/completions", data=json.dumps(CHAT), headers=headers
                ) as r:
                    assert r.status == 200
            async with http.get(f"{router.base}/v1/models", headers=forged) as r:
                assert r.status == 200
            async with http.post(f"{router.base}/v1/embeddings", data=b"{}", headers=forged) as r:
                assert r.status == 200
        await receiver.wait_for(1)
    assert len(v1.seen) == 4
    assert not _shadowed(v1.seen)  # live requests, classified or passed through
    (mirror,) = v2.seen  # the user's request only; the admin's cell shadows nothing
    assert [(k, v) for k, v in mirror.items if k.lower() == "x-tinct-shadow"] == [("X-Tinct-Shadow", "1")]


async def test_the_noise_share_goes_to_stable_a_second_time(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    v1, v2 = backends
    table = _table_file(tmp_path, v1.url, v2.url, shadow={"noiseShare": 50})
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    n = 40
    async with router_process(table, *args) as router:
        async with aiohttp.ClientSession() as http:
            answers = [await _post(http, router.base, CHAT) for _ in range(n)]
        pairs = await receiver.wait_for(n)
        metrics = await _metrics(router.base)
    assert len(pairs) == n
    to_stable = [p for p in pairs if p["target"] == "stable"]
    to_candidate = [p for p in pairs if p["target"] == "candidate"]
    # Drawn at random, half on average: 40 draws all on one side would be a broken draw.
    assert to_stable
    assert to_candidate
    assert len(_shadowed(v1.seen)) == len(to_stable)
    assert len(_shadowed(v2.seen)) == len(to_candidate)
    assert len(_live(v1.seen)) == n
    assert not _live(v2.seen)
    for p in to_stable:  # stable's second answer in the candidate's place
        assert _body(p["candidate"]) == _body(p["stable"]) == answers[0]
    for p in to_candidate:
        assert b"hello from v2" in _body(p["candidate"])
    assert _sum(metrics, "tinct_router_shadow_mirrors_total", target="stable") == len(to_stable)
    assert _sum(metrics, "tinct_router_shadow_mirrors_total", target="candidate") == len(to_candidate)


async def test_mirrors_are_sticky_by_session_and_never_of_candidate_requests(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    v1, v2 = backends
    # Half of the user cell is mirrored; the admin cell goes to the candidate, mirrored or not.
    cells = [{"match": {"role": "admin"}, "weight": 100, "shadow": 100}]
    table = _table_file(tmp_path, v1.url, v2.url, cells=cells, default_shadow=50)
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    sessions = [f"session-{i}" for i in range(30)]
    async with router_process(table, *args, "--trust-role-from", "127.0.0.1/32") as router:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                for s in sessions:
                    await _post(http, router.base, CHAT, **{"X-Session-Id": s})
            for s in sessions[:5]:
                await _post(http, router.base, CHAT, **{"X-Session-Id": s, "X-User-Role": "admin"})
        mirrored = {m.headers["X-Session-Id"] for m in _shadowed(v2.seen)}
        await receiver.wait_for(3 * len(mirrored))
        metrics = await _metrics(router.base)
    assert 0 < len(mirrored) < len(sessions)
    by_session = {s: sum(1 for m in _shadowed(v2.seen) if m.headers["X-Session-Id"] == s) for s in sessions}
    assert {by_session[s] for s in mirrored} == {3}  # every request of a mirrored session
    assert len(_live(v2.seen)) == 5  # the admins', answered by the candidate and not mirrored
    assert _sum(metrics, "tinct_router_shadow_mirrors_total") == 3 * len(mirrored)


class _Hung(RawBackend):
    """A candidate that accepts, reads each request and never answers, until released."""

    def __init__(self) -> None:
        self.requests = 0
        self.release = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._arrived = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            self._arrived.set()
            await self.release.wait()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(60):
            while self.requests < n:
                self._arrived.clear()
                await self._arrived.wait()

    async def stop(self) -> None:
        self.release.set()
        await super().stop()


async def test_a_hung_candidate_does_not_hold_up_the_live_path(
    v1: FakeScheduler, receiver: PairReceiver, tmp_path: Path
) -> None:
    """Mirrors hang on the candidate to their limit; answers keep coming, the requests over
    the budget are counted and never sent later, and the hung ones end as pairs with an error."""
    hung = await _Hung().start()
    try:
        table = _table_file(tmp_path, v1.url, hung.url, shadow={"maxConcurrent": 3, "timeoutSeconds": 3600})
        args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
        async with router_process(table, *args) as router, aiohttp.ClientSession() as http:
            await _post(http, router.base, CHAT)
            await hung.wait_for(1)
            answers = []
            for _ in range(4):  # waves of concurrent requests while mirrors hang
                answers += await asyncio.gather(*(_post(http, router.base, CHAT) for _ in range(10)))
            assert len(answers) == 40
            assert all(b"hello from v1" in a for a in answers)
            await hung.wait_for(3)
            metrics = await _metrics(router.base)
            assert _sum(metrics, "tinct_router_shadow_mirrors_total") == 3
            assert _sum(metrics, "tinct_router_shadow_skipped_total", reason="budget") == 38
            assert _sum(metrics, "tinct_router_requests_total", side="stable") == 41
            assert not receiver.pairs  # the hung mirrors' pairs wait for their answers

            hung.release.set()  # the candidate hangs up: the mirrors end, their pairs go out
            pairs = await receiver.wait_for(3)
            assert [p["candidate"]["error"] for p in pairs] == ["reset"] * 3
            assert all(p["candidate"]["status"] is None for p in pairs)
            await _until(router.base, "tinct_router_shadow_skipped_total", 3, reason="reset")
            # Over-budget requests were skipped, not queued: nothing more reached the candidate.
            assert hung.requests == 3
            hung.release.clear()
            await _post(http, router.base, CHAT)  # the budget is free again
            await hung.wait_for(4)
    finally:
        await hung.stop()


@pytest.mark.parametrize("failure", ["timeout", "unreachable", "bad_answer"])
async def test_a_failing_mirror_is_a_pair_with_the_error(
    v1: FakeScheduler, receiver: PairReceiver, tmp_path: Path, failure: str
) -> None:
    """The mirror times out (on a candidate that never answers), cannot connect, or gets an
    answer that is not HTTP: the client's answer is stable's all the same, and the pair says
    what went wrong, for the comparer to count as the candidate's error."""

    async def garbage(writer: asyncio.StreamWriter) -> None:
        writer.write(b"this is not HTTP\r\n\r\n")

    hung, hostile = await _Hung().start(), await HostileBackend(garbage).start()
    candidate = {
        "timeout": hung.url,
        "unreachable": f"http://127.0.0.1:{free_port()}",
        "bad_answer": hostile.url,
    }[failure]
    try:
        table = _table_file(tmp_path, v1.url, candidate, shadow={"timeoutSeconds": 0.5})
        args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
        async with router_process(table, *args) as router, aiohttp.ClientSession() as http:
            assert b"hello from v1" in await _post(http, router.base, CHAT)
            (pair,) = await receiver.wait_for(1)
            await _until(router.base, "tinct_router_shadow_skipped_total", 1, reason=failure)
        assert pair["candidate"]["error"] == failure
        assert pair["candidate"]["status"] is None
        assert pair["candidate"]["body_b64"] == ""
        assert pair["stable"]["status"] == 200
    finally:
        await hung.stop()
        await hostile.stop()


async def test_the_held_bytes_cap_limits_mirrors_in_flight(
    v1: FakeScheduler, receiver: PairReceiver, tmp_path: Path
) -> None:
    hung = await _Hung().start()
    try:
        # Each mirror reserves its body and twice maxBytes (2 x 1024): room for two in 5000.
        shadow = {"maxConcurrent": 8, "maxBytes": 1024, "timeoutSeconds": 3600}
        table = _table_file(tmp_path, v1.url, hung.url, shadow=shadow)
        args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
        async with router_process(table, *args, "--shadow-max-held-bytes", "5000") as router:
            async with aiohttp.ClientSession() as http:
                for _ in range(6):
                    await _post(http, router.base, CHAT)
            await hung.wait_for(2)
            metrics = await _metrics(router.base)
        assert hung.requests == 2
        assert _sum(metrics, "tinct_router_shadow_skipped_total", reason="budget") == 4
        assert 2 * (2 * 1024) < _sum(metrics, "tinct_router_shadow_held_bytes") <= 5000
    finally:
        await hung.stop()


async def test_the_token_budget_counts_overruns_and_sends_nothing_later(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    v1, v2 = backends
    # ~1,000 prompt tokens a request, 2,000 a minute: two mirrors, then one every 30 s.
    doc = {"model": "llama3", "messages": [{"role": "user", "content": "x" * 4000}]}
    table = _table_file(tmp_path, v1.url, v2.url, shadow={"maxTokensPerMinute": 2000})
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    n = 8
    async with router_process(table, *args) as router:
        async with aiohttp.ClientSession() as http:
            for _ in range(n):
                await _post(http, router.base, doc)
        metrics = await _metrics(router.base)
        mirrors = _sum(metrics, "tinct_router_shadow_mirrors_total")
        budget = _sum(metrics, "tinct_router_shadow_skipped_total", reason="budget")
        pairs = await receiver.wait_for(int(mirrors))
    assert mirrors >= 2
    assert budget >= 1
    assert mirrors + budget == n
    assert len(pairs) == len(v2.seen) == mirrors  # what was skipped never went anywhere
    assert {p["request"]["prompt_tokens"] for p in pairs} == {1000}
    assert pairs[0]["dye_tag"] == "len:medium+role:user+latency:low"


async def test_mirrors_do_not_move_the_live_metrics(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    """The same traffic through a router that mirrors every request to a failing candidate
    and through one that mirrors nothing: the live series are the same."""
    v1, v2 = backends
    v2.reset("error")  # every mirror gets a 503
    table = _table_file(tmp_path, v1.url, v2.url)
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
    n = 12
    seen: dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float]] = {}
    for name, extra in (("mirroring", args), ("plain", ())):
        async with router_process(table, *extra) as router:
            async with aiohttp.ClientSession() as http:
                for i in range(n):
                    await _post(http, router.base, {**CHAT, "stream": i % 2 == 0})
            if extra:
                await receiver.wait_for(n)
                await _until(router.base, "tinct_router_shadow_pairs_sent_total", n)
            seen[name] = await _metrics(router.base)
    assert len(v2.seen) == n
    assert {p["candidate"]["status"] for p in receiver.pairs} == {503}
    assert _sum(seen["mirroring"], "tinct_router_shadow_mirrors_total", target="candidate") == n

    def live(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[Any, float]:
        return {
            k: v
            for k, v in samples.items()
            if k[0].startswith("tinct_router_")
            and not k[0].startswith("tinct_router_shadow_")
            and (k[0].endswith(("_total", "_count")) or k[0] == "tinct_router_candidate_ejected")
        }

    assert live(seen["mirroring"]) == live(seen["plain"])
    assert _sum(seen["mirroring"], "tinct_router_requests_total", side="stable") == n
    assert _sum(seen["mirroring"], "tinct_router_requests_total", side="candidate") == 0


async def test_answers_over_max_bytes_reach_the_client_whole_and_the_pair_truncated(
    receiver: PairReceiver, tmp_path: Path
) -> None:
    long = Behaviour(model="v1", ttft_ms=0, itl_ms=0, output_tokens=300)
    async with serving(long) as stable, serving(long.model_copy(update={"model": "v2"})) as candidate:
        table = _table_file(tmp_path, stable.url, candidate.url, shadow={"maxBytes": 1024})
        args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path))
        async with router_process(table, *args) as router, aiohttp.ClientSession() as http:
            streamed = await _post(http, router.base, {**CHAT, "stream": True})
            whole = await _post(http, router.base, CHAT)
            pairs = await receiver.wait_for(2)
            await _until(router.base, "tinct_router_shadow_skipped_total", 2, reason="too_long")
    assert len(streamed) > 4 * 1024
    assert streamed.endswith(b"data: [DONE]\n\n")
    assert json.loads(whole)["usage"]["completion_tokens"] == 300
    pairs = sorted(pairs, key=lambda p: not json.loads(p["request"]["body"]).get("stream", False))
    for pair, got in zip(pairs, (streamed, whole), strict=True):
        assert pair["stable"]["truncated"]
        assert pair["candidate"]["truncated"]
        assert _body(pair["stable"]) == got[:1024]
        assert len(_body(pair["candidate"])) == 1024
        assert pair["candidate"]["error"] is None


async def test_a_comparer_down_or_refusing_costs_dropped_pairs_only(
    backends: tuple[FakeScheduler, FakeScheduler], tmp_path: Path
) -> None:
    """No comparer listening, then one that refuses the token: every pair is dropped and
    counted, answers are unchanged; once the token file holds the right token, pairs arrive."""
    v1, v2 = backends
    port = free_port()
    token = _token_file(tmp_path, "not-the-token")
    table = _table_file(tmp_path, v1.url, v2.url)
    args = ("--comparer", f"http://127.0.0.1:{port}", "--comparer-token-file", token, "--comparer-queue", "2")
    rx = PairReceiver(token=TOKEN)
    try:
        async with router_process(table, *args) as router, aiohttp.ClientSession() as http:
            for _ in range(10):
                assert b"hello from v1" in await _post(http, router.base, CHAT)
            await _until(router.base, "tinct_router_shadow_skipped_total", 10, reason="send_dropped")
            await rx.start(port)
            for _ in range(3):
                await _post(http, router.base, CHAT)
            await _until(router.base, "tinct_router_shadow_skipped_total", 13, reason="send_dropped")
            assert rx.unauthorized >= 1
            assert not rx.pairs
            Path(token).write_text(TOKEN)  # the Secret rotated in place: read again
            await _post(http, router.base, CHAT)
            await rx.wait_for(1)
            assert _sum(await _metrics(router.base), "tinct_router_shadow_mirrors_total") == 14
        assert len(v2.seen) == 14
        assert b"connect" in router.stderr or b"refused" in router.stderr
    finally:
        await rx.stop()


async def test_workers_mirror_and_their_counts_are_summed(
    backends: tuple[FakeScheduler, FakeScheduler], receiver: PairReceiver, tmp_path: Path
) -> None:
    v1, v2 = backends
    table = _table_file(tmp_path, v1.url, v2.url)
    args = ("--comparer", receiver.url, "--comparer-token-file", _token_file(tmp_path), "--workers", "2")
    n = 20
    async with router_process(table, *args, metrics_port=free_port()) as router:
        for _ in range(n):  # a connection each: the kernel spreads them over the workers
            async with aiohttp.ClientSession() as http:
                await _post(http, router.base, CHAT)
        pairs = await receiver.wait_for(n)
        await _until(router.local, "tinct_router_shadow_pairs_sent_total", n)
        metrics = await _metrics(router.local)
    assert len(pairs) == n
    assert all(b <= 64 for b in receiver.batches)
    assert _sum(metrics, "tinct_router_shadow_mirrors_total") == n
    assert _sum(metrics, "tinct_router_shadow_skipped_total") == 0
