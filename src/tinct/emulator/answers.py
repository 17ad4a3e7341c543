"""What an emulated answer says: placeholder text, JSON objects, tool calls, drift and noise.

Nothing here is a model: the answers are made up so that the comparison of two engines'
answers (shadow traffic) has something to compare, in the ways real models differ:

- **Text**: "Emulated answer from MODEL." repeated to the answer's length.
- **Drift** (``drift_rate``, ``drift_marker``): a share of the prompts (chosen by a hash of the
  prompt, so the same prompt drifts every time), or every prompt containing the marker, gets
  another answer altogether ("Drifted reply: ..."), as a model that learnt something else.
- **Noise** (``noise_rate`` for sampled requests -- temperature above 0 and no seed -- and
  ``noise_rate_deterministic`` for the others, as batch nondeterminism does to temperature 0):
  that share of the answers has one word replaced by another at random.
- **JSON** (the request's ``response_format`` is ``json_object`` or ``json_schema``): the
  content is a JSON object ``{"answer": TEXT, "confidence": 0.9, "sources": [...]}``, with
  ``json_add_field`` added and ``json_drop_field`` left out.
- **Tool calls** (the request lists ``tools`` of type function): one call per tool (up to
  :data:`MAX_CALLS`), arguments ``{"query": ..., "limit": 3}``, ``finish_reason`` tool_calls;
  ``tool_order`` keeps, reverses or shuffles them, ``tool_drop`` leaves the last one out.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

from tinct.emulator.behaviour import Behaviour
from tinct.text import prompt_text

__all__ = ["MAX_CALLS", "Content", "Sampler", "compose", "is_deterministic"]

MAX_CALLS = 8
_WORDS = ("Emulated", " answer", " from")
_DRIFT = ("Drifted", " reply:", " the", " candidate", " says", " something", " else")
_NOISE = ("perhaps", "indeed", "roughly", "certainly", "maybe", "surely", "often", "rarely")


def is_deterministic(doc: dict[str, Any]) -> bool:
    """A request that asks for one answer: temperature 0, or a seed."""
    t = doc.get("temperature")
    zero = isinstance(t, int | float) and not isinstance(t, bool) and t == 0
    return zero or isinstance(doc.get("seed"), int)


def _wants_json(doc: dict[str, Any]) -> bool:
    rf = doc.get("response_format")
    return isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")


def _tool_names(doc: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in doc.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names[:MAX_CALLS]


@dataclass
class Sampler:
    """Which answers get noise: exactly the configured share over time (each answer adds the
    rate, a whole unit picks it), the word and its place at random."""

    sampled: float = 0.0
    deterministic: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def noisy(self, b: Behaviour, deterministic: bool) -> bool:
        if deterministic:
            self.deterministic += b.noise_rate_deterministic
            hit = self.deterministic >= 1.0
            self.deterministic -= 1.0 if hit else 0.0
        else:
            self.sampled += b.noise_rate
            hit = self.sampled >= 1.0
            self.sampled -= 1.0 if hit else 0.0
        return hit


@dataclass
class Content:
    """An answer's content: its tokens (text, or JSON text in pieces), or its tool calls."""

    tokens: list[str]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def _drifts(b: Behaviour, prompt: str) -> bool:
    if b.drift_marker and b.drift_marker in prompt:
        return True
    if b.drift_rate <= 0:
        return False
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < b.drift_rate


def _words(n: int, model: str, drift: bool) -> list[str]:
    words = _DRIFT if drift else (*_WORDS, f" {model}", ".")
    out = []
    for i in range(n):
        w = words[i % len(words)]
        out.append(" " + w if i and i % len(words) == 0 else w)
    return out


def _noise(tokens: list[str], rng: random.Random) -> list[str]:
    """``tokens`` with one word (not a full stop) replaced by another."""
    words = [i for i, t in enumerate(tokens) if t.strip().isalnum()]
    if not words:
        return tokens
    i = rng.choice(words)
    lead = " " if tokens[i].startswith(" ") else ""
    return [*tokens[:i], lead + rng.choice(_NOISE), *tokens[i + 1 :]]


def _json_tokens(text: str, b: Behaviour) -> list[str]:
    obj: dict[str, Any] = {"answer": text.strip(), "confidence": 0.9, "sources": ["emulated"]}
    if b.json_drop_field:
        obj.pop(b.json_drop_field, None)
    if b.json_add_field:
        obj[b.json_add_field] = "added by the emulator"
    doc = json.dumps(obj)
    step = max(1, len(doc) // 8)
    return [doc[i : i + step] for i in range(0, len(doc), step)]


def _calls(names: list[str], prompt: str, rid: str, b: Behaviour, rng: random.Random) -> list[dict[str, Any]]:
    query = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    calls = [
        {
            "id": f"call_{rid}_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"query": query, "limit": 3})},
        }
        for i, name in enumerate(names)
    ]
    if b.tool_drop and calls:
        calls = calls[:-1]
    if b.tool_order == "reversed":
        calls.reverse()
    elif b.tool_order == "shuffled":
        rng.shuffle(calls)
    return calls


def compose(
    doc: dict[str, Any],
    n: int,
    b: Behaviour,
    sampler: Sampler,
    rid: str,
    chat: bool,
    model: str | None = None,
) -> Content:
    """The content of the answer to ``doc``: ``n`` tokens of text (JSON when asked), or tool
    calls when the (chat) request offers tools. ``model`` is who answers (default the base's:
    a LoRA adapter answers in its own name)."""
    prompt = prompt_text(doc)
    names = _tool_names(doc) if chat else []
    if names:
        return Content([], _calls(names, prompt, rid, b, sampler.rng))
    tokens = _words(n, model or b.model, _drifts(b, prompt))
    if sampler.noisy(b, is_deterministic(doc)):
        tokens = _noise(tokens, sampler.rng)
    if _wants_json(doc):
        return Content(_json_tokens("".join(tokens), b))
    return Content(tokens)
