"""The router's data path against two real fake schedulers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest

from tinct.router.config import RouterConfig
from tinct.router.response import Feed, HeadWatch, Response, UpstreamTimeoutError
from tinct.router.summing import parse as parse_metrics
from tinct_testing.controlplane.harness import free_port
from tinct_testing.router_fakes import FakeScheduler, running_router, table

ADMIN_LONG = {"X-User-Role": "admin", "X-Latency-Class": "high"}
LONG = "x" * 20_000  # > 4096 tokens at 4 chars per token


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


async def post(
    http: aiohttp.ClientSession, base: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        text = await r.text()
        return r.status, dict(r.headers), json.loads(text) if text else None


def one_cell(v1: FakeScheduler, v2: FakeScheduler, **kw: Any) -> Any:
    """Admin + long + high goes to the candidate; everything else stays on stable."""
    cells = [{"match": {"promptLength": "long", "role": "admin", "latency": "high"}, "weight": 100}]
    return table(v1.url, v2.url, cells=cells, **kw)


async def test_each_cell_goes_to_its_side(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(one_cell(v1, v2)) as (base, _):
        status, h, body = await post(http, base, chat(LONG), ADMIN_LONG)
        assert status == 200
        assert h["X-Scheduler-Active"] == "v2"
        assert "X-Fallback-Reason" not in h
        assert body["model"] == "v2"
        assert v2.seen[-1].headers["X-Scheduler-Version"] == "v2"

        for headers, content in [
            ({"X-User-Role": "user", "X-Latency-Class": "high"}, LONG),
            (ADMIN_LONG, "short"),
        ]:
            status, h, body = await post(http, base, chat(content), headers)
            assert (status, h["X-Scheduler-Active"], body["model"]) == (200, "v1", "v1")
            assert v1.seen[-1].headers["X-Scheduler-Version"] == "v1"
        assert len(v2.seen) == 1


async def test_sticky_keys_stay_on_their_side_and_share_matches(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(table(v1.url, v2.url, default_weight=50)) as (base, _):
        sides: dict[str, str] = {}
        for i in range(120):
            _, h, _ = await post(http, base, chat(), {"X-Session-Id": f"s{i}"})
            sides[f"s{i}"] = h["X-Scheduler-Active"]
        for i in range(0, 120, 7):
            _, h, _ = await post(http, base, chat(), {"X-Session-Id": f"s{i}"})
            assert h["X-Scheduler-Active"] == sides[f"s{i}"]
        assert (
            20 < list(sides.values()).count("v2") < 100
        )  # both sides used; the precise share is in test_router_choose


async def test_hop_by_hop_headers_are_dropped_and_others_forwarded(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(table(v1.url, v2.url)) as (base, _):
        headers = {
            "Authorization": "Bearer k",
            "X-Custom": "1",
            "Connection": "keep-alive, X-Private-Hop",
            "X-Private-Hop": "secret",
            "Proxy-Authorization": "Basic x",
            "TE": "trailers",
        }
        status, h, _ = await post(http, base, chat(), headers)
        assert status == 200
        assert h["X-Served-By"] == "v1"  # backend's own header comes back
        got = {k.lower(): v for k, v in v1.seen[-1].headers.items()}
        assert got["authorization"] == "Bearer k"
        assert got["x-custom"] == "1"
        assert got["x-forwarded-for"] == "127.0.0.1"
        for hop in ("x-private-hop", "proxy-authorization", "te"):
            assert hop not in got


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("error", "upstream_error"), ("mismatch", "version_mismatch"), ("stall", "latency_too_high")],
)
async def test_candidate_failure_falls_back_to_stable_in_the_same_request(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession, mode: str, reason: str
) -> None:
    v2.reset(mode)
    fb = {"consecutiveFailures": 3, "latencyMs": 150, "cooldownSeconds": 30}
    async with running_router(table(v1.url, v2.url, default_weight=100, fallback=fb)) as (base, _):
        status, h, body = await post(http, base, chat())
        assert status == 200
        assert h["X-Scheduler-Active"] == "v1"
        assert h["X-Fallback-Reason"] == reason
        assert body["model"] == "v1"
        assert len(v2.seen) == 1
        assert len(v1.seen) == 1
        assert v1.seen[0].body == v2.seen[0].body  # same request body retried on stable
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
        assert (
            'tinct_router_fallbacks_total{dye_tag="len:short+role:user+latency:low",namespace="llm",'
            f'reason="{reason}",release="chat"}} 1.0' in metrics
        )


async def test_unreachable_candidate_falls_back(v1: FakeScheduler, http: aiohttp.ClientSession) -> None:
    async with running_router(table(v1.url, f"http://127.0.0.1:{free_port()}", default_weight=100)) as (
        base,
        _,
    ):
        status, h, _ = await post(http, base, chat())
        assert (status, h["X-Scheduler-Active"], h["X-Fallback-Reason"]) == (200, "v1", "unreachable")


async def test_ejection_after_consecutive_failures_and_recovery_after_cooldown(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    v2.reset("error")
    fb = {"consecutiveFailures": 2, "latencyMs": 800, "cooldownSeconds": 30}
    tbl = table(v1.url, v2.url, default_weight=100, fallback=fb)
    async with running_router(tbl) as (base, app):
        st = app.state
        assert st.proxy is not None
        assert st.holder.current is not None
        health = st.proxy.health(st.holder.current)
        now = [1000.0]
        health.clock = lambda: now[0]

        reasons = [(await post(http, base, chat()))[1]["X-Fallback-Reason"] for _ in range(4)]
        assert reasons == ["upstream_error", "upstream_error", "ejected", "ejected"]
        assert len(v2.seen) == 2  # ejected requests never reach the candidate
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
        assert 'tinct_router_candidate_ejections_total{namespace="llm",release="chat"} 1.0' in metrics
        assert 'tinct_router_candidate_ejected{namespace="llm",release="chat"} 1.0' in metrics

        v2.reset("ok")
        now[0] += 29
        assert (await post(http, base, chat()))[1]["X-Fallback-Reason"] == "ejected"
        now[0] += 2
        status, h, body = await post(http, base, chat())
        assert (status, h["X-Scheduler-Active"], body["model"]) == (200, "v2", "v2")
        assert "X-Fallback-Reason" not in h
        async with http.get(f"{base}/metrics") as r:
            assert 'tinct_router_candidate_ejected{namespace="llm",release="chat"} 0.0' in await r.text()


async def test_a_success_resets_the_failure_count(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    fb = {"consecutiveFailures": 2, "latencyMs": 800, "cooldownSeconds": 30}
    async with running_router(table(v1.url, v2.url, default_weight=100, fallback=fb)) as (base, _):
        for mode in ("error", "ok", "error", "ok"):
            v2.mode = mode
            _, h, _ = await post(http, base, chat())
            assert h.get("X-Fallback-Reason") == ("upstream_error" if mode == "error" else None)


async def test_sse_chunks_reach_the_client_before_the_stream_ends(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    v2.reset("gated")
    async with running_router(table(v1.url, v2.url, default_weight=100)) as (base, _):
        async with http.post(f"{base}/v1/chat/completions", json=chat(stream=True)) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert r.headers["X-Scheduler-Active"] == "v2"
            events: list[str] = []
            while len(events) < 3:
                line = (await r.content.readline()).decode()
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) < 3:
                        # The backend holds the rest back until the test opens the gate.
                        assert not v2.stream_done.is_set()
                        v2.gate.set()
            rest = (await r.content.read()).decode()
        assert v2.stream_done.is_set()
        assert "data: [DONE]" in rest
        assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events] == [
            "hello",
            " from",
            " v2",
        ]


async def test_candidate_dying_mid_stream_is_not_retried_and_the_client_sees_a_cut(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    v2.reset("die")
    fb = {"consecutiveFailures": 1, "latencyMs": 800, "cooldownSeconds": 30}
    async with running_router(table(v1.url, v2.url, default_weight=100, fallback=fb)) as (base, _):
        async with http.post(f"{base}/v1/chat/completions", json=chat(stream=True)) as r:
            assert r.headers["X-Scheduler-Active"] == "v2"
            first = await r.content.readline()
            assert first.startswith(b"data: ")
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.content.read()
        assert v1.seen == []  # no retry once bytes went to the client
        # ...but the failure counts: with consecutiveFailures 1 the candidate is now ejected.
        _, h, body = await post(http, base, chat())
        assert h["X-Fallback-Reason"] == "ejected"
        assert body["model"] == "v1"
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
        assert (
            'tinct_router_truncated_responses_total{dye_tag="len:short+role:user+latency:high",'
            'namespace="llm",reason="upstream_error",release="chat",side="candidate"} 1.0'
        ) in metrics


async def test_graceful_shutdown_lets_a_stream_finish(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    v1.reset("gated")
    cm = running_router(table(v1.url, v2.url))
    base, _ = await cm.__aenter__()
    lines: list[bytes] = []
    async with http.post(f"{base}/v1/chat/completions", json=chat(stream=True)) as r:
        lines.append(await r.content.readline())
        shutdown = asyncio.create_task(cm.__aexit__(None, None, None))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not shutdown.done()  # waiting for the stream in flight
        lines += await v1.ungate(r.content)  # ends only if the router lets the stream finish
    await asyncio.wait_for(shutdown, 30)
    assert b"data: [DONE]\n" in b"".join(lines)


async def test_malformed_and_oversized_requests_get_a_4xx_and_never_reach_a_backend(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(table(v1.url, v2.url), RouterConfig(max_body_bytes=1024)) as (base, _):
        url = f"{base}/v1/chat/completions"
        async with http.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "invalid_json"
        async with http.post(url, json={"model": "m"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "missing_messages"
        async with http.post(url, json=chat("x" * 5000)) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "request_too_large"
        async with http.post(f"{base}/v1/completions", data=b"") as r:
            assert r.status == 400
        assert v1.seen == []
        assert v2.seen == []
        # the router still serves afterwards
        assert (await post(http, base, chat()))[0] == 200


async def test_other_endpoints_pass_to_stable(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(table(v1.url, v2.url, default_weight=100)) as (base, _):
        async with http.get(f"{base}/v1/models") as r:
            assert r.status == 200
            assert r.headers["X-Scheduler-Active"] == "v1"
            assert (await r.json())["data"][0]["id"] == "v1"
        async with http.post(f"{base}/v1/embeddings", data=b"raw-bytes-not-json") as r:
            assert r.status == 200
        assert v1.seen[-1].body == b"raw-bytes-not-json"
        assert v2.seen == []


async def test_no_table_means_not_ready_and_503(http: aiohttp.ClientSession) -> None:
    async with running_router(None) as (base, _app):
        async with http.get(f"{base}/readyz") as r:
            assert r.status == 503
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
        async with http.post(f"{base}/v1/chat/completions", json=chat()) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "no_routing_table"


async def test_stable_down_gives_502(http: aiohttp.ClientSession, v2: FakeScheduler) -> None:
    tbl = table(f"http://127.0.0.1:{free_port()}", v2.url)
    async with running_router(tbl) as (base, _), http.post(f"{base}/v1/chat/completions", json=chat()) as r:
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "stable_unavailable"


async def test_metrics_count_requests_by_side_version_tag_and_code(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    async with running_router(one_cell(v1, v2, version=42)) as (base, _):
        await post(http, base, chat(LONG), ADMIN_LONG)
        await post(http, base, chat())
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        assert 'tinct_router_table_version{namespace="llm",release="chat"} 42.0' in text
        assert (
            'tinct_router_requests_total{code="200",dye_tag="len:long+role:admin+latency:high",'
            'namespace="llm",release="chat",scheduler_version="v2",side="candidate"} 1.0'
        ) in text
        assert (
            'tinct_router_requests_total{code="200",dye_tag="len:short+role:user+latency:low",'
            'namespace="llm",release="chat",scheduler_version="v1",side="stable"} 1.0'
        ) in text
        assert "tinct_router_time_to_first_byte_seconds_bucket" in text
        assert "tinct_router_request_duration_seconds_count" in text


def _buckets(text: str, family: str, side: str) -> dict[str, float]:
    """``le`` -> cumulative count of ``family``'s histogram for ``side`` in the short/user/low cell."""
    fam = parse_metrics(text).get(family)
    out: dict[str, float] = {}
    for (name, labels), value in fam.samples.items() if fam else ():
        d = dict(labels)
        if (
            name == f"{family}_bucket"
            and d["side"] == side
            and d["dye_tag"] == "len:short+role:user+latency:low"
        ):
            assert (d["namespace"], d["release"]) == ("llm", "chat")
            out[d["le"]] = value
    return out


