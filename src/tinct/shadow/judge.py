"""The optional LLM judge: asked about a sample of the pairs the cheap layers call different.

A release names a judge (``spec.shadow.judge.name``) that the comparer is configured with
(``tinct comparer --judge NAME=URL``, URL an OpenAI-compatible base such as
``http://judge:8000/v1``); a spec never names a URL, so it cannot send prompts anywhere. The
judge is the only place tinct sends prompt text to a third service, and only when named.

Each sampled pair is asked about twice, concurrently, with the answers in both orders (judges
favour the first answer they read), with :data:`PROMPT`, temperature 0 and JSON output; each
answer must be ``{"semantic_match": bool, "reasoning": str, "confidence": float}``. The
outcome:

- ``match`` / ``mismatch``: both orders agree, each at ``confidence >= minConfidence``; a
  match makes the pair ``same`` (layer ``judge``);
- ``low_confidence``: an order below ``minConfidence``; ``inconclusive``: the orders disagree;
- ``error`` (a status other than 2xx, an answer not of that shape), ``timeout``
  (``judge.timeoutSeconds`` for both calls), ``budget`` (over the comparer's concurrency or
  per-minute calls: never queued).

Every outcome but ``match`` leaves the pair ``different``; none blocks anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from tinct.api.v1alpha1.shadow import Judge

__all__ = ["PROMPT", "JudgeVerdict", "Judges", "judge_key_env"]

PROMPT = (
    "You compare two answers given to the same prompt by two versions of a language model. "
    "Decide whether they mean the same: the same facts, decisions, tool use and conclusions, "
    "whatever the wording. Reply with one JSON object only, no other text: "
    '{"semantic_match": true or false, "reasoning": "one or two sentences", '
    '"confidence": a number from 0 to 1}.'
)
#: Characters of the prompt and of each answer shown to the judge.
MAX_CHARS = 8000
#: Characters of the judge's reasoning kept.
MAX_REASONING = 500


@dataclass(frozen=True)
class JudgeVerdict:
    outcome: str
    confidence: float | None = None
    reasoning: str | None = None


def judge_key_env(name: str) -> str:
    """The variable holding the API key of judge ``name`` (optional)."""
    return "TINCT_JUDGE_API_KEY_" + name.upper().replace("-", "_")


class _JudgeError(Exception):
    pass


def _parse(doc: Any) -> tuple[bool, float, str]:
    try:
        content = doc["choices"][0]["message"]["content"]
        text = content.strip()
        if text.startswith("```"):
            text = text.strip("`").removeprefix("json").strip()
        said = json.loads(text)
        match, confidence = said["semantic_match"], float(said["confidence"])
        reasoning = str(said.get("reasoning") or "")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise _JudgeError from None
    if not isinstance(match, bool) or not 0 <= confidence <= 1:
        raise _JudgeError
    return match, confidence, reasoning


class Judges:
    """The judge endpoints the comparer knows, with its budget for calling them."""

    def __init__(
        self,
        endpoints: dict[str, str],
        *,
        concurrency: int = 4,
        per_minute: int = 120,
        environ: dict[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.endpoints = {name: url.rstrip("/") for name, url in endpoints.items()}
        self.keys = {name: env.get(judge_key_env(name), "") for name in endpoints}
        self.concurrency = concurrency
        self.per_minute = per_minute
        self._running = 0
        self._minute = 0
        self._calls = 0
        self._session: aiohttp.ClientSession | None = None

    def _take(self) -> bool:
        minute = int(time.monotonic() // 60)
        if minute != self._minute:
            self._minute, self._calls = minute, 0
        if self._running >= self.concurrency or self._calls >= self.per_minute:
            return False
        self._running += 1
        self._calls += 1
        return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _ask(self, url: str, key: str, judge: Judge, prompt: str, first: str, second: str) -> Any:
        assert self._session is not None
        body = {
            "model": judge.model,
            "temperature": 0,
            "response_format": {"type": "json_object"},
            "messages": [
                {"role": "system", "content": PROMPT},
                {
                    "role": "user",
                    "content": f"Prompt:\n{prompt[:MAX_CHARS]}\n\nAnswer A:\n{first[:MAX_CHARS]}\n\n"
                    f"Answer B:\n{second[:MAX_CHARS]}",
                },
            ],
        }
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self._session.post(f"{url}/chat/completions", json=body, headers=headers) as r:
            if r.status // 100 != 2:
                raise _JudgeError
            return _parse(await r.json(content_type=None))

    async def judge(self, judge: Judge, prompt: str, stable: str, candidate: str) -> JudgeVerdict:
        """Ask ``judge`` about two answers in both orders; see the module for the outcomes."""
        url = self.endpoints.get(judge.name)
        if url is None:
            return JudgeVerdict("error", reasoning=f"no judge named {judge.name!r} is configured")
        if not self._take():
            return JudgeVerdict("budget")
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            key = self.keys.get(judge.name, "")
            both = asyncio.gather(
                self._ask(url, key, judge, prompt, stable, candidate),
                self._ask(url, key, judge, prompt, candidate, stable),
            )
            (m1, c1, r1), (m2, c2, r2) = await asyncio.wait_for(both, judge.timeout_seconds)
        except TimeoutError:
            return JudgeVerdict("timeout")
        except (_JudgeError, aiohttp.ClientError, OSError, ValueError):
            return JudgeVerdict("error")
        finally:
            self._running -= 1
        confidence = min(c1, c2)
        reasoning = r1[:MAX_REASONING]
        if confidence < judge.min_confidence:
            return JudgeVerdict("low_confidence", confidence, reasoning)
        if m1 != m2:
            return JudgeVerdict("inconclusive", confidence, f"A/B: {r1}; B/A: {r2}"[:MAX_REASONING])
        return JudgeVerdict("match" if m1 else "mismatch", confidence, reasoning)
