"""What the routers' metrics of one release say over an analysis window, per side and dye tag.

:func:`queries` is the PromQL (only what the release's metrics need: the request, fallback and
truncation counts always, each histogram or the contract count only for the metric that
reads it); :func:`samples_from` folds the answered vectors into :class:`Samples`;
:func:`group` sums the dye tags of a cell (or all of them) into what the built-in metrics
judge, and :func:`quantile` reads a histogram the way ``histogram_quantile`` does.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tinct.operator.grayrelease.prometheus import selector

__all__ = [
    "EJECTED",
    "TOO_SLOW",
    "Buckets",
    "Group",
    "Samples",
    "Side",
    "group",
    "prom_number",
    "quantile",
    "queries",
    "samples_from",
    "value_of",
]

Buckets = dict[float, float]  # upper bound -> cumulative count

#: The fallback reason of a request the candidate never got (it was in its cooldown).
EJECTED = "ejected"
#: The fallback reason of a candidate answer slower than the routers' latency limit.
TOO_SLOW = "latency_too_high"
#: Histogram queries: the query key -> (its metric family, the built-in that reads it).
_HISTOGRAMS = {
    "ttfb": ("tinct_router_time_to_first_byte_seconds", "latency-p95"),
    "ttft": ("tinct_router_time_to_first_token_seconds", "ttft-p95"),
    "itl": ("tinct_router_inter_token_latency_seconds", "itl-p95"),
}


@dataclass
class Side:
    """What one side served for one dye tag over the window."""

    served: float = 0.0
    errors: float = 0.0  # answered 5xx
    truncated: float = 0.0  # cut after their headers; ``served`` counted them with their status
    throttled: float = 0.0  # answered 429
    violations: float = 0.0  # contract violations (at most one of each kind per answer)
    ttfb: Buckets = field(default_factory=dict)
    ttft: Buckets = field(default_factory=dict)
    itl: Buckets = field(default_factory=dict)

    @property
    def ok(self) -> float:
        """Answers the client got whole and without a 5xx."""
        return self.served - min(self.served, self.errors + self.truncated)


@dataclass
class Samples:
    """Everything the built-in router metrics need, per dye tag."""

    #: (side, dye_tag) -> Side
    sides: dict[tuple[str, str], Side] = field(default_factory=dict)
    #: (dye_tag, reason) -> candidate requests answered by stable instead
    fallbacks: dict[tuple[str, str], float] = field(default_factory=dict)
    #: query -> the non-finite value (or unparsable bucket bound) it answered, as written in
    #: messages; any makes the built-in metrics inconclusive.
    non_finite: dict[str, str] = field(default_factory=dict)

    def side(self, side: str, tag: str) -> Side:
        return self.sides.setdefault((side, tag), Side())


def queries(
    namespace: str, release: str, window: str, metrics: Collection[str] | None = None
) -> dict[str, str]:
    """The PromQL reading the router metrics of the release ``namespace/release`` over
    ``window`` (e.g. ``1m``) that the built-ins ``metrics`` need (None: every one); a release
    of the same name in another namespace is not read."""
    sel = selector(namespace=namespace, release=release)
    out = {
        "requests": f"sum by (side, dye_tag, code) (increase(tinct_router_requests_total{{{sel}}}[{window}]))",
        "fallbacks": f"sum by (dye_tag, reason) (increase(tinct_router_fallbacks_total{{{sel}}}[{window}]))",
        "truncated": "sum by (side, dye_tag) "
        f"(increase(tinct_router_truncated_responses_total{{{sel}}}[{window}]))",
    }
    for key, (family, metric) in _HISTOGRAMS.items():
        if metrics is None or metric in metrics:
            out[key] = f"sum by (side, dye_tag, le) (increase({family}_bucket{{{sel}}}[{window}]))"
    if metrics is None or "contract-violations" in metrics:
        out["violations"] = (
            f"sum by (side, dye_tag) (increase(tinct_router_contract_violations_total{{{sel}}}[{window}]))"
        )
    return out


def prom_number(value: float) -> str:
    """A non-finite float as Prometheus writes it."""
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def value_of(sample: Mapping[str, Any]) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def samples_from(results: Mapping[str, list[dict[str, Any]]]) -> Samples:
    """Fold the vectors answered for :func:`queries` into :class:`Samples`."""
    out = Samples()

    def rows(query: str) -> Iterable[tuple[Mapping[str, Any], float]]:
        for s in results.get(query, []):
            v = value_of(s)
            if math.isfinite(v):
                yield s.get("metric", {}), v
            else:
                out.non_finite.setdefault(query, prom_number(v))

    for m, v in rows("requests"):
        side = out.side(m.get("side", ""), m.get("dye_tag", ""))
        side.served += v
        code = str(m.get("code", ""))
        if code.startswith("5"):
            side.errors += v
        elif code == "429":
            side.throttled += v
    for m, v in rows("fallbacks"):
        key = (m.get("dye_tag", ""), m.get("reason", ""))
        out.fallbacks[key] = out.fallbacks.get(key, 0.0) + v
    for m, v in rows("truncated"):
        out.side(m.get("side", ""), m.get("dye_tag", "")).truncated += v
    for m, v in rows("violations"):
        out.side(m.get("side", ""), m.get("dye_tag", "")).violations += v
    for hist in _HISTOGRAMS:
        for m, v in rows(hist):
            try:
                le = float(m.get("le", "+Inf"))
            except (TypeError, ValueError):
                le = math.nan
            if math.isnan(le):
                out.non_finite.setdefault(hist, "a bucket bound that is not a number")
                continue
            b: Buckets = getattr(out.side(m.get("side", ""), m.get("dye_tag", "")), hist)
            b[le] = b.get(le, 0.0) + v
    return out


def quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of a cumulative histogram, as Prometheus's ``histogram_quantile``."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0 or math.isnan(total) or not any(not math.isinf(le) for le in bounds):
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


@dataclass
class Tally:
    """One side's sums over the dye tags of a group."""

    served: float = 0.0
    ok: float = 0.0
    throttled: float = 0.0
    violations: float = 0.0
    ttfb: Buckets = field(default_factory=dict)
    ttft: Buckets = field(default_factory=dict)
    itl: Buckets = field(default_factory=dict)

    def add(self, s: Side) -> None:
        self.served += s.served
        self.ok += s.ok
        self.throttled += s.throttled
        self.violations += s.violations
        for name in ("ttfb", "ttft", "itl"):
            dst: Buckets = getattr(self, name)
            for le, n in getattr(s, name).items():
                dst[le] = dst.get(le, 0.0) + n