@pytest.mark.parametrize(("mode", "reason"), [("error", "upstream_error"), ("mismatch", "version_mismatch")])
async def test_a_fallback_costs_the_candidate_and_stable_is_timed_from_its_own_attempt(
    v1: FakeScheduler,
    v2: FakeScheduler,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    reason: str,
) -> None:
    # The router's clock, moved 100 s on while the candidate works: the candidate then takes
    # 100 s to fail, and only what each side really took lands in its histogram.
    offset = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])
    v2.reset(mode)
    v2.on_request = lambda: offset.__setitem__(0, offset[0] + 100.0)
    async with running_router(table(v1.url, v2.url, default_weight=100)) as (base, _):
        status, h, _ = await post(http, base, chat())
        assert (status, h["X-Fallback-Reason"]) == (200, reason)
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
    ttfb = "tinct_router_time_to_first_byte_seconds"
    candidate, stable = _buckets(text, ttfb, "candidate"), _buckets(text, ttfb, "stable")
    print(f"candidate {candidate}\nstable {stable}")
    assert candidate["+Inf"] == 1, "the failed attempt is the candidate's"
    assert candidate["60.0"] == 0, "...and took the 100 s it cost"
    assert stable["+Inf"] == 1
    assert stable["60.0"] == 1, "stable is timed from its own attempt, not from the request"
    # The request took what it took for the client: its duration runs from its start.
    duration = _buckets(text, "tinct_router_request_duration_seconds", "stable")
    assert (duration["+Inf"], duration["60.0"]) == (1, 0)
    assert 'side="candidate"' not in "".join(
        line for line in text.splitlines() if line.startswith("tinct_router_requests_total")
    ), "the request is counted once, for the side that answered"


