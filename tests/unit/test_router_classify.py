"""Dye classification of OpenAI-style requests."""

from __future__ import annotations

import json

import pytest

from tinct.router.classify import CHAT_PATH, COMPLETIONS_PATH, ClassifyError, classify
from tinct.router.table import CompiledTable
from tinct_testing.router_fakes import table


@pytest.fixture
def ct() -> CompiledTable:
    return CompiledTable(table("http://127.0.0.1:1", "http://127.0.0.1:2"))


def chat(chars: int, **extra: object) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * chars}], **extra}
    ).encode()


@pytest.mark.parametrize(
    ("chars", "bucket"),
    [(0, "short"), (2048, "short"), (2049, "medium"), (16384, "medium"), (16385, "long"), (100_000, "long")],
)
def test_prompt_length_buckets_use_chars_per_token(ct: CompiledTable, chars: int, bucket: str) -> None:
    assert (
        classify(CHAT_PATH, chat(chars), {}, ct, role_trusted=True).tag
        == f"len:{bucket}+role:user+latency:low"
    )


def test_message_parts_and_multiple_messages_add_up(ct: CompiledTable) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "a" * 1000},
            {
                "role": "user",
                "content": [{"type": "text", "text": "b" * 1000}, {"type": "image_url", "image_url": {}}],
            },
            {"role": "assistant", "content": None},
            {"role": "user", "content": "c" * 100},
        ]
    }
    assert classify(CHAT_PATH, json.dumps(body).encode(), {}, ct, role_trusted=True).tag.startswith(
        "len:medium+"
    )


@pytest.mark.parametrize(
    ("prompt", "bucket"),
    [
        ("x" * 2048, "short"),
        (["x" * 1500, "y" * 1500], "medium"),
        (list(range(600)), "medium"),
        ([list(range(300)), list(range(5000))], "long"),
    ],
)
def test_completions_prompt_forms(ct: CompiledTable, prompt: object, bucket: str) -> None:
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    assert classify(COMPLETIONS_PATH, body, {}, ct, role_trusted=True).tag.startswith(f"len:{bucket}+")


def test_role_outside_the_list_counts_as_default(ct: CompiledTable) -> None:
    assert "+role:admin+" in classify(CHAT_PATH, chat(1), {"X-User-Role": "admin"}, ct, role_trusted=True).tag
    assert "+role:user+" in classify(CHAT_PATH, chat(1), {"X-User-Role": "root"}, ct, role_trusted=True).tag
    assert "+role:user+" in classify(CHAT_PATH, chat(1), {}, ct, role_trusted=True).tag


def test_untrusted_role_header_never_grants_a_role(ct: CompiledTable) -> None:
    for role in ("admin", "audit", "user"):
        tag = classify(CHAT_PATH, chat(1), {"X-User-Role": role}, ct, role_trusted=False).tag
        assert "+role:user+" in tag


def test_latency_from_header_else_stream_else_default(ct: CompiledTable) -> None:
    assert classify(CHAT_PATH, chat(1), {"X-Latency-Class": "high"}, ct, role_trusted=True).tag.endswith(
        "latency:high"
    )
    assert classify(CHAT_PATH, chat(1, stream=True), {}, ct, role_trusted=True).tag.endswith("latency:high")
    assert classify(
        CHAT_PATH, chat(1, stream=True), {"X-Latency-Class": "low"}, ct, role_trusted=True
    ).tag.endswith("latency:low")
    assert classify(CHAT_PATH, chat(1, stream=False), {}, ct, role_trusted=True).tag.endswith("latency:low")
    assert classify(CHAT_PATH, chat(1), {"X-Latency-Class": "bogus"}, ct, role_trusted=True).tag.endswith(
        "latency:low"
    )


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        (CHAT_PATH, b"", "empty_body"),
        (CHAT_PATH, b"{nope", "invalid_json"),
        (CHAT_PATH, b"\xff\xfe\x00", "invalid_json"),
        (CHAT_PATH, b"[1, 2]", "invalid_json"),
        (CHAT_PATH, b'{"messages": "hi"}', "missing_messages"),
        (COMPLETIONS_PATH, b'{"prompt": 5}', "missing_prompt"),
        (COMPLETIONS_PATH, b'{"model": "m"}', "missing_prompt"),
    ],
)
def test_malformed_bodies_raise_a_400(ct: CompiledTable, path: str, body: bytes, code: str) -> None:
    with pytest.raises(ClassifyError) as e:
        classify(path, body, {}, ct, role_trusted=True)
    assert e.value.status == 400
    assert e.value.body()["error"]["code"] == code