@dataclass
class Group:
    """What the built-ins judge in a group of dye tags (a cell, or all of them)."""

    requests: float = 0.0  # the candidate got: served there or fallen back after trying it
    #: chosen for the candidate while it sat out an ejection: they count towards minRequests
    #: (the candidate's share was there) but neither for nor against it
    ejected: float = 0.0
    #: fell back for answering no head within the routers' latency limit
    slow: float = 0.0
    candidate: Tally = field(default_factory=Tally)
    stable: Tally = field(default_factory=Tally)


def group(samples: Samples, tags: Iterable[str] | None) -> Group:
    """The sums over ``tags`` (None: every dye tag). A ``latency_too_high`` fallback is an
    observation above every bucket of the candidate's time to first byte and to first token:
    it sent no head, let alone a token, within the limit."""
    wanted = None if tags is None else set(tags)
    g = Group()
    for (side, tag), s in samples.sides.items():
        if wanted is not None and tag not in wanted:
            continue
        if side == "candidate":
            g.requests += s.served
            g.candidate.add(s)
        elif side == "stable":
            g.stable.add(s)
    for (tag, reason), n in samples.fallbacks.items():
        if wanted is not None and tag not in wanted:
            continue
        if reason == EJECTED:
            g.ejected += n
            continue
        g.requests += n
        if reason == TOO_SLOW:
            g.slow += n
    if g.slow:
        for b in (g.candidate.ttfb, g.candidate.ttft):
            b[math.inf] = b.get(math.inf, 0.0) + g.slow
    return g