@pytest.mark.parametrize(
    ("reason", "candidate_observations"),
    [("unreachable", 1), ("latency_too_high", 0), ("ejected", 0)],
)
async def test_which_fallbacks_count_in_the_candidates_time_to_first_byte(
    v1: FakeScheduler,
    v2: FakeScheduler,
    http: aiohttp.ClientSession,
    reason: str,
    candidate_observations: int,
) -> None:
    fb = {"consecutiveFailures": 1, "latencyMs": 150, "cooldownSeconds": 300}
    candidate = f"http://127.0.0.1:{free_port()}" if reason == "unreachable" else v2.url
    if reason == "latency_too_high":
        v2.reset("stall")
    async with running_router(table(v1.url, candidate, default_weight=100, fallback=fb)) as (base, app):
        if reason == "ejected":
            st = app.state
            assert st.proxy is not None
            assert st.holder.current is not None
            st.proxy.health(st.holder.current).failure()  # one failure ejects it
        status, h, _ = await post(http, base, chat())
        assert (status, h["X-Fallback-Reason"]) == (200, reason)
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
    ttfb = "tinct_router_time_to_first_byte_seconds"
    assert _buckets(text, ttfb, "candidate").get("+Inf", 0) == candidate_observations
    assert _buckets(text, ttfb, "stable")["+Inf"] == 1


