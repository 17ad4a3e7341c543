"""Sum the metrics of a router's worker processes into one exposition.

Each worker keeps its own counters (:mod:`tinct.router.metrics`) and serves them as
Prometheus text on its private socket; the parent reads them all at scrape time and adds
them up. This was chosen over ``prometheus_client``'s multiprocess mode: that mode keeps
every value in a memory-mapped file, which would put a file write and a lock back on the
per-request path the router's plain counters avoid, needs a shared directory cleaned of
dead workers' files, and cannot carry the collector-built families.

How samples combine across workers: counters, histograms and summaries add up; gauges take
the largest value (``tinct_router_candidate_ejected`` is 1 when any worker has the
candidate ejected), except ``tinct_router_table_version``, which takes the *smallest*: the
operator reads it to know that every router serves a table, so a worker that lags must
show, and a release's series is left out until every live worker serves a table of it;
``_created`` timestamps take the earliest. A worker that dies leaves its last-read counts
behind (:meth:`MetricsSum.retire`), so the sums never go down when a worker is restarted —
Prometheus would read a drop as a counter reset and count the new total again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

#: (sample name, sorted label pairs)
SampleKey = tuple[str, tuple[tuple[str, str], ...]]

_MAXED = frozenset({"gauge", "unknown", "info", "stateset"})
#: Gauges whose sum over workers is the lowest value, shown only where every worker has one.
LOWEST = frozenset({"tinct_router_table_version"})


@dataclass
class Family:
    """One metric family as read from a worker: its samples by name and labels."""

    name: str
    type: str
    documentation: str
    samples: dict[SampleKey, float] = field(default_factory=dict)


def parse(text: str) -> dict[str, Family]:
    """The families of a Prometheus text exposition."""
    out: dict[str, Family] = {}
    for mf in text_string_to_metric_families(text):
        fam = out.setdefault(mf.name, Family(mf.name, mf.type, mf.documentation))
        for s in mf.samples:
            fam.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _combine(family: str, kind: str, sample: str, a: float, b: float) -> float:
    if sample.endswith("_created") or family in LOWEST:
        return min(a, b)
    if kind in _MAXED:
        return max(a, b)
    return a + b


def merge(into: dict[str, Family], more: dict[str, Family], *, counters_only: bool = False) -> None:
    """Add ``more``'s samples to ``into`` (only counter-like ones with ``counters_only``)."""
    for name, fam in more.items():
        if counters_only and fam.type in _MAXED:
            continue
        dst = into.get(name)
        if dst is None:
            dst = into[name] = Family(fam.name, fam.type, fam.documentation)
        for key, value in fam.samples.items():
            old = dst.samples.get(key)
            dst.samples[key] = value if old is None else _combine(name, fam.type, key[0], old, value)


class _Families(Collector):
    def __init__(self, families: Iterable[Family]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        for fam in self.families:
            m = Metric(fam.name, fam.documentation, fam.type)
            for (sample, labels), value in sorted(fam.samples.items()):
                m.add_sample(sample, dict(labels), value)
            yield m


def render(families: Iterable[Family]) -> bytes:
    """Prometheus text of ``families``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


class MetricsSum:
    """The workers' metrics added up, kept monotonic across worker restarts."""

    def __init__(self) -> None:
        #: Counter-like samples of workers that died, as last read.
        self.retired: dict[str, Family] = {}

    def retire(self, last: dict[str, Family] | None) -> None:
        """A worker died: keep its last-read counts in the sums."""
        if last:
            merge(self.retired, last, counters_only=True)

    def total(self, live: Sequence[dict[str, Family]]) -> dict[str, Family]:
        """The sum of the retired counts and of each live worker's metrics.

        ``live`` has one entry per running worker; one not read yet is an empty dict, so
        the :data:`LOWEST` gauges it does not report yet are left out.
        """
        out: dict[str, Family] = {}
        merge(out, self.retired)
        for families in live:
            merge(out, families)
        for name in LOWEST:
            fam = out.get(name)
            if fam is not None:
                every = [f.samples if (f := families.get(name)) else {} for families in live]
                fam.samples = {k: v for k, v in fam.samples.items() if all(k in s for s in every)}
        return out


def sample_sum(families: dict[str, Family], family: str) -> float:
    """Sum of the ``<family>_total`` samples (every label set) in ``families``."""
    fam = families.get(family)
    if fam is None:
        return 0.0
    return sum(v for (name, _), v in fam.samples.items() if name == f"{family}_total")


__all__ = ["LOWEST", "Family", "MetricsSum", "merge", "parse", "render", "sample_sum"]
