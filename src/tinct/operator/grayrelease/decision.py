"""What a decision takes and gives: the round's observations in, the next status out.

:func:`~tinct.operator.grayrelease.decide.decide` reads a GrayRelease (its status the one last
recorded) and the :class:`Inputs` one round observed, and returns a :class:`Decision`: the next
status and the :class:`Transition` s that led there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tinct.api.v1alpha1.grayrelease import AdapterRelease, AnalysisResult, GrayReleaseStatus
from tinct.operator.grayrelease.preconditions import Problem

__all__ = ["Capacity", "Decision", "Inputs", "Transition"]


@dataclass(frozen=True)
class Capacity:
    """The replicas of the release's Deployments as last seen; None where a side names none."""

    candidate_available: int | None = None
    #: ``spec.replicas`` of stable's Deployment: its floor while the release runs.
    stable_replicas: int | None = None


@dataclass(frozen=True)
class Inputs:
    """What one round observed."""

    now: datetime
    problems: Sequence[Problem] = ()
    #: The analysis of the current step's window, when one was due and ran.
    analysis: AnalysisResult | None = None
    #: ``tinct.io/action`` values given since the last round, oldest first.
    actions: Sequence[str] = ()
    capacity: Capacity = field(default_factory=Capacity)
    #: Digest of what is released (:func:`~tinct.operator.grayrelease.tables.target_digest`);
    #: None while it cannot be known (a ModelVersion without digests yet).
    target: str | None = None
    #: The lowest routing-table version the routers serve (from their metrics); None: unknown.
    routers: int | None = None
    #: Webhooks ``spec.notify`` names that the operator is not configured with.
    unknown_notifiers: Sequence[str] = ()
    #: Why an older release's routing table keeps this release's model (routers that serve
    #: both follow that one); None: no conflict. Reported, not acted on: routers selecting
    #: one release's table each serve both.
    conflict: str | None = None
    #: Why kopf's bookkeeping could not be written on the release (its annotations are too
    #: large); None: it was written (:mod:`tinct.operator.bookkeeping`).
    bookkeeping: str | None = None
    #: Why the status on the server was not the operator's own (someone else wrote it) and
    #: what the round went on from instead (:mod:`~tinct.operator.grayrelease.seal`).
    tampered: str | None = None
    #: Where a LoRA adapter candidate is on stable's pods, as the round found (and loaded) it;
    #: None for a release without one.
    adapter: AdapterRelease | None = None


@dataclass(frozen=True)
class Transition:
    """A change worth an Event; a ``release_events`` row too when ``record``; what
    ``status.message`` says when ``informs`` (a refused request does not speak for the release)."""

    reason: str
    message: str
    warning: bool = False
    record: bool = True
    informs: bool = True


@dataclass
class Decision:
    """The next status, and the transitions of the round in the order they happened."""

    status: GrayReleaseStatus
    transitions: list[Transition] = field(default_factory=list)
