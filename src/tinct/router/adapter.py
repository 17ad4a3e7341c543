"""A LoRA adapter candidate: the pods that hold it, and the request and answer as they pass.

A table whose candidate names an ``adapter`` (the served name the operator loaded into
stable's pods) sends the candidate's share of a cell to one of the candidate's
``addresses`` (the pods holding it, in turn), with the JSON body's ``"model"`` value
rewritten to the served name (:func:`with_model`): every other byte goes as the client sent
it. The answer names the base model again (:class:`NameBack`, on the bytes as they stream,
so a client never sees the served name), and an engine that answers 404 or 400 for it (the
pod lost the adapter, a restart) sends the request once to stable, the base model, with
``X-Fallback-Reason: adapter_missing`` (:func:`reason_for_adapter`); enough of those eject
the candidate, as any failure does.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tinct.router.fallback import Reason

#: What a pod is to the router (its :class:`~tinct.router.table.Upstream`).
P = TypeVar("P")

__all__ = ["AdapterRoute", "NameBack", "model_span", "reason_for_adapter", "with_model"]

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_WS = b" \t\r\n"


def _skip_ws(body: bytes, i: int) -> int:
    while i < len(body) and body[i] in _WS:
        i += 1
    return i


def _value_end(body: bytes, i: int) -> int:
    """The index just past the JSON value starting at ``i`` (a valid document assumed)."""
    if body[i : i + 1] == b'"':
        m = _STRING.match(body, i)
        return m.end() if m else len(body)
    depth = 0
    while i < len(body):
        c = body[i : i + 1]
        if c == b'"':
            m = _STRING.match(body, i)
            i = m.end() if m else len(body)
            continue
        if c in (b"{", b"["):
            depth += 1
        elif c in (b"}", b"]"):
            if depth == 0:
                return i
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == b"," and depth == 0:
            return i
        i += 1
    return i


def model_span(body: bytes) -> tuple[int, int] | None:
    """Where the top-level ``"model"`` string value (quotes included) is in ``body``; the last
    one, as a JSON parser takes it. None when the body is no object with such a value."""
    i = _skip_ws(body, 0)
    if body[i : i + 1] != b"{":
        return None
    i = _skip_ws(body, i + 1)
    found: tuple[int, int] | None = None
    while i < len(body) and body[i : i + 1] == b'"':
        key = _STRING.match(body, i)
        if key is None:
            return None
        i = _skip_ws(body, key.end())
        if body[i : i + 1] != b":":
            return None
        i = _skip_ws(body, i + 1)
        end = _value_end(body, i)
        if key.group() == b'"model"':
            found = (i, end) if body[i : i + 1] == b'"' else None
        i = _skip_ws(body, end)
        if body[i : i + 1] != b",":
            break
        i = _skip_ws(body, i + 1)
    return found


def with_model(body: bytes, name: str) -> tuple[bytes, str] | None:
    """``body`` with its ``"model"`` value replaced by ``name``, and the model it named;
    None when it names none this way."""
    span = model_span(body)
    if span is None:
        return None
    start, end = span
    try:
        sent = json.loads(body[start:end])
    except ValueError:
        return None
    return body[:start] + json.dumps(name).encode() + body[end:], sent


def reason_for_adapter(status: int) -> Reason | None:
    """The engine does not have the adapter (vLLM 404, SGLang 400): the base model answers."""
    return "adapter_missing" if status in (400, 404) else None


@dataclass
class AdapterRoute(Generic[P]):
    """The served name of a table's adapter candidate and the pods (their base URLs) holding it."""

    served: str
    pods: tuple[P, ...]
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self) -> P | None:
        """The next pod in turn; None when no pod holds the adapter."""
        if not self.pods:
            return None
        return self.pods[next(self._turn) % len(self.pods)]


class NameBack:
    """Writes an answer on to ``sink`` with the served name, wherever it stands as a JSON
    string, put back to the base model's: a sequence split across chunks is held back only
    as long as it might still be one."""

    def __init__(self, served: str, base: str, sink: Callable[[bytes], None]) -> None:
        self.old = json.dumps(served).encode()
        self.new = json.dumps(base).encode()
        self.sink = sink
        self.held = b""

    def __call__(self, data: bytes) -> None:
        data = (self.held + data).replace(self.old, self.new)
        keep = 0
        for n in range(min(len(self.old) - 1, len(data)), 0, -1):
            if data.endswith(self.old[:n]):
                keep = n
                break
        self.held = data[len(data) - keep :] if keep else b""
        out = data[: len(data) - keep]
        if out:
            self.sink(out)

    def flush(self) -> None:
        """What was held back at the end of the answer."""
        if self.held:
            self.sink(self.held)
            self.held = b""
