"""Classify an OpenAI-style request into a dye tag.

The body is parsed once, by ``orjson`` (twice as fast as ``json`` on a long prompt, where
parsing was half of what the router spent on a request); a body ``orjson`` refuses is parsed
again by ``json``, which decides, so what is accepted is what ``json`` accepts (orjson refuses
more: ``NaN``, lone surrogates, a byte order mark). The prompt size is the sum of the lengths
of the strings that make the prompt (message contents, text parts, ``prompt``), taken from
the parsed objects without re-serialising anything. Token-id prompts count one token per id.

Errors are :class:`ClassifyError` with the HTTP status and an OpenAI-shaped error body, so a
client's SDK shows a readable message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from tinct.router.table import CompiledTable, Route

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
#: Paths whose requests are classified; anything else passes to stable untouched.
CLASSIFIED_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})


class ClassifyError(Exception):
    """A request that cannot be classified; answered with ``status`` and never proxied."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        """The error as an OpenAI client expects it."""
        return {"error": {"message": self.message, "type": "invalid_request_error", "code": self.code}}


def _content_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    n += len(text)
            elif isinstance(part, str):
                n += len(part)
        return n
    return 0


def chat_chars(doc: Mapping[str, Any]) -> int:
    """Characters of the prompt of a chat request (``messages[*].content``)."""
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise ClassifyError(400, "missing_messages", "'messages' must be a list of messages")
    n = 0
    for m in messages:
        if isinstance(m, dict):
            c = m.get("content")
            n += len(c) if isinstance(c, str) else _content_chars(c)
    return n


def completion_size(doc: Mapping[str, Any]) -> tuple[int, int]:
    """(characters, token ids) of the prompt of a completion request."""
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return len(prompt), 0
    if isinstance(prompt, list):
        chars = tokens = 0
        for p in prompt:
            if isinstance(p, str):
                chars += len(p)
            elif isinstance(p, int):
                tokens += 1
            elif isinstance(p, list):
                tokens += len(p)
        return chars, tokens
    raise ClassifyError(400, "missing_prompt", "'prompt' must be a string, a list of strings or token ids")


def _stdlib_loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise ClassifyError(400, "invalid_json", "the request body is not valid JSON") from None


def _has_float_ids(doc: dict[str, Any]) -> bool:
    """A completion prompt holding a float where ``json`` may have read a token id."""
    prompt = doc.get("prompt")
    return isinstance(prompt, list) and float in map(type, prompt)


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    if not body:
        raise ClassifyError(400, "empty_body", "the request body is empty; send a JSON object")
    try:
        doc = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError):
        doc = _stdlib_loads(body)
    else:
        if isinstance(doc, dict) and _has_float_ids(doc):
            doc = _stdlib_loads(body)  # orjson reads an integer past 64 bits as a float
    if not isinstance(doc, dict):
        raise ClassifyError(400, "invalid_json", "the request body must be a JSON object")
    return doc


def classify(
    path: str, body: bytes, headers: Mapping[str, str], table: CompiledTable, *, role_trusted: bool
) -> Route:
    """The route (dye tag, cell, weight) of a request to ``path``, one of :data:`CLASSIFIED_PATHS`.

    ``role_trusted`` says whether the request came from a peer allowed to set the role
    header (:mod:`tinct.router.trust`); when it did not, the role is the default.

    Raises:
        ClassifyError: the body is not a JSON object of the endpoint's shape.
    """
    return classify_doc(path, parse_body(body), headers, table, role_trusted=role_trusted)


def classify_doc(
    path: str, doc: Mapping[str, Any], headers: Mapping[str, str], table: CompiledTable, *, role_trusted: bool
) -> Route:
    """:func:`classify` of a body already parsed by :func:`parse_body`."""
    if path == CHAT_PATH:
        estimate = chat_chars(doc) / table.chars_per_token
    else:
        chars, ids = completion_size(doc)
        estimate = chars / table.chars_per_token + ids
    for bound, name in table.bounds:
        if estimate <= bound:
            bucket = name
            break
    else:  # pragma: no cover - the last bound is infinite
        bucket = table.bounds[-1][1]
    role = headers.get(table.role_header) if role_trusted else None
    if role is None or role not in table.roles:
        role = table.role_default
    latency = headers.get(table.latency_header)
    if latency is None or latency not in table.latencies:
        latency = (
            table.stream_class
            if table.stream_class is not None and doc.get("stream") is True
            else table.latency_default
        )
    return table.routes[(bucket, role, latency)]


__all__ = [
    "CHAT_PATH",
    "CLASSIFIED_PATHS",
    "COMPLETIONS_PATH",
    "ClassifyError",
    "chat_chars",
    "classify",
    "classify_doc",
    "completion_size",
    "parse_body",
]
