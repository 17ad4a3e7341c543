"""Rows of the ``shadow_pairs`` lineage table, written in batches through the lineage writer.

A row holds the pair's release, cell and dye tag, both ModelVersions, the prompt's hash and
token estimate, both answers' status, size, time and hash, the verdict with the layer that
decided and its similarity, and the judge's outcome, confidence and reasoning (cut). Text --
the prompt and both answers -- is kept only when the release says ``shadow.keepText``, each
cut to ``shadow.maxTextBytes``; otherwise those columns are null.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from tinct.shadow.compare import Outcome
from tinct.shadow.intake import Accepted
from tinct.shadow.judge import JudgeVerdict
from tinct.shadow.pair import Pair

__all__ = ["Recorder", "row"]

_log = logging.getLogger(__name__)


def _cut(text: str, limit: int) -> str:
    return text.encode()[:limit].decode("utf-8", "ignore")


def row(
    pair: Pair, accepted: Accepted, outcome: Outcome, judge: JudgeVerdict | None, now: datetime
) -> dict[str, Any]:
    """The ``shadow_pairs`` row of one compared pair."""
    s = accepted.settings
    keep = s.keep_text
    return {
        "event_id": f"{pair.uid or pair.namespace + '/' + pair.release}/{pair.digest}",
        "release": pair.release,
        "namespace": pair.namespace or None,
        "uid": pair.uid,
        "table_version": pair.table_version,
        "cell": accepted.cell,
        "dye_tag": pair.dye_tag,
        "target": pair.target,
        "stable_model_version": s.stable_model_version,
        "candidate_model_version": s.candidate_model_version,
        "path": pair.request.path,
        "deterministic": outcome.deterministic,
        "prompt_sha256": outcome.prompt_sha256,
        "prompt_tokens": pair.request.prompt_tokens,
        "stable_status": pair.stable.status,
        "candidate_status": pair.candidate.status,
        "stable_bytes": outcome.stable_bytes,
        "candidate_bytes": outcome.candidate_bytes,
        "stable_ms": pair.stable.ms,
        "candidate_ms": pair.candidate.ms,
        "stable_sha256": outcome.stable_sha256 or None,
        "candidate_sha256": outcome.candidate_sha256 or None,
        "verdict": outcome.verdict,
        "reason": outcome.reason,
        "layer": outcome.layer,
        "detail": outcome.detail,
        "similarity": outcome.similarity,
        "judge_outcome": judge.outcome if judge else None,
        "judge_confidence": judge.confidence if judge else None,
        "judge_reasoning": judge.reasoning if judge else None,
        "prompt_text": _cut(outcome.prompt, s.max_text_bytes) if keep else None,
        "stable_text": _cut(outcome.stable_text, s.max_text_bytes) if keep else None,
        "candidate_text": _cut(outcome.candidate_text, s.max_text_bytes) if keep else None,
        "requested_at": datetime.fromtimestamp(pair.time, UTC) if pair.time else None,
        "recorded_at": now,
    }


class Recorder:
    """Collects rows and hands them to ``submit`` (the lineage writer) every ``batch_rows``
    rows or ``batch_seconds``, whichever comes first; ``on_done(rows, error)`` hears of each
    batch's fate."""

    def __init__(
        self,
        submit: Callable[[list[dict[str, Any]]], Future[int]],
        *,
        batch_rows: int = 500,
        batch_seconds: float = 2.0,
        on_done: Callable[[int, BaseException | None], None] = lambda n, e: None,
    ) -> None:
        self.submit = submit
        self.batch_rows = batch_rows
        self.batch_seconds = batch_seconds
        self.on_done = on_done
        self.rows: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[int]] = set()

    def add(self, r: dict[str, Any]) -> None:
        self.rows.append(r)
        if len(self.rows) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        rows, self.rows = self.rows, []
        fut = asyncio.wrap_future(self.submit(rows))
        self._pending.add(fut)

        def done(f: asyncio.Future[int]) -> None:
            self._pending.discard(f)
            error = f.exception() if not f.cancelled() else None
            if error is not None:
                _log.warning("%d shadow pair(s) not recorded: %s", len(rows), error)
            self.on_done(len(rows), error)

        fut.add_done_callback(done)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.batch_seconds)
            self.flush()

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick(), name="tinct-shadow-recorder")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
