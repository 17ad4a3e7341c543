"""The three layers of the comparison, cheapest first; each pure.

1. **Structure** (:func:`structure_diff`): the shapes of two JSON values, JSON-Schema style.
   Every field stable's answer has must be in the candidate's with the same type (string,
   number, boolean, object, array; an integer and a float are both numbers, and a null on
   either side matches any type, as an optional field does); a field the candidate *adds* is
   tolerated; array items are compared by the shape of their first item. Applied to the two
   answer objects (the message's content and tool calls are left to the other layers) and,
   when the request asked for JSON output (``response_format``), to the two contents parsed.
2. **Tool calls** (:func:`tool_calls_differ`): by name and argument JSON (parsed, so
   spacing and key order do not count) as a multiset: independent calls in another order are
   equivalent, a missing or extra call is not.
3. **Text** (:func:`text_agreement`): for a deterministic request (``temperature`` 0 or a
   ``seed``) normalised equality (Unicode NFC, whitespace runs as one space, trimmed);
   otherwise rapidfuzz's token-set ratio (0-1) at or above the release's ``similarity``, and
   the candidate's length over stable's within ``lengthRatio``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz

from tinct.shadow.assemble import ToolCall

__all__ = [
    "TextResult",
    "canonical_json",
    "deterministic",
    "normalise",
    "project",
    "structure_diff",
    "text_agreement",
    "tool_calls_differ",
    "wants_json",
]

#: Fields of the answer whose value (not only shape) is compared by another layer.
_LEFT_TO_LAYERS = frozenset({"content", "tool_calls", "text", "refusal"})


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def structure_diff(
    stable: Any, candidate: Any, path: str = "$", *, skip: frozenset[str] = frozenset()
) -> str | None:
    """The first difference in shape of ``candidate`` from ``stable``, as ``path: what``; None
    when the candidate has every field of stable's with the same type (added fields allowed).

    ``skip`` names fields (at any depth) whose shape is left to another layer.
    """
    a, b = _kind(stable), _kind(candidate)
    if a == "null" or b == "null":
        return None
    if a != b:
        return f"{path}: {a} in stable's answer, {b} in the candidate's"
    if a == "object":
        for key, value in stable.items():
            if key in skip:
                continue
            if key not in candidate:
                return f"{path}.{key}: missing from the candidate's answer"
            found = structure_diff(value, candidate[key], f"{path}.{key}", skip=skip)
            if found:
                return found
    elif a == "array" and stable and candidate:
        return structure_diff(stable[0], candidate[0], f"{path}[0]", skip=skip)
    return None


def wants_json(request: dict[str, Any]) -> bool:
    """The request asked for JSON output (``response_format`` json_object or json_schema)."""
    rf = request.get("response_format")
    return isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")


def deterministic(request: dict[str, Any]) -> bool:
    """The request asks for one answer: ``temperature`` 0 or a ``seed``."""
    t = request.get("temperature")
    zero = isinstance(t, int | float) and not isinstance(t, bool) and t == 0
    return zero or (isinstance(request.get("seed"), int) and not isinstance(request.get("seed"), bool))


def project(stable: Any, candidate: Any) -> Any:
    """``candidate`` with the object fields stable's value does not have left out, at any depth:
    what the text layer compares of a JSON answer whose added fields were tolerated."""
    if isinstance(stable, dict) and isinstance(candidate, dict):
        return {k: project(stable[k], candidate[k]) for k in stable if k in candidate}
    if isinstance(stable, list) and isinstance(candidate, list) and stable:
        return [project(stable[min(i, len(stable) - 1)], c) for i, c in enumerate(candidate)]
    return candidate


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _call_key(call: ToolCall) -> tuple[str, str]:
    try:
        args = canonical_json(json.loads(call.arguments)) if call.arguments.strip() else ""
    except ValueError:
        args = call.arguments.strip()
    return call.name, args


def tool_calls_differ(stable: Sequence[ToolCall], candidate: Sequence[ToolCall]) -> str | None:
    """How the candidate's tool calls differ from stable's as a multiset; None when equal."""
    a = Counter(_call_key(c) for c in stable)
    b = Counter(_call_key(c) for c in candidate)
    if a == b:
        return None
    missing = sorted((a - b).elements())
    extra = sorted((b - a).elements())
    parts = []
    if missing:
        parts.append("missing " + ", ".join(f"{n}({args})" for n, args in missing))
    if extra:
        parts.append("extra " + ", ".join(f"{n}({args})" for n, args in extra))
    return ("tool calls: " + "; ".join(parts))[:500]


_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Unicode NFC, whitespace runs as one space, trimmed."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


@dataclass(frozen=True)
class TextResult:
    same: bool
    similarity: float
    detail: str | None = None


def text_agreement(
    stable: str,
    candidate: str,
    *,
    exact: bool,
    similarity: float,
    length_min: float,
    length_max: float,
) -> TextResult:
    """Whether two answer texts agree, and their token-set ratio (0-1).

    ``exact`` (a deterministic request): normalised equality. Otherwise the token-set ratio
    must reach ``similarity`` and the candidate's length over stable's lie within
    ``[length_min, length_max]`` (two empty texts agree).
    """
    a, b = normalise(stable), normalise(candidate)
    ratio = 1.0 if a == b else fuzz.token_set_ratio(a, b) / 100.0
    if exact:
        return TextResult(a == b, ratio, None if a == b else "deterministic request, the texts differ")
    if not a or not b:
        same = a == b
        return TextResult(same, ratio, None if same else "one answer is empty")
    length = len(b) / len(a)
    if not length_min <= length <= length_max:
        return TextResult(False, ratio, f"length ratio {length:.2f} outside [{length_min:g}, {length_max:g}]")
    if ratio < similarity:
        return TextResult(False, ratio, f"similarity {ratio:.2f} below {similarity:g}")
    return TextResult(True, ratio)
