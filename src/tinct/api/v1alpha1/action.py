"""The ``tinct.io/action`` annotation: a person's request to a GrayRelease.

A contract between ``tinct release`` (and ``kubectl tinct``, which runs it), GitOps or
``kubectl annotate``, and the controller. The value is ``<verb>@<nonce>``, a verb of
:data:`ACTIONS`; ``tinct release`` writes ``<verb>@a<attempt>-<nonce>`` (:func:`action_value`),
addressed to the release's current attempt (``status.attempt``). A new nonce is a new request.

The controller carries out each request once, in the order given, and records it in
``status.acknowledgedAction``, ``status.lastAction`` and ``status.seenActions`` (the last
:data:`SEEN_ACTIONS` values). It refuses to replay one (:func:`replay_refusal`): a value present
when the release is created, one handled before, one that names no verb, or one addressed to
another attempt. On a release in a final phase, Promoted or RolledBack, only ``retry`` of a
rolled-back one means anything: every other action, ``pause`` included, is refused
(:func:`final_refusal`), by ``tinct release`` before it writes anything and by the controller
for a request written otherwise.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTIONS",
    "ACTION_ANNOTATION",
    "FINAL_PHASES",
    "SEEN_ACTIONS",
    "VALUE_LIMIT",
    "ActionRequest",
    "action_value",
    "bounded",
    "final_refusal",
    "handled",
    "parse_action",
    "replay_refusal",
]

#: Annotation carrying a manual request, ``<verb>@<nonce>``; a new nonce is a new request.
ACTION_ANNOTATION = "tinct.io/action"
#: The verbs a request may carry.
ACTIONS = ("promote", "abort", "retry", "resume")
#: Action values remembered in ``status.seenActions`` (the bound of that field).
SEEN_ACTIONS = 32
#: Characters of an action value the status records (``status.lastAction.value``'s bound).
VALUE_LIMIT = 256

_ATTEMPT_NONCE = re.compile(r"^a([0-9]{1,9})-.+$")


@dataclass(frozen=True)
class ActionRequest:
    """An annotation value as the controller reads it."""

    value: str
    #: One of :data:`ACTIONS`; None when the value names none.
    verb: str | None
    #: The attempt the request is addressed to (``a<attempt>-`` in its nonce); None: any.
    attempt: int | None


def bounded(value: str) -> str:
    """An annotation value as the controller reads and records it: itself up to
    :data:`VALUE_LIMIT` characters, else cut with a digest of the whole, so that a value of any
    size is one request like another and never makes the status unwritable."""
    if len(value) <= VALUE_LIMIT:
        return value
    return f"{value[: VALUE_LIMIT - 19]}...{hashlib.sha256(value.encode()).hexdigest()[:16]}"


def action_value(verb: str, attempt: int, nonce: str) -> str:
    """The annotation value of a request for ``verb`` addressed to ``attempt``."""
    return f"{verb}@a{attempt}-{nonce}"


def parse_action(value: str) -> ActionRequest:
    """The verb and the attempt of an annotation value."""
    verb, _, nonce = value.partition("@")
    verb = verb.strip().lower()
    m = _ATTEMPT_NONCE.match(nonce.strip())
    return ActionRequest(value, verb if verb in ACTIONS else None, int(m.group(1)) if m else None)


def handled(value: str, status: Mapping[str, Any]) -> bool:
    """Whether the controller has handled ``value``, by the release's status (its wire form)."""
    return value in (status.get("seenActions") or []) or value == status.get("acknowledgedAction")


def replay_refusal(
    request: ActionRequest, *, at_creation: bool, seen: Collection[str], attempt: int
) -> str | None:
    """Why ``request`` must not be carried out (None: it may be).

    Args:
        request: the request.
        at_creation: it was on the release when the release was created.
        seen: the values handled before (``status.seenActions``).
        attempt: the release's current attempt (``status.attempt``).
    """
    if at_creation:
        return (
            "present when the release was created (applied again from an exported YAML?); "
            "request it anew, e.g. `tinct release promote`"
        )
    if request.value in seen:
        return "handled before; each request is carried out once: give a new nonce"
    if request.verb is None:
        return f"use one of {', '.join(ACTIONS)} as <verb>@<nonce>"
    if request.attempt is not None and request.attempt != attempt:
        return (
            f"meant for attempt {request.attempt}, but the release is on attempt {attempt}: request it anew"
        )
    return None


#: Phases a release stays in until a person acts (``retry``) or what it releases changes.
FINAL_PHASES = ("Promoted", "RolledBack")


def final_refusal(verb: str, phase: str | None) -> str | None:
    """Why ``verb`` (an action, or ``pause``) means nothing to a release in ``phase``, a final
    one; None when it is not refused for that."""
    if phase == "Promoted":
        if verb == "retry":
            return "only a rolled-back or failed release is retried; it is Promoted"
        return (
            f"the release is Promoted, which is final: there is nothing to {verb}; "
            "release stable again as a new candidate to go back"
        )
    if phase == "RolledBack" and verb != "retry":
        return (
            f"the release is RolledBack, which is final: there is nothing to {verb}; "
            "`tinct release retry` starts it over"
        )
    return None
