"""The router measures tokens, not bytes: the meter alone, then through a real router in front
of emulated engines and of backends that answer exact bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tinct.emulator import Behaviour, Emulator, serving
from tinct.histogram import Histogram
from tinct.router.config import RouterConfig
from tinct.router.metrics import ITL_BUCKETS, LATENCY_BUCKETS, RouterMetrics
from tinct.router.summing import Family, merge, parse, render
from tinct.router.tokens import MAX_EVENT, MAX_QUEUED, SWEEP_EVERY, Meter, MeterSweep
from tinct_testing.router_fakes import HostileBackend, running_router, table

SHORT = "len:short+role:user+latency:low"
STREAMED = "len:short+role:user+latency:high"  # the test table's streamClass is high


def chunk(text: str | None = None, **extra: Any) -> bytes:
    delta = {} if text is None else {"content": text}
    doc = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}], **extra}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


STREAM = (
    chunk("")  # the role's empty content: not a token
    + chunk("Hel")
    + b": keep-alive comment\n\n"
    + chunk("lo")
    + b"event: message\ndata: " + json.dumps({"choices": [{"delta": {"content": "!"}}]}).encode() + b"\n\n"
    + chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 5})
    + b"data: [DONE]\n\n"
)  # fmt: skip


def meter(status: int = 200, stream: bool = True, asked: bool = True) -> Meter:
    return Meter(0.0, status, stream, asked, Histogram(ITL_BUCKETS))


def fed(body: bytes, pieces: Iterator[bytes] | None = None, **kw: Any) -> Meter:
    m = meter(**kw)
    for piece in pieces if pieces is not None else [body]:
        m.feed(piece)
    m.finish(True)
    return m


def split(body: bytes, size: int) -> Iterator[bytes]:
    return (body[i : i + size] for i in range(0, len(body), size))


@pytest.mark.parametrize("size", [1, 2, 7, 64, 1 << 20])
def test_a_stream_split_anywhere_reads_the_same(size: int) -> None:
    m = fed(STREAM, split(STREAM, size))
    assert (m.events, m.usage, m.output_tokens, m.done) == (3, 5, 5, True)
    assert m.violations == set()
    assert m.first is not None


def test_an_event_per_chunk_as_engines_send_reads_the_same() -> None:
    events = [e + b"\n\n" for e in STREAM.split(b"\n\n") if e]
    m = fed(STREAM, iter(events))
    assert (m.events, m.usage, m.output_tokens, m.done, m.violations) == (3, 5, 5, True, set())


def test_a_lone_cr_ends_a_line_inside_a_one_line_chunk() -> None:
    # CR alone is a line end in SSE: this chunk is an event line and a data line, and the
    # engine-shaped reading of a one-line event must not take it as one line.
    m = fed(b'event: message\rdata: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n')
    assert (m.events, m.done, m.violations) == (1, True, set())


async def test_a_stream_is_read_apart_from_its_relay_with_the_times_its_chunks_passed() -> None:
    sweep = MeterSweep()
    itl = Histogram(ITL_BUCKETS)
    m = Meter(0.0, 200, True, True, itl, sweep)
    m.feed(chunk("a"))
    time.sleep(0.02)
    m.feed(chunk("b"))
    assert (m.events, m.first) == (0, None), "nothing is read while the chunks pass"
    assert sweep.meters == [m]
    await asyncio.sleep(SWEEP_EVERY * 2)  # the sweep's timer reads them
    assert (m.events, sweep.meters) == (2, [])
    assert itl.total >= 0.02, "the gap is the one between the chunks passing, not between their reading"
    m.feed(chunk(None, usage={"completion_tokens": 9}))
    m.feed(b"data: [DONE]\n\n")
    m.finish(True)  # what is still queued is read before the request is counted
    assert (m.usage, m.done, m.violations) == (9, True, set())


async def test_a_stream_s_queue_is_bounded() -> None:
    m = Meter(0.0, 200, True, True, Histogram(ITL_BUCKETS), MeterSweep())
    big = chunk("x" * MAX_QUEUED)
    m.feed(big[:100])
    m.feed(big[100:])  # over the bound: read at once, no sweep needed
    assert (m.events, m._body_size) == (1, 0)
    # A byte at a time: each chunk's own cost counts, so the queue holds no more in memory.
    tiny = chunk("y" * 1000)
    for b in tiny:
        m.feed(bytes([b]))
    assert len(m._body) < len(tiny), "the queue was read before it held every byte apart"
    m.finish(True)
    assert m.events == 2


def test_crlf_framing_and_a_last_event_without_its_blank_line_are_read() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    m = fed(crlf, split(crlf, 3))
    assert (m.events, m.done, m.violations) == (3, True, set())
    m = fed(STREAM[: -len(b"\n\n")])
    assert (m.done, m.violations) == (True, set())


def test_without_usage_the_content_events_are_the_tokens() -> None:
    body = chunk("a") + chunk("b") + b"data: [DONE]\n\n"
    assert fed(body).output_tokens == 2


@pytest.mark.parametrize(
    ("body", "kw", "kinds"),
    [
        (json.dumps({"choices": []}).encode() + b"\n\n" + b"data: [DONE]\n\n", {}, {"sse_framing"}),
        (chunk("a") + chunk("b"), {}, {"sse_no_done"}),
        (b"data: oops\n\n" + b"data: [DONE]\n\n", {}, {"sse_framing"}),
        (b'data: {"object":"chat.completion.chunk","delta":{"content":"x"}}\n\ndata: [DONE]\n\n', {}, {"no_choices"}),
        (b"Too Many Requests", {"status": 429, "stream": False}, {"error_body"}),
        (b'{"detail": "busy"}', {"status": 503, "stream": False}, {"error_body"}),
        (b'{"error": {"message": "slow down", "code": "rate_limit_exceeded"}}', {"status": 429, "stream": False}, set()),
        (b'{"object": "chat.completion", "usage": {}}', {"stream": False, "asked": False}, {"no_choices"}),
        (b'{"choices": [{"message": {"content": "x"}}]}', {"stream": False, "asked": True}, {"not_sse"}),
        (b'{"choices": [{"message": {"content": "x"}}]}', {"stream": False, "asked": False}, set()),
    ],
    ids=["unframed", "no-done", "not-json", "no-choices", "429-text", "5xx-other", "429-openai", "whole-no-choices", "asked-stream", "whole-ok"],
)  # fmt: skip
def test_each_contract_break_is_one_violation_of_its_kind(
    body: bytes, kw: dict[str, Any], kinds: set[str]
) -> None:
    assert fed(body, split(body, 5), **kw).violations == kinds


def test_a_cut_stream_is_not_blamed_for_its_missing_end() -> None:
    m = meter()
    m.feed(chunk("a"))
    m.finish(False)
    assert (m.events, m.violations, m.output_tokens) == (1, set(), 1)


def test_an_event_without_end_is_bounded_and_one_violation() -> None:
    m = meter()
    for _ in range(MAX_EVENT // 4096 + 2):
        m.feed(b"x" * 4096)
    m.feed(chunk("a"))
    m.finish(True)
    assert m.violations == {"sse_framing"}
    assert (m.looking, m.events) == (False, 0), "the rest of that stream is not looked at"


def test_a_whole_answer_gives_its_usage_and_its_time_to_the_last_byte() -> None:
    body = json.dumps(
        {"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 12}}
    ).encode()
    m = fed(body, split(body, 10), stream=False, asked=False)
    assert (m.output_tokens, m.violations) == (12, set())
    assert m.ttft is not None
    assert m.ttft > 0


# --- through the router ---------------------------------------------------------------------


@pytest.fixture
async def engines() -> AsyncIterator[tuple[Emulator, Emulator]]:
    quick = {"ttft_ms": 0.0, "itl_ms": 0.0, "output_tokens": 5}
    async with serving(Behaviour(model="v1", **quick)) as a, serving(Behaviour(model="v2", **quick)) as b:
        yield a, b


def samples(text: str, family: str, **labels: str) -> dict[str, float]:
    """sample name (+ ``le``/``kind``/``status_class``) -> value of ``family`` where ``labels`` match."""
    fam = parse(text).get(family.removesuffix("_total"))  # a counter's family drops _total
    out: dict[str, float] = {}
    for (name, lab), value in fam.samples.items() if fam else ():
        d = dict(lab)
        if all(d.get(k) == v for k, v in labels.items()):
            extra = [d[k] for k in ("le", "kind", "status_class") if k in d]
            key = name + (f"[{','.join(extra)}]" if extra else "")
            out[key] = out.get(key, 0.0) + value
    return out


async def scrape(base: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        return await r.text()


async def test_streamed_answers_give_ttft_itl_and_usage_tokens_per_side_and_cell(
    engines: tuple[Emulator, Emulator],
) -> None:
    v1, v2 = engines
    v2.set(ttft_ms=300, itl_ms=5)  # a slow first token; the role event and the head come at once
    async with (
        running_router(table(v1.url, v2.url, default_weight=100)) as (base, _),
        openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client,
    ):
        for _ in range(3):
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert text == "Emulated answer from v2."
        got = await scrape(base)
    ttft = samples(got, "tinct_router_time_to_first_token_seconds", side="candidate", dye_tag=STREAMED)
    assert ttft["tinct_router_time_to_first_token_seconds_count"] == 3
    assert ttft["tinct_router_time_to_first_token_seconds_bucket[0.25]"] == 0, (
        "the first token came after 300 ms"
    )
    # Gaps as relayed: their count is exact, their size depends on how the bytes arrive.
    itl = samples(got, "tinct_router_inter_token_latency_seconds", side="candidate", dye_tag=STREAMED)
    assert itl["tinct_router_inter_token_latency_seconds_count"] == 3 * 4
    tokens = samples(got, "tinct_router_output_tokens", side="candidate", dye_tag=STREAMED)
    assert (tokens["tinct_router_output_tokens_count"], tokens["tinct_router_output_tokens_sum"]) == (3, 15)
    assert samples(got, "tinct_router_time_to_first_token_seconds", side="stable") == {}
    assert samples(got, "tinct_router_contract_violations_total") == {}


async def test_throttling_is_counted_apart_from_server_errors(engines: tuple[Emulator, Emulator]) -> None:
    v1, v2 = engines
    v1.set(throttle_rate=0.5)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with running_router(table(v1.url, v2.url)) as (base, _), aiohttp.ClientSession() as http:
        for _ in range(4):
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                await r.read()
        v1.set(throttle_rate=0, error_rate=1)
        async with http.post(f"{base}/v1/chat/completions", json=body) as r:
            assert r.status == 503
        got = await scrape(base)
    classes = samples(got, "tinct_router_responses_total", side="stable", dye_tag=SHORT)
    assert classes == {
        "tinct_router_responses_total[2xx]": 2,
        "tinct_router_responses_total[429]": 2,
        "tinct_router_responses_total[5xx]": 1,
    }
    whole = samples(got, "tinct_router_time_to_first_token_seconds", side="stable", dye_tag=SHORT)
    assert whole["tinct_router_time_to_first_token_seconds_count"] == 2, "only answers with tokens"
    assert samples(got, "tinct_router_contract_violations_total") == {}, "OpenAI error objects"


@pytest.mark.parametrize(
    ("contract", "stream", "kinds"),
    [
        ("sse-unframed", True, ["sse_framing", "sse_no_done"]),  # bare JSON events, no [DONE] either
        ("sse-no-done", True, ["sse_no_done"]),
        ("no-choices", True, ["no_choices"]),
        ("no-choices", False, ["no_choices"]),
        ("error-body", False, ["error_body"]),
    ],
)
async def test_a_contract_break_is_counted_for_its_side_and_cell(
    engines: tuple[Emulator, Emulator], contract: str, stream: bool, kinds: list[str]
) -> None:
    v1, v2 = engines
    v2.set(contract=contract, throttle_rate=1.0 if contract == "error-body" else 0.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with (
        running_router(table(v1.url, v2.url, default_weight=100)) as (base, _),
        aiohttp.ClientSession() as http,
    ):
        for _ in range(2):
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                await r.read()
        got = await scrape(base)
    tag = STREAMED if stream else SHORT
    bad = samples(got, "tinct_router_contract_violations_total", side="candidate", dye_tag=tag)
    assert bad == {f"tinct_router_contract_violations_total[{kind}]": 2 for kind in kinds}
    assert samples(got, "tinct_router_contract_violations_total", side="stable") == {}


@pytest.mark.parametrize(
    ("answer", "kinds"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 37\r\n\r\n"
            b'{"choices":[{"delta":{"content":"x"}}',
            {"sse_framing", "sse_no_done"},
        ),
        (
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nslow down",
            {"error_body"},
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            {"not_sse", "no_choices"},
        ),
    ],
    ids=["unframed-sse", "429-text", "json-to-a-stream"],
)
async def test_the_client_gets_a_broken_answer_byte_for_byte(answer: bytes, kinds: set[str]) -> None:
    async def write(w: asyncio.StreamWriter) -> None:
        w.write(answer)

    backend = await HostileBackend(write).start()
    try:
        async with (
            running_router(table(backend.url, backend.url.replace("127.0.0.1", "localhost"))) as (base, _),
            aiohttp.ClientSession() as http,
        ):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with http.post(f"{base}/v1/chat/completions", json=body) as r:
                got = await r.read()
            text = await scrape(base)
    finally:
        await backend.stop()
    assert got == answer.split(b"\r\n\r\n", 1)[1]
    bad = samples(text, "tinct_router_contract_violations_total", side="stable")
    assert bad == {f"tinct_router_contract_violations_total[{kind}]": 1 for kind in kinds}


async def test_no_token_metrics_reads_nothing(engines: tuple[Emulator, Emulator]) -> None:
    v1, v2 = engines
    config = dataclasses.replace(RouterConfig(trust_role_from=("127.0.0.1/32",)), measure_tokens=False)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with running_router(table(v1.url, v2.url), config) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body) as r:
            assert (await r.read()).endswith(b"data: [DONE]\n\n")
        got = await scrape(base)
    assert samples(got, "tinct_router_time_to_first_token_seconds") == {}
    assert samples(got, "tinct_router_responses_total", side="stable") == {
        "tinct_router_responses_total[2xx]": 1
    }


def test_token_families_sum_across_workers() -> None:
    """What the parent of ``--workers`` does with two workers' expositions."""
    texts = []
    for ttft in (0.2, 0.4):
        m = RouterMetrics()
        key = ("llm", "chat", "candidate", SHORT)
        m.ttft_series[key] = h = Histogram(LATENCY_BUCKETS)
        h.observe(ttft)
        m.violations[(*key, "sse_no_done")] = 1
        m.counts[("llm", "chat", "candidate", "v2", SHORT, 429)] = 2
        from prometheus_client import generate_latest

        texts.append(generate_latest(m.registry).decode())
    total: dict[str, Family] = {}
    for t in texts:
        merge(total, parse(t))
    summed = render(total.values()).decode()
    ttft = samples(summed, "tinct_router_time_to_first_token_seconds", side="candidate")
    assert ttft["tinct_router_time_to_first_token_seconds_count"] == 2
    assert ttft["tinct_router_time_to_first_token_seconds_sum"] == pytest.approx(0.6)
    assert ttft["tinct_router_time_to_first_token_seconds_bucket[0.25]"] == 1
    assert samples(summed, "tinct_router_contract_violations_total") == {
        "tinct_router_contract_violations_total[sse_no_done]": 2
    }
    assert samples(summed, "tinct_router_responses_total") == {"tinct_router_responses_total[429]": 4}
