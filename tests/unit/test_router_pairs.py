"""The pieces of mirroring that need no router: the token bucket, the bounded answer copy,
the pair's wire form, the comparer URL, and the sender's batches (against a real receiver)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tinct.router.choose import salted_point
from tinct.router.metrics import ShadowMetrics
from tinct.router.pairs import (
    BATCH_PAIRS,
    AnswerCopy,
    Destination,
    Held,
    PairSender,
    TokenSource,
    pair_line,
)
from tinct.router.shadow import _Budget, prompt_tokens
from tinct.router.table import CompiledTable, salt
from tinct.router.upstream import UpstreamPool
from tinct_testing.router_fakes import PairReceiver, table


def test_the_token_bucket_holds_a_minute_and_refills_continuously() -> None:
    b = _Budget()
    assert b.spend(600, 1000, now=0.0)
    assert b.spend(400, 1000, now=0.0)
    assert not b.spend(1, 1000, now=0.0)  # empty
    assert not b.spend(100, 1000, now=5.9)  # 98.3 tokens back at 1000 a minute
    assert b.spend(100, 1000, now=6.1)  # 101.7 back
    assert b.spend(1000, 1000, now=600.0)  # full again, never more than a minute's worth
    assert not b.spend(1, 1000, now=600.0)
    assert not _Budget().spend(1001, 1000, now=0.0)  # a prompt over the minute's budget never goes


def test_the_answer_copy_keeps_up_to_its_limit_and_says_it_cut() -> None:
    c = AnswerCopy(10)
    c.add(b"abcd")
    c.add(b"efgh")
    assert not c.truncated
    c.add(b"ijklmn")
    c.add(b"more")
    assert c.truncated
    assert c.size == 10
    assert b"".join(c.chunks) == b"abcdefghij"
    exact = AnswerCopy(4)
    exact.add(b"abcd")
    assert not exact.truncated
    assert exact.size == 4


def test_a_pair_line_is_the_comparers_wire_format() -> None:
    stable, candidate = AnswerCopy(64), AnswerCopy(64)
    stable.status, stable.content_type, stable.ms = 200, "application/json", 12.3456
    stable.add(b'{"ok": "\xc3\xa9"}')
    candidate.error, candidate.ms = "timeout", 60000.0
    line = pair_line(
        namespace="llm",
        release="chat",
        uid="u-1",
        table_version=7,
        dye_tag="len:short+role:user+latency:low",
        target="candidate",
        time=1764843000.1234,
        path="/v1/chat/completions",
        body='{"messages": [{"content": "caf\u00e9\\n"}]}'.encode(),
        prompt_tokens=3,
        stable=stable,
        candidate=candidate,
    )
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc["v"] == 1
    assert doc["uid"] == "u-1"
    assert doc["table_version"] == 7
    assert doc["time"] == 1764843000.123
    assert json.loads(doc["request"]["body"]) == {"messages": [{"content": "caf\u00e9\n"}]}
    assert base64.b64decode(doc["stable"]["body_b64"]) == b'{"ok": "\xc3\xa9"}'
    assert doc["stable"] == {
        "status": 200,
        "content_type": "application/json",
        "body_b64": doc["stable"]["body_b64"],
        "truncated": False,
        "ms": 12.346,
        "error": None,
    }
    assert doc["candidate"]["status"] is None
    assert doc["candidate"]["error"] == "timeout"
    assert doc["candidate"]["body_b64"] == ""


@pytest.mark.parametrize(
    ("url", "origin", "target"),
    [
        ("http://tinct-comparer:8090", ("tinct-comparer", 8090, False), b"/v1/pairs"),
        ("https://cmp.example/base/", ("cmp.example", 443, True), b"/base/v1/pairs"),
        ("http://10.0.0.1", ("10.0.0.1", 80, False), b"/v1/pairs"),
    ],
)
def test_the_comparer_url_gives_origin_and_path(
    url: str, origin: tuple[str, int, bool], target: bytes
) -> None:
    d = Destination.parse(url)
    assert d.origin == origin
    assert d.target == target


@pytest.mark.parametrize("url", ["ftp://x", "tinct-comparer:8090", "http://", "http://x/?a=1"])
def test_a_comparer_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="--comparer"):
        Destination.parse(url)


def test_the_token_file_is_read_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINCT_COMPARER_TOKEN", "from-env")
    assert TokenSource().read() == "from-env"
    f = tmp_path / "token"
    f.write_text("first\n")
    source = TokenSource(f)
    assert source.read() == "first"
    f.write_text("second-token\n")
    assert source.read() == "second-token"
    f.unlink()
    with pytest.raises(FileNotFoundError):
        source.read()


def test_mirroring_draws_its_own_point() -> None:
    """The shadow salt is ``<release>/shadow``: a session's mirror choice is independent of
    its live one."""
    ct = CompiledTable(table("http://a:1", "http://b:2"))
    keys = [f"s-{i}".encode() for i in range(200)]
    live = [salted_point(ct.sticky_base, k) < 50 for k in keys]
    shadow = [salted_point(salt("chat/shadow"), k) < 50 for k in keys]
    assert live != shadow
    assert 60 < sum(shadow) < 140
    assert salted_point(salt("chat"), b"k") == salted_point(ct.sticky_base, b"k")


def test_prompt_tokens_are_the_classifiers_estimate() -> None:
    ct = CompiledTable(table("http://a:1", "http://b:2"))
    chat = {"messages": [{"role": "user", "content": "x" * 9}, {"content": [{"type": "text", "text": "yy"}]}]}
    assert prompt_tokens("/v1/chat/completions", chat, ct) == 3  # 11 characters at 4 a token
    assert prompt_tokens("/v1/completions", {"prompt": [[1, 2, 3], "abcd"]}, ct) == 4


async def test_the_sender_batches_pairs_and_frees_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINCT_COMPARER_TOKEN", "t")
    rx = await PairReceiver(token="t").start()
    pool = UpstreamPool(connect_timeout=2.0)
    held = Held(cap=10_000_000)
    metrics = ShadowMetrics(CollectorRegistry())
    try:
        sender = PairSender(Destination.parse(rx.url), TokenSource(), pool, held, metrics, max_pairs=200)
        lines = [json.dumps({"n": i}).encode() + b"\n" for i in range(150)]
        assert all(sender.put(line, ("llm", "chat")) for line in lines)
        assert held.bytes == sum(len(line) for line in lines)
        sender.start()
        got = await rx.wait_for(150, timeout=30)
        await sender.close()
        assert [p["n"] for p in got] == list(range(150))
        assert rx.batches == [BATCH_PAIRS, BATCH_PAIRS, 150 - 2 * BATCH_PAIRS]
        assert held.bytes == 0
        assert metrics.pairs_sent.labels("llm", "chat")._value.get() == 150
        # Over the queue's bound: dropped at once and counted, never waited for.
        small = PairSender(Destination.parse(rx.url), TokenSource(), pool, held, metrics, max_pairs=2)
        assert [small.put(b"{}\n", ("llm", "chat")) for _ in range(3)] == [True, True, False]
        assert metrics.skipped.labels("llm", "chat", "send_dropped")._value.get() == 1
        tight = PairSender(Destination.parse(rx.url), TokenSource(), pool, Held(cap=5), metrics, max_pairs=9)
        assert not tight.put(b"123456\n", ("llm", "chat"))
        await small.close()
        assert held.bytes == 0
    finally:
        await pool.close()
        await rx.stop()
