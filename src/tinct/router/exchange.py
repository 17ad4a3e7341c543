"""One request on its way through the router, and what became of it.

The handler makes an :class:`Exchange` when a request's head is in; classification, the
proxy and the metrics fill in and read the same object instead of passing its parts along
one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tinct.router.connection import ServerConnection
    from tinct.router.request import Request
    from tinct.router.response import Response, Sink
    from tinct.router.table import CompiledTable
    from tinct.router.tokens import Meter

#: Dye tag label of requests that are not classified (other endpoints, rejected requests).
UNCLASSIFIED = "none"


class Tee(Protocol):
    """What the proxy needs of a mirror (:class:`~tinct.router.shadow.Mirror`): a copy of
    stable's answer, and to know when it ended."""

    def tee(self, resp: Response, sink: Sink) -> Sink: ...
    def stable_ended(self, complete: bool) -> None: ...


@dataclass(slots=True)
class Exchange:
    """A request, the table it is routed by, and its outcome as far as it got."""

    conn: ServerConnection
    request: Request
    table: CompiledTable
    #: ``time.perf_counter()`` when the request's head was in.
    started: float
    #: Dye tag; :data:`UNCLASSIFIED` for other endpoints and refusals.
    tag: str = UNCLASSIFIED
    #: The whole body of a classified request (emptied once an answer is taken: no retry
    #: follows, and a stream need not hold its prompt); None streams the client's body through.
    body: bytes | None = None
    #: The sticky choice sent it to the candidate.
    candidate: bool = False
    #: The model the client named, when a LoRA adapter candidate answers under its served
    #: name (:mod:`tinct.router.adapter`): the answer names this one again.
    base_model: str | None = None
    #: The request asked for a stream (``"stream": true``).
    stream: bool = False
    #: The request is mirrored (:mod:`tinct.router.shadow`): stable's answer is teed to it.
    mirror: Tee | None = None
    # --- the outcome --------------------------------------------------------------------
    #: Who answered: ``stable``, ``candidate`` or ``router`` (refused before any backend).
    side: str = "router"
    scheduler_version: str = ""
    status: int = 0
    #: Seconds to the answer's head: from ``started``, or after a fallback from the start of
    #: stable's attempt; None when there was no upstream answer.
    ttfb: float | None = None
    #: What the answer said (tokens, contract), for classified requests while the router
    #: measures tokens; None otherwise.
    meter: Meter | None = None


__all__ = ["UNCLASSIFIED", "Exchange", "Tee"]
