"""A histogram kept as plain numbers: bucket counts and a sum, cumulated only when scraped.

``prometheus_client``'s ``Histogram.observe()`` takes a lock and walks every bucket in
Python; the router does that on every proxied request and the engine emulator on every
token. Here an observation is one bisection and two additions on the event loop, and
:meth:`Histogram.buckets` turns the counts into the cumulative form of a
``HistogramMetricFamily`` when a scrape asks.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["Histogram"]


class Histogram:
    """Bucket counts (one per upper bound, then ``+Inf``) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last, as ``HistogramMetricFamily`` takes them."""
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(float(bound)), float(acc)))
        out.append(("+Inf", float(acc + self.counts[-1])))
        return out
