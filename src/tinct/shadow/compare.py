"""The verdict on one pair: ``same``, ``different``, ``candidate_error`` or ``skipped``.

In this order (the first that decides names its ``layer``):

1. **Can it be compared?** A stable answer cut at ``maxBytes`` or the candidate's
   (``truncated``) makes the pair ``skipped`` (``too_long``); stable's own failure (no
   status, a status other than 2xx, an answer that is not UTF-8 or not JSON/SSE) makes it
   ``skipped`` (``stable_error``, ``binary``); so does a request body that is not JSON
   (``bad_request``).
2. **Did the candidate answer?** An error the router saw (``timeout``, ``unreachable``,
   ``reset``, ``bad_answer``), a status other than 2xx, or an answer that is not an OpenAI
   answer: ``candidate_error`` (layer ``structure``).
3. **Structure**, **tool calls**, **text**: :mod:`tinct.shadow.layers`. ``finish_reason``
   must be the same; a JSON answer (``response_format``) is compared by shape and then as
   text on stable's fields only (a field the candidate adds passes).

The optional judge (:mod:`tinct.shadow.judge`) may turn a ``different`` of the tool-call or
text layer into ``same`` (layer ``judge``); the structure layer's differences stand.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tinct.api.v1alpha1.shadow import Shadow
from tinct.shadow.assemble import Assembled, AssembleError, assemble
from tinct.shadow.layers import (
    canonical_json,
    deterministic,
    project,
    structure_diff,
    text_agreement,
    tool_calls_differ,
    wants_json,
)
from tinct.shadow.pair import Answer, Pair, PairError
from tinct.text import prompt_text

__all__ = ["Outcome", "compare"]

_SKIP = frozenset({"content", "tool_calls", "text", "refusal"})


@dataclass
class Outcome:
    """What the comparison of one pair found, and what its row keeps."""

    verdict: str
    layer: str | None = None
    reason: str | None = None
    detail: str | None = None
    similarity: float | None = None
    deterministic: bool = False
    #: The prompt as text (messages or prompt), and both answers' texts, for the judge and keepText.
    prompt: str = ""
    stable_text: str = ""
    candidate_text: str = ""
    prompt_sha256: str = ""
    stable_sha256: str = ""
    candidate_sha256: str = ""
    stable_bytes: int = 0
    candidate_bytes: int = 0

    @property
    def judgeable(self) -> bool:
        """A difference the judge may look at (not one of structure)."""
        return self.verdict == "different" and self.layer in ("tools", "text")


def _text(a: Assembled) -> str:
    if a.tool_calls:
        calls = "; ".join(f"{c.name}({c.arguments})" for c in a.tool_calls)
        return f"{a.content or ''}\n[tool calls] {calls}".strip()
    return a.content or ""


def _ok(answer: Answer) -> bool:
    return answer.status is not None and 200 <= answer.status < 300


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compare(pair: Pair, settings: Shadow) -> Outcome:
    """The verdict on ``pair`` under a release's ``settings``."""
    body = pair.request.body.encode()
    out = Outcome("skipped", prompt_sha256=_sha(body))
    try:
        request = json.loads(body)
    except ValueError:
        request = None
    if not isinstance(request, dict):
        out.reason = "bad_request"
        return out
    out.deterministic = deterministic(request)
    out.prompt = prompt_text(request, roles=True)
    out.prompt_sha256 = _sha(out.prompt.encode())
    try:
        stable_body, candidate_body = pair.stable.body(), pair.candidate.body()
    except PairError:
        out.reason = "bad_pair"
        return out
    out.stable_bytes, out.candidate_bytes = len(stable_body), len(candidate_body)
    out.stable_sha256, out.candidate_sha256 = _sha(stable_body), _sha(candidate_body)
    if pair.stable.truncated or pair.candidate.truncated:
        out.reason = "too_long"
        return out
    if pair.stable.error is not None or not _ok(pair.stable):
        out.reason = "stable_error"
        return out
    try:
        stable = assemble(stable_body, pair.stable.content_type)
    except AssembleError as e:
        out.reason = "binary" if e.reason == "binary" else "stable_error"
        return out
    out.stable_text = _text(stable)
    if pair.candidate.error is not None or not _ok(pair.candidate):
        why = pair.candidate.error or f"status {pair.candidate.status}"
        return _decided(out, "candidate_error", "structure", f"the candidate's answer: {why}")
    try:
        candidate = assemble(candidate_body, pair.candidate.content_type)
    except AssembleError as e:
        return _decided(out, "candidate_error", "structure", f"the candidate's answer: {e}")
    out.candidate_text = _text(candidate)
    return _layers(out, request, stable, candidate, settings)


def _decided(out: Outcome, verdict: str, layer: str, detail: str | None = None) -> Outcome:
    out.verdict, out.layer, out.detail = verdict, layer, detail[:500] if detail else None
    return out


def _layers(
    out: Outcome, request: dict[str, Any], stable: Assembled, candidate: Assembled, settings: Shadow
) -> Outcome:
    found = structure_diff(stable.doc, candidate.doc, skip=_SKIP)
    if found is None and stable.finish_reason != candidate.finish_reason:
        found = f"finish_reason {stable.finish_reason!r} in stable's answer, {candidate.finish_reason!r} in the candidate's"
    stable_text, candidate_text = stable.content or "", candidate.content or ""
    if found is None and wants_json(request) and stable.content is not None:
        try:
            a = json.loads(stable.content)
        except ValueError:
            a = None  # stable did not answer JSON: its text is compared as text
        if a is not None:
            try:
                b = json.loads(candidate.content or "")
            except ValueError:
                found = "$.content: stable answered JSON, the candidate did not"
            else:
                found = structure_diff(a, b, "$.content")
                stable_text, candidate_text = canonical_json(a), canonical_json(project(a, b))
    if found is not None:
        return _decided(out, "different", "structure", found)
    if stable.tool_calls or candidate.tool_calls:
        differ = tool_calls_differ(stable.tool_calls, candidate.tool_calls)
        if differ is not None:
            return _decided(out, "different", "tools", differ)
        if not stable_text and not candidate_text:
            return _decided(out, "same", "tools")
    ratio = settings.length_ratio
    text = text_agreement(
        stable_text,
        candidate_text,
        exact=out.deterministic,
        similarity=settings.similarity,
        length_min=ratio.min,
        length_max=ratio.max,
    )
    out.similarity = text.similarity
    return _decided(out, "same" if text.same else "different", "text", text.detail)
