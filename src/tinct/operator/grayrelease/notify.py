"""Notifications of release transitions: webhooks of the operator's configuration, chosen by
each release's ``spec.notify``.

The operator knows its webhooks by name (``tinct operator --notifier NAME=TYPE:URL``,
``TINCT_NOTIFIERS``, the chart's ``operator.notifiers``); a release names the ones it wants,
optionally only for some transitions (``spec.notify[].on``), and no other URL is ever posted
to. Three types:

- ``json``: one JSON document per transition (:func:`payload`);
- ``slack``: a Slack-compatible incoming webhook (``text`` and one coloured attachment),
  which Mattermost and Rocket.Chat accept too;
- ``cloudevents``: a CloudEvent in structured mode over HTTP (``application/cloudevents+json``),
  type ``io.tinct.grayrelease.<reason>``, source the release's API path.

A transition is posted once its status is recorded (never for a decision whose write failed:
the round repeats it and posts it then). Posting never holds a round: the round queues the
notification (:meth:`Dispatcher.post`, bounded, the oldest dropped and counted when full)
and one task per webhook delivers its queue in order, each attempt with a deadline,
retried with exponential backoff on connection errors, timeouts, 429 and 5xx, given up
after the configured attempts. Every outcome is counted in the operator's metrics
(``tinct_release_notifications_total{notifier,result}``).

A dead or hung webhook costs seconds, not hours: each has a **circuit breaker**
(:class:`Breaker`). After ``break_after`` failed attempts in a row (across notifications) it
opens: the notification in hand and every one that comes while it is open are dropped at
once and counted (``result="dropped"``), instead of each taking its attempts times the
timeout in a queue the later ones wait behind. After ``retry_after`` seconds one
notification is tried again, once: an answer closes the breaker, a failure opens it again.
``tinct_release_notifier_open{notifier}`` is 1 while it is open,
``tinct_release_notifier_opened_total`` counts its openings. The id of a notification is the
release's uid and the transition's number, the same at every attempt, so a receiver can
drop a repeat. Messages name a webhook by its name, never its URL (a Slack URL is a secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from tinct.api.v1alpha1.grayrelease import GrayRelease, HistoryEntry
from tinct.operator.grayrelease.metrics import ReleaseMetrics
from tinct.text import listed

__all__ = ["KINDS", "Breaker", "Dispatcher", "Notifier", "parse_notifiers", "payload", "render"]

NotifierKind = Literal["json", "slack", "cloudevents"]
KINDS: tuple[NotifierKind, ...] = ("json", "slack", "cloudevents")
#: Notifications waiting per webhook; beyond, the oldest is dropped (and counted).
QUEUE = 1000
#: Bytes of a webhook's answer read (and ignored).
MAX_ANSWER = 64 * 1024
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_COLOR = {"Promoted": "good", "RolledBack": "danger", "Failed": "danger", "Paused": "warning"}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notifier:
    """A webhook of the operator's configuration."""

    name: str
    kind: NotifierKind
    url: str = field(repr=False)


