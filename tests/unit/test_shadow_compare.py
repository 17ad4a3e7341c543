"""The comparer's layers on hand-made answers: structure, JSON content, tool calls, text, SSE."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tinct.api.v1alpha1.shadow import Shadow
from tinct.shadow.assemble import AssembleError, ToolCall, assemble
from tinct.shadow.compare import compare
from tinct.shadow.layers import structure_diff, text_agreement, tool_calls_differ
from tinct.shadow.pair import PairError, parse_pair

SETTINGS = Shadow()


def chat(
    content: str | None, *, finish: str = "stop", calls: list[tuple[str, str]] = (), **extra: Any
) -> dict[str, Any]:  # type: ignore[assignment]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    doc.update(extra)
    return doc


def sse(pieces: list[str], *, finish: str = "stop", calls: list[tuple[str, str]] = ()) -> bytes:  # type: ignore[assignment]
    def ev(delta: dict[str, Any], fin: str | None = None) -> str:
        doc = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}  # fmt: skip
        return f"data: {json.dumps(doc)}\n\n"

    out = ev({"role": "assistant", "content": ""})
    out += "".join(ev({"content": p}) for p in pieces)
    for i, (name, args) in enumerate(calls):
        half = len(args) // 2
        out += ev({"tool_calls": [{"index": i, "id": f"c{i}", "type": "function",
                                   "function": {"name": name, "arguments": args[:half]}}]})  # fmt: skip
        out += ev({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
    out += ev({}, finish) + "data: [DONE]\n\n"
    return out.encode()


def line(
    stable: dict[str, Any] | bytes,
    candidate: dict[str, Any] | bytes,
    *,
    request: dict[str, Any] | None = None,
    target: str = "candidate",
    stable_extra: dict[str, Any] | None = None,
    candidate_extra: dict[str, Any] | None = None,
) -> bytes:
    def answer(a: dict[str, Any] | bytes, extra: dict[str, Any]) -> dict[str, Any]:
        raw = a if isinstance(a, bytes) else json.dumps(a).encode()
        kind = "text/event-stream" if isinstance(a, bytes) else "application/json"
        return {"status": 200, "content_type": kind, "body_b64": base64.b64encode(raw).decode(),
                "truncated": False, "ms": 10.0, "error": None, **extra}  # fmt: skip

    req = request or {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    doc = {
        "v": 1, "namespace": "llm", "release": "chat", "uid": "u-1", "table_version": 3,
        "dye_tag": "len:short+role:user+latency:low", "target": target, "time": 1764843000.0,
        "request": {"path": "/v1/chat/completions", "body": json.dumps(req), "prompt_tokens": 2},
        "stable": answer(stable, stable_extra or {}),
        "candidate": answer(candidate, candidate_extra or {}),
    }  # fmt: skip
    return json.dumps(doc).encode()


def verdict(
    stable: Any, candidate: Any, settings: Shadow = SETTINGS, **kw: Any
) -> tuple[str, str | None, str | None]:
    out = compare(parse_pair(line(stable, candidate, **kw)), settings)
    return out.verdict, out.layer, out.reason or out.detail


DET = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hello"}]}
SAMPLED = {"model": "m", "temperature": 0.8, "messages": [{"role": "user", "content": "hello"}]}
JSON_REQ = {**DET, "response_format": {"type": "json_object"}}


# --- structure ------------------------------------------------------------------------------


def test_structure_tolerates_added_fields_and_flags_missing_or_retyped_ones() -> None:
    stable = {"a": 1, "b": {"c": "x", "d": [1, 2]}, "e": None}
    assert structure_diff(stable, {**stable, "extra": True}) is None
    assert structure_diff(stable, {"a": 2.5, "b": {"c": "y", "d": [], "new": 1}, "e": "now a string"}) is None
    assert structure_diff(stable, {"a": 1, "e": None}) == "$.b: missing from the candidate's answer"
    assert (
        structure_diff(stable, {**stable, "a": "1"})
        == "$.a: number in stable's answer, string in the candidate's"
    )
    assert (
        structure_diff({"l": [{"k": 1}]}, {"l": [{"j": 1}]})
        == "$.l[0].k: missing from the candidate's answer"
    )


def test_a_whole_answer_with_an_added_field_agrees_and_one_missing_usage_differs() -> None:
    assert verdict(chat("hi there"), chat("hi there", system_fingerprint="fp"), request=DET) == (
        "same",
        "text",
        None,
    )
    missing = chat("hi there")
    del missing["usage"]
    assert verdict(chat("hi there"), missing, request=DET) == (
        "different",
        "structure",
        "$.usage: missing from the candidate's answer",
    )
    assert verdict(chat("hi"), chat("hi", finish="length"), request=DET)[:2] == ("different", "structure")


_BASE = {"answer": "Paris", "confidence": 0.9, "sources": ["atlas"]}


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        ({**_BASE, "citations": ["x"]}, ("same", "text", None)),
        (
            {k: v for k, v in _BASE.items() if k != "confidence"},
            ("different", "structure", "$.content.confidence: missing from the candidate's answer"),
        ),
        ({**_BASE, "sources": "atlas"}, ("different", "structure")),
        (
            "Paris, I think",
            ("different", "structure", "$.content: stable answered JSON, the candidate did not"),
        ),
        # The same shape with another value is a text difference (deterministic request).
        ({**_BASE, "answer": "Lyon"}, ("different", "text")),
    ],
    ids=["added-field", "dropped-field", "retyped-field", "not-json", "other-value"],
)
def test_json_content_added_field_passes_dropped_or_retyped_field_fails(
    candidate: dict[str, object] | str, expected: tuple[str | None, ...]
) -> None:
    """``expected``: the verdict, its layer and (where given) its reason."""
    answer = candidate if isinstance(candidate, str) else json.dumps(candidate)
    got = verdict(chat(json.dumps(_BASE)), chat(answer), request=JSON_REQ)
    assert got[: len(expected)] == expected


# --- tool calls -----------------------------------------------------------------------------

CALLS = [("search", '{"q": "tinct", "limit": 3}'), ("weather", '{"city": "Paris"}')]


def test_tool_calls_are_a_multiset_by_name_and_argument_json() -> None:
    a = [ToolCall(n, args) for n, args in CALLS]
    assert tool_calls_differ(a, a[::-1]) is None
    assert tool_calls_differ(a, [ToolCall("search", '{"limit":3,"q":"tinct"}'), a[1]]) is None
    assert tool_calls_differ(a, a[:1]) == 'tool calls: missing weather({"city":"Paris"})'
    assert tool_calls_differ(a, [*a, a[0]]) == 'tool calls: extra search({"limit":3,"q":"tinct"})'
    assert verdict(
        chat(None, finish="tool_calls", calls=CALLS), chat(None, finish="tool_calls", calls=CALLS[::-1])
    ) == (
        "same",
        "tools",
        None,
    )
    assert verdict(
        chat(None, finish="tool_calls", calls=CALLS), chat(None, finish="tool_calls", calls=CALLS[:1])
    )[:2] == (
        "different",
        "tools",
    )


def test_streamed_tool_calls_are_assembled_by_index() -> None:
    a = assemble(sse([], finish="tool_calls", calls=CALLS), "text/event-stream")
    assert a.tool_calls == [ToolCall(n, args) for n, args in CALLS]
    assert a.finish_reason == "tool_calls"
    streamed = sse([], finish="tool_calls", calls=CALLS[::-1])
    assert verdict(sse([], finish="tool_calls", calls=CALLS), streamed)[:2] == ("same", "tools")


# --- text -----------------------------------------------------------------------------------


def test_deterministic_text_is_normalised_equality() -> None:
    cafe = "caf\u00e9  au\n lait "
    assert text_agreement(
        cafe, "cafe\u0301 au lait", exact=True, similarity=0.8, length_min=0.5, length_max=2
    ).same
    assert not text_agreement(
        "the answer is 4", "the answer is 5", exact=True, similarity=0, length_min=0, length_max=9
    ).same
    assert verdict(chat("the answer is 4"), chat("the answer is 5"), request=DET)[:2] == ("different", "text")
    assert verdict(chat("the answer is 4"), chat("the  answer is 4\n"), request=DET)[:2] == ("same", "text")
    # A seed makes a request deterministic too.
    seeded = {"model": "m", "seed": 7, "temperature": 1.0, "messages": []}
    assert verdict(chat("a b c"), chat("c b a"), request=seeded)[:2] == ("different", "text")


def test_sampled_text_is_judged_by_token_set_ratio_and_length() -> None:
    stable = "Paris is the capital of France and its largest city"
    reordered = "the capital of France is Paris, and its largest city"
    assert verdict(chat(stable), chat(reordered), request=SAMPLED)[:2] == ("same", "text")
    other = "Bananas grow in tropical climates on large herbaceous plants"
    v = compare(parse_pair(line(chat(stable), chat(other), request=SAMPLED)), SETTINGS)
    assert (v.verdict, v.layer) == ("different", "text")
    assert v.similarity is not None
    assert v.similarity < 0.8
    assert v.detail is not None
    assert v.detail.startswith("similarity")
    long = stable + " " + " ".join([stable] * 3)
    assert verdict(chat(stable), chat(long), request=SAMPLED)[2] == "length ratio 4.06 outside [0.5, 2]"
    strict = Shadow(similarity=1.0)
    assert verdict(chat(stable), chat(reordered), strict, request=SAMPLED)[:2] == ("different", "text")


def test_streamed_and_whole_answers_compare_alike() -> None:
    streamed = sse(["Paris ", "is the", " capital."])
    a = assemble(streamed, "text/event-stream")
    assert (a.content, a.finish_reason) == ("Paris is the capital.", "stop")
    assert a.doc["choices"][0]["message"]["role"] == "assistant"
    assert verdict(streamed, sse(["Paris is ", "the capital."]), request=DET) == ("same", "text", None)
    assert verdict(streamed, sse(["Lyon is the capital."]), request=DET)[:2] == ("different", "text")


def test_completions_stream_is_assembled_from_text() -> None:
    body = b"".join(
        f"data: {json.dumps({'id': 'c', 'object': 'text_completion', 'choices': [{'index': 0, 'text': t, 'finish_reason': f}]})}\n\n".encode()
        for t, f in (("Once ", None), ("upon", None), ("", "length"))
    )
    a = assemble(body + b"data: [DONE]\n\n", "text/event-stream")
    assert (a.content, a.finish_reason) == ("Once upon", "length")


# --- what is not compared -------------------------------------------------------------------


def test_skips_and_candidate_errors() -> None:
    ok = chat("hello")
    assert verdict(ok, ok, stable_extra={"truncated": True}) == ("skipped", None, "too_long")
    assert verdict(ok, ok, candidate_extra={"truncated": True}) == ("skipped", None, "too_long")
    assert verdict(ok, ok, stable_extra={"status": 503}) == ("skipped", None, "stable_error")
    assert verdict(b"\xff\xfe binary", ok) == ("skipped", None, "binary")
    assert verdict(ok, ok, candidate_extra={"error": "timeout", "status": None}) == (
        "candidate_error",
        "structure",
        "the candidate's answer: timeout",
    )
    assert verdict(ok, ok, candidate_extra={"status": 500})[:2] == ("candidate_error", "structure")
    assert verdict(ok, b"data: {not json\n\n")[:2] == ("candidate_error", "structure")
    with pytest.raises(AssembleError):
        assemble(b"plain text", "text/plain")


def test_lines_that_are_no_pair_are_refused_with_the_field_named() -> None:
    good = json.loads(line(chat("a"), chat("a")))
    for mutate, needle in (
        (lambda d: d.update(v=2), "v:"),
        (lambda d: d.pop("release"), "release"),
        (lambda d: d.update(target="both"), "target"),
        (lambda d: d["candidate"].update(error="exploded"), "candidate.error"),
    ):
        doc = json.loads(json.dumps(good))
        mutate(doc)
        with pytest.raises(PairError, match=needle):
            parse_pair(json.dumps(doc).encode())
    with pytest.raises(PairError):
        parse_pair(b"{not json")
    # Same line, same digest: a pair sent twice is one row.
    assert parse_pair(line(chat("a"), chat("a"))).digest == parse_pair(line(chat("a"), chat("a"))).digest
