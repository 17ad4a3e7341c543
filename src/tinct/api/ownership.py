"""Which route serves a model on the shared routers: the rule the operator and the routers share.

Every routing table names the OpenAI ``model`` values it serves, and one router fleet serves
the tables of every namespace. A model name belongs to one namespace: the one a cluster
administrator mapped it to (``--model-owner MODEL=NAMESPACE``, the chart's ``modelOwners``),
else the namespace that first routed it — the namespace of the table with the earliest
claim on it, live or standing (the route a deleted release leaves). A table's claim on a
model (:func:`since`) is what it records in ``claimed``: a claim carried over from a table of
its namespace it took the model over from (the next release of a model keeps its
namespace's place), or the moment the operator first wrote the table, which tells apart two
tables created within one second of each other; never later than a second after its
ConfigMap was created, and that creation time for a model it records nothing of. A table of another namespace never gets it, however new
or live, so a tenant cannot take another's model by naming it, nor by waiting for its
release to be deleted.

Within the owning namespace, a live table takes the model from a standing one (the next
release of a model takes over from the last one's outcome), and of two live tables the older
keeps it. Once no table of the owning namespace names the model any more, it is free again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from tinct.text import listed

__all__ = ["Route", "holders", "owning_namespaces", "parse_model_owners", "since"]


class Route(Protocol):
    """A routing table as the rule sees it."""

    @property
    def key(self) -> str:
        """Tells two tables of one age apart (the ConfigMap's name)."""

    @property
    def created(self) -> float:
        """When its ConfigMap was created (epoch seconds)."""

    @property
    def namespace(self) -> str:
        """The namespace of the release it belongs to."""

    @property
    def standing(self) -> bool:
        """The route a deleted release left behind."""

    @property
    def models(self) -> Sequence[str]: ...

    def since(self, model: str) -> float:
        """Its claim on ``model``: when its namespace began routing it (epoch seconds)."""


R = TypeVar("R", bound=Route)


def since(claimed: Mapping[str, float], created: float, model: str) -> float:
    """A table's claim on ``model``: what it records in ``claimed``, at the latest a second after
    its ConfigMap's ``created`` (the API server counts whole seconds), else ``created``."""
    return min(claimed.get(model, created), created + 1.0)


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def owning_namespaces(routes: Iterable[Route], owners: Mapping[str, str]) -> dict[str, str]:
    """Model -> the namespace it belongs to, for every model ``routes`` name."""
    first: dict[str, tuple[float, str, str]] = {}
    for r in routes:
        for m in r.models:
            claim = (r.since(m), r.key, r.namespace)
            if m not in first or claim < first[m]:
                first[m] = claim
    return {m: owners.get(m, ns) for m, (_, _, ns) in first.items()}


def holders(routes: Sequence[R], owners: Mapping[str, str]) -> dict[str, R]:
    """Model -> the route that serves it (see the module doc); a model whose owning namespace
    names it in no route is served by none."""
    owner = owning_namespaces(routes, owners)
    out: dict[str, R] = {}
    for r in sorted(routes, key=lambda r: (r.standing, r.created, r.key)):
        for m in r.models:
            if r.namespace == owner[m]:
                out.setdefault(m, r)
    return out


def parse_model_owners(items: str | Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``MODEL=NAMESPACE`` pairs from ``--model-owner`` values or a ``,``-separated variable."""
    out: dict[str, str] = {}
    for item in listed(items):
        model, eq, namespace = item.rpartition("=")
        if not eq or not model or any(c.isspace() for c in model):
            raise ValueError(f"{item!r} is not MODEL=NAMESPACE")
        if len(namespace) > 63 or not _NAMESPACE.match(namespace):
            raise ValueError(f"{item!r}: {namespace!r} is not a namespace name")
        if out.get(model, namespace) != namespace:
            raise ValueError(f"model {model!r} is given two namespaces")
        out[model] = namespace
    return tuple(out.items())