def parse_notifiers(
    raw: str | Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[Notifier, ...]:
    """``NAME=TYPE:URL`` items (``--notifier`` values, or ``TINCT_NOTIFIERS`` ``,``-separated).

    ``URL`` may be ``env:VARIABLE``, read from the environment: a Secret's key mounted as a
    variable keeps a Slack URL out of the Deployment's spec.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Notifier] = {}
    for item in listed(raw):
        name, eq, rest = item.partition("=")
        kind, colon, url = rest.partition(":")
        name, kind = name.strip(), kind.strip()
        if not eq or not colon:
            raise ValueError(f"{name or item!r}: give NAME=TYPE:URL, TYPE one of {', '.join(KINDS)}")
        if not _NAME.match(name) or len(name) > 63:
            raise ValueError(f"{name!r} is not a notifier name (a DNS label: a-z, 0-9, '-')")
        if kind not in KINDS:
            raise ValueError(f"{name}: type {kind!r} is not one of {', '.join(KINDS)}")
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        if url.startswith("env:"):
            variable = url[4:]
            url = env.get(variable, "")
            if not url:
                raise ValueError(f"{name}: the environment variable {variable} holding its URL is not set")
        if not re.match(r"^https?://[^\s/]+", url):
            raise ValueError(f"{name}: its URL must be http(s)://host[:port][/path]")
        out[name] = Notifier(name, kind, url)
    return tuple(out.values())


def _label(step: int, steps: int, phase: str) -> str:
    return f"{steps}/{steps}" if phase == "Promoted" else f"{min(step, steps - 1) + 1}/{steps}"


def payload(release: GrayRelease, h: HistoryEntry) -> dict[str, Any]:
    """The generic JSON of one recorded transition."""
    steps = len(release.spec.cells[0].weights)
    st = release.status
    return {
        "kind": "GrayReleaseTransition",
        "id": f"{release.metadata.uid}/{h.seq}",
        "time": h.time.isoformat().replace("+00:00", "Z"),
        "namespace": release.metadata.namespace,
        "release": release.metadata.name,
        "uid": release.metadata.uid,
        "attempt": st.attempt if st is not None else None,
        "reason": h.reason,
        "message": h.message,
        "phase": h.phase,
        "step": _label(h.step, steps, h.phase),
        "candidateWeight": max(h.weights.values(), default=0.0),
        "weights": h.weights,
        "metrics": h.metrics,
        "stable": release.spec.stable.model_version,
        "candidate": release.spec.candidate.model_version,
    }


def render(kind: NotifierKind, doc: Mapping[str, Any]) -> tuple[dict[str, str], bytes]:
    """(headers, body) of ``doc`` for a webhook of ``kind``."""
    if kind == "slack":
        body: dict[str, Any] = {
            "text": f"GrayRelease {doc['namespace']}/{doc['release']}: {doc['reason']} - {doc['message']}",
            "attachments": [
                {
                    "color": _COLOR.get(str(doc["phase"]), "#439FE0"),
                    "fields": [
                        {"title": "Phase", "value": doc["phase"], "short": True},
                        {"title": "Step", "value": doc["step"], "short": True},
                        {"title": "Candidate weight", "value": f"{doc['candidateWeight']:g}%", "short": True},
                        {"title": "Candidate", "value": doc["candidate"], "short": True},
                    ],
                    "footer": "tinct",
                }
            ],
        }
        return {"Content-Type": "application/json"}, json.dumps(body).encode()
    if kind == "cloudevents":
        event = {
            "specversion": "1.0",
            "id": doc["id"],
            "source": f"/apis/tinct.io/v1alpha1/namespaces/{doc['namespace']}/grayreleases/{doc['release']}",
            "type": f"io.tinct.grayrelease.{str(doc['reason']).lower()}",
            "subject": doc["release"],
            "time": doc["time"],
            "datacontenttype": "application/json",
            "data": dict(doc),
        }
        return {"Content-Type": "application/cloudevents+json; charset=utf-8"}, json.dumps(event).encode()
    return {"Content-Type": "application/json"}, json.dumps(dict(doc)).encode()


@dataclass
class Breaker:
    """A webhook's circuit breaker: open after ``after`` failed attempts in a row, tried again
    once ``retry_after`` seconds later. Times are ``time.monotonic()`` seconds."""

    after: int
    retry_after: float
    #: Failed attempts in a row (a 2xx or a 4xx answer resets it: the receiver is alive).
    failures: int = 0
    #: While open: when one attempt may go again; None: closed.
    open_until: float | None = None

    def holds(self, now: float) -> bool:
        """Whether the breaker is open at ``now``: drop, do not try."""
        return self.open_until is not None and now < self.open_until

    @property
    def probing(self) -> bool:
        """Open, and its wait over: the next notification gets one attempt."""
        return self.open_until is not None

    def failed(self, now: float) -> bool:
        """Count a failed attempt; whether the breaker opens (or opens again) with it."""
        self.failures += 1
        if self.probing or self.failures >= self.after:
            self.open_until = now + self.retry_after
            return True
        return False

    def answered(self) -> None:
        self.failures = 0
        self.open_until = None


@dataclass
class _Queue:
    notifier: Notifier
    breaker: Breaker
    items: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(QUEUE))
    task: asyncio.Task[None] | None = None


class Dispatcher:
    """The webhooks of one operator and their delivery tasks; start and use it on the loop."""

    def __init__(
        self,
        notifiers: Sequence[Notifier],
        metrics: ReleaseMetrics,
        *,
        timeout: float = 5.0,
        attempts: int = 6,
        backoff: float = 1.0,
        break_after: int = 3,
        retry_after: float = 30.0,
    ) -> None:
        self.notifiers = {n.name: n for n in notifiers}
        self.metrics = metrics
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.break_after = max(1, break_after)
        self.retry_after = retry_after
        self._queues: dict[str, _Queue] = {}
        self._session: aiohttp.ClientSession | None = None

    def unknown(self, release: GrayRelease) -> list[str]:
        """The webhooks ``release`` names that this operator does not have."""
        return [r.name for r in release.spec.notify if r.name not in self.notifiers]

    def post(self, release: GrayRelease, recorded: Sequence[HistoryEntry]) -> int:
        """Queue a notification of each recorded transition for each webhook the release
        names (and wants it for); returns how many were queued. Never waits."""
        queued = 0
        for entry in recorded:
            doc = payload(release, entry)
            for ref in release.spec.notify:
                if ref.name not in self.notifiers or (ref.on and entry.reason not in ref.on):
                    continue
                q = self._queue(ref.name)
                if q.items.full():
                    q.items.get_nowait()
                    self.metrics.notifications.labels(ref.name, "dropped").inc()
                q.items.put_nowait(doc)
                queued += 1
        return queued

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue(self.notifiers[name], Breaker(self.break_after, self.retry_after))
            q.task = asyncio.get_running_loop().create_task(self._deliver(q), name=f"tinct-notify-{name}")
        return q

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False, trust_env=False
            )
        return self._session

    async def _deliver(self, q: _Queue) -> None:
        name = q.notifier.name
        while True:
            doc = await q.items.get()
            if q.breaker.holds(time.monotonic()):
                result = "dropped"  # its circuit is open: no attempt, no wait
            else:
                try:
                    result = await self._send(q.notifier, doc, q.breaker)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one notification never stops the webhook's task
                    log.warning("notifier %s: %s", name, exc)
                    result = "failed"
            self.metrics.notifications.labels(name, result).inc()
            self.metrics.notifier_open.labels(name).set(1.0 if q.breaker.open_until is not None else 0.0)
            q.items.task_done()

    async def _send(self, n: Notifier, doc: Mapping[str, Any], breaker: Breaker) -> str:
        """``sent``, ``refused`` (a 4xx other than 429: not retried), ``failed`` (after its
        attempts) or ``dropped`` (the breaker opened on this one's failed attempt)."""
        headers, body = render(n.kind, doc)
        why = ""
        attempts = 1 if breaker.probing else self.attempts
        for attempt in range(attempts):
            if attempt:
                self.metrics.notification_retries.labels(n.name).inc()
                await asyncio.sleep(min(60.0, self.backoff * 2 ** (attempt - 1)))
            try:
                async with asyncio.timeout(self.timeout):
                    async with self._http().post(
                        n.url, data=body, headers=headers, allow_redirects=False
                    ) as answer:
                        await answer.content.read(MAX_ANSWER)
                        status = answer.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
                if self._failed(n, breaker, why):
                    return "dropped"
                continue
            if 200 <= status < 300:
                breaker.answered()
                return "sent"
            why = f"HTTP {status}"
            if status != 429 and status < 500:
                breaker.answered()
                log.warning("notifier %s refused %s %s: %s", n.name, doc["reason"], doc["id"], why)
                return "refused"
            if self._failed(n, breaker, why):
                return "dropped"
        log.warning(
            "notifier %s: %s %s not delivered after %d attempts (last: %s)",
            n.name,
            doc["reason"],
            doc["id"],
            self.attempts,
            why,
        )
        return "failed"

    def _failed(self, n: Notifier, breaker: Breaker, why: str) -> bool:
        """A failed attempt; whether the breaker opened with it (the notification is dropped)."""
        reopened = breaker.probing
        if not breaker.failed(time.monotonic()):
            return False
        if not reopened:
            self.metrics.notifier_opened.labels(n.name).inc()
        self.metrics.notifier_open.labels(n.name).set(1.0)
        log.warning(
            "notifier %s: %d failed attempts in a row (last: %s); notifications to it are dropped "
            "for %gs, then one is tried again",
            n.name,
            breaker.failures,
            why,
            breaker.retry_after,
        )
        return True

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queues to empty (at shutdown)."""
        waits = [q.items.join() for q in self._queues.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    async def close(self) -> None:
        for q in self._queues.values():
            if q.task is not None:
                q.task.cancel()
        for q in self._queues.values():
            if q.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await q.task
        if self._session is not None:
            await self._session.close()