class _Feed:
    """Just enough of a connection for a :class:`Response` that never gets an answer."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()


async def test_the_head_watch_fails_each_answer_at_its_own_deadline_and_no_other() -> None:
    loop = asyncio.get_running_loop()
    watch = HeadWatch(loop)
    failed: dict[str, float] = {}

    def answer(name: str) -> Response:
        r = Response(cast(Feed, _Feed()), head_only=False)
        r.head.add_done_callback(lambda _: failed.setdefault(name, loop.time()))
        return r

    now = loop.time()
    a, b, c, d = answer("a"), answer("b"), answer("c"), answer("d")
    deadlines = {"a": now + 0.2, "b": now + 0.3, "c": now + 0.35, "d": now + 0.1}
    assert watch.add(a, 0.2, deadlines["a"])
    assert watch.add(b, 0.2, deadlines["b"])
    assert watch.add(c, 0.5, deadlines["c"])  # another timeout: another queue
    # Before the last deadline of its queue: not taken, the caller times it itself.
    assert not watch.add(d, 0.2, deadlines["d"])
    watch.discard(a, 0.2)  # its head came: the timer set for it must not fail anything
    assert len(watch) == 2
    await asyncio.sleep(0.5)
    assert sorted(failed) == ["b", "c"]
    for name in ("b", "c"):
        assert failed[name] >= deadlines[name]  # never before the deadline
        assert isinstance({"b": b, "c": c}[name].head.exception(), UpstreamTimeoutError)
    assert not a.head.done()
    assert not d.head.done()
    assert len(watch) == 0
    assert watch.queues == {}
    for r in (a, d):
        r.head.cancel()


async def test_head_deadlines_are_met_by_the_pools_watch_and_leave_nothing_behind(
    v1: FakeScheduler, v2: FakeScheduler, http: aiohttp.ClientSession
) -> None:
    # Stable's head timeout (minutes in production, 1 s here) is met by the pool's watch,
    # not by a timer per request.
    cfg = RouterConfig(upstream_head_timeout=1.0)
    async with running_router(table(v1.url, v2.url), cfg) as (base, router):
        assert router._pool is not None
        watch = router._pool.head_watch
        for _ in range(3):
            assert (await post(http, base, chat()))[0] == 200
        assert len(watch) == 0  # answered heads leave the watch at once
        v1.reset("stall")
        started = time.monotonic()
        status, _, body = await post(http, base, chat())
        waited = time.monotonic() - started
        assert (status, body["error"]["code"]) == (502, "bad_gateway")
        timeouts = router.state.metrics.registry.get_sample_value(
            "tinct_router_upstream_rejected_total",
            {"namespace": "llm", "release": "chat", "side": "stable", "reason": "head_timeout"},
        )
        assert timeouts == 1
        assert waited >= 1.0  # never before the deadline
        assert len(watch) == 0
        assert watch.queues == {}  # an emptied queue goes with its last timer
        v1.release_stall.set()
        v1.reset("ok")
        assert (await post(http, base, chat()))[0] == 200
