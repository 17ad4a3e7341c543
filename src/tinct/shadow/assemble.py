"""An answer's bytes as one whole OpenAI answer: SSE streams are assembled, JSON is parsed.

A streamed answer (``text/event-stream``) is read event by event (``data:`` lines, ``[DONE]``
ends it): its chunks' top-level fields are kept (a later one wins, as ``usage`` comes last),
the first choice's ``delta.content`` (chat) or ``text`` (completions) is concatenated,
``delta.tool_calls`` are merged by their ``index`` (name set once, arguments concatenated),
and the last ``finish_reason`` is the answer's. The result has the shape of the whole
answer, so a streamed and a whole answer are compared alike. Only the first choice is
compared (requests with ``n`` above 1 are compared on their first answer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AssembleError", "Assembled", "ToolCall", "assemble"]


class AssembleError(ValueError):
    """Bytes that are no OpenAI answer; ``reason`` is ``binary`` (not UTF-8) or ``not_json``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


@dataclass
class Assembled:
    """A whole answer: the object, and what the layers compare of its first choice."""

    doc: dict[str, Any]
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


def _choice(doc: dict[str, Any]) -> dict[str, Any]:
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _calls(raw: Any) -> list[ToolCall]:
    out = []
    for c in raw if isinstance(raw, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            out.append(ToolCall(str(fn.get("name") or ""), str(fn.get("arguments") or "")))
    return out


def _whole(doc: dict[str, Any]) -> Assembled:
    choice = _choice(doc)
    message = choice.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        calls = _calls(message.get("tool_calls"))
    else:
        content = choice.get("text")
        calls = []
    finish = choice.get("finish_reason")
    return Assembled(
        doc,
        content if isinstance(content, str) else None,
        calls,
        finish if isinstance(finish, str) else None,
    )


def _events(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:"))
        if not data or data.strip() == "[DONE]":
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            raise AssembleError("not_json", f"an event is not JSON: {data[:80]!r}") from None
        if isinstance(doc, dict):
            events.append(doc)
    return events


def _stream(text: str) -> Assembled:
    events = _events(text)
    if not events:
        raise AssembleError("not_json", "a stream without one JSON event")
    doc: dict[str, Any] = {}
    parts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    chat = False
    role = "assistant"
    for ev in events:
        doc.update({k: v for k, v in ev.items() if k != "choices"})
        choice = _choice(ev)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            chat = True
            role = str(delta.get("role") or role)
            if isinstance(delta.get("content"), str):
                parts.append(delta["content"])
            for c in delta.get("tool_calls") or []:
                if not isinstance(c, dict):
                    continue
                at = c.get("index")
                index: int = at if isinstance(at, int) else len(calls)
                slot = calls.setdefault(index, {"name": "", "arguments": "", "id": "", "type": "function"})
                slot["id"] = str(c.get("id") or slot["id"])
                raw = c.get("function")
                fn: dict[str, Any] = raw if isinstance(raw, dict) else {}
                slot["name"] = str(fn.get("name") or slot["name"])
                slot["arguments"] += str(fn.get("arguments") or "")
        elif isinstance(choice.get("text"), str):
            parts.append(choice["text"])
        if isinstance(choice.get("finish_reason"), str):
            finish = choice["finish_reason"]
    content = "".join(parts)
    tool_calls = [calls[i] for i in sorted(calls)]
    if chat:
        message: dict[str, Any] = {"role": role, "content": content if parts or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": c["type"],
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in tool_calls
            ]
        doc["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
    else:
        doc["choices"] = [{"index": 0, "text": content, "finish_reason": finish}]
    return Assembled(
        doc,
        content if parts or not tool_calls else None,
        [ToolCall(c["name"], c["arguments"]) for c in tool_calls],
        finish,
    )


def assemble(body: bytes, content_type: str) -> Assembled:
    """The whole answer in ``body``: assembled from SSE events, or parsed from JSON.

    Raises:
        AssembleError: not UTF-8 (``binary``), or neither a JSON object nor an event stream
            of JSON events (``not_json``).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise AssembleError("binary", "the answer is not UTF-8 text") from None
    if "text/event-stream" in content_type.lower() or text.lstrip().startswith("data:"):
        return _stream(text)
    try:
        doc = json.loads(text)
    except ValueError:
        raise AssembleError("not_json", "the answer is neither JSON nor an event stream") from None
    if not isinstance(doc, dict):
        raise AssembleError("not_json", "the answer is not a JSON object")
    return _whole(doc)
