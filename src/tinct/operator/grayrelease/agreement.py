"""The ``shadow-agreement`` gate: how often the candidate answers like stable, after the noise
floor, per cell and overall; pure but for its PromQL.

The comparer (``tinct comparer``) counts every mirrored pair by verdict in
``tinct_shadow_pairs_total{namespace, release, dye_tag, target, verdict}``; :func:`query`
reads the window's increase by dye tag, target and verdict, :func:`pair_samples` folds it,
and :func:`judge` says what counts:

- A **candidate pair** (target ``candidate``) agrees when its verdict is ``same``; it
  disagrees when ``different`` or ``candidate_error`` (a candidate that does not answer does
  not answer alike). ``skipped`` pairs (too long, binary, stable's own error) count for
  neither. The candidate's *disagreement* is the share of its pairs that disagree.
- A **noise pair** (target ``stable``: stable asked twice) disagrees when ``different``; its
  share of the noise pairs compared (``same`` or ``different``) is the **noise floor**:
  stable's disagreement with itself. A cell's noise floor is its own when it has at least
  :data:`MIN_NOISE_PAIRS` noise pairs, else the release's over all cells.
- The **agreement after the noise floor** is ``100 - max(0, disagreement - noise floor)``
  percent: a candidate is not failed for the noise stable has too.
- Each cell with at least ``minPairs`` candidate pairs is judged against ``min``; the release
  as a whole too, over every pair. Fewer pairs than ``minPairs`` overall is inconclusive;
  a cell under ``minPairs`` is shown but not judged. Any judged cell, or the whole, below
  ``min`` fails, naming the cell that agrees least.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tinct.api.v1alpha1.analysis import DEFAULT_MIN_PAIRS
from tinct.api.v1alpha1.grayrelease import Metric, MetricResult, ShadowCell, ShadowResult
from tinct.operator.grayrelease.prometheus import selector
from tinct.operator.grayrelease.samples import prom_number, value_of

__all__ = ["MIN_NOISE_PAIRS", "PairSamples", "judge", "pair_samples", "query"]

#: Noise pairs a cell needs for a noise floor of its own (else the release's is used).
MIN_NOISE_PAIRS = 10


def query(namespace: str, release: str, window: str) -> str:
    """The PromQL of the pairs the comparer counted for the release over ``window``."""
    sel = selector(namespace=namespace, release=release)
    return f"sum by (dye_tag, target, verdict) (increase(tinct_shadow_pairs_total{{{sel}}}[{window}]))"


@dataclass
class Tally:
    same: float = 0.0
    different: float = 0.0
    errors: float = 0.0
    skipped: float = 0.0

    def add(self, other: Tally) -> None:
        self.same += other.same
        self.different += other.different
        self.errors += other.errors
        self.skipped += other.skipped


@dataclass
class PairSamples:
    """Pairs of the window: (target, dye_tag) -> counts by verdict."""

    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    non_finite: str | None = None

    def tally(self, target: str, tags: Iterable[str] | None) -> Tally:
        wanted = None if tags is None else set(tags)
        out = Tally()
        for (t, tag), n in self.tallies.items():
            if t == target and (wanted is None or tag in wanted):
                out.add(n)
        return out

    @property
    def tags(self) -> list[str]:
        return list(dict.fromkeys(tag for _, tag in self.tallies))


def pair_samples(rows: Iterable[Mapping[str, Any]]) -> PairSamples:
    """Fold the vector :func:`query` answered."""
    out = PairSamples()
    for row in rows:
        v = value_of(row)
        if not math.isfinite(v):
            out.non_finite = prom_number(v)
            continue
        m = row.get("metric", {})
        t = out.tallies.setdefault((str(m.get("target", "")), str(m.get("dye_tag", ""))), Tally())
        verdict = m.get("verdict")
        if verdict == "same":
            t.same += v
        elif verdict == "different":
            t.different += v
        elif verdict == "candidate_error":
            t.errors += v
        else:
            t.skipped += v
    return out


def _share(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


@dataclass(frozen=True)
class _Reading:
    pairs: float
    agreement: float | None
    noise_pairs: float
    noise_floor: float | None
    adjusted: float | None
    skipped: float


def _read(samples: PairSamples, tags: Iterable[str] | None, release_floor: float | None) -> _Reading:
    tags = None if tags is None else list(tags)
    cand = samples.tally("candidate", tags)
    noise = samples.tally("stable", tags)
    pairs = cand.same + cand.different + cand.errors
    noise_pairs = noise.same + noise.different
    own = _share(noise.different, noise_pairs)
    floor = own if noise_pairs >= MIN_NOISE_PAIRS or tags is None else release_floor
    agreement = _share(cand.same, pairs)
    adjusted = None
    if agreement is not None:
        adjusted = 100.0 - max(0.0, (100.0 - agreement) - (floor or 0.0))
    return _Reading(pairs, agreement, noise_pairs, floor, adjusted, cand.skipped + noise.skipped)


def _verdict(r: _Reading, m: Metric, min_pairs: int) -> str:
    if r.adjusted is None or r.pairs < min_pairs:
        return "Inconclusive"
    assert m.min is not None
    return "Fail" if r.adjusted < m.min else "Pass"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}%"


def judge(
    m: Metric, samples: PairSamples, cells: Mapping[str, list[str]] | None, shadowed: Iterable[str] = ()
) -> tuple[MetricResult, ShadowResult]:
    """The ``shadow-agreement`` verdict of one window, and what status shows of it.

    Args:
        m: the metric (``min``, ``minPairs``).
        samples: the pairs of the window (:func:`pair_samples`).
        cells: cell name -> dye tags (the routing table's); a tag no cell lists is left out
            of the cells but counted overall.
        shadowed: cells whose shadow share is above 0 at this step: shown even without pairs.
    """
    min_pairs = m.min_pairs or DEFAULT_MIN_PAIRS
    threshold = f">= {m.min:g}% after the noise floor, {min_pairs} pairs"
    if samples.non_finite:
        why = f"Prometheus answered {samples.non_finite} for the pairs, not a finite number"
        return MetricResult(
            name=m.name, threshold=threshold, verdict="Inconclusive", message=why
        ), ShadowResult()
    whole = _read(samples, None, None)
    wanted = set(shadowed)
    shown: list[ShadowCell] = []
    for name, tags in (cells or {}).items():
        r = _read(samples, tags, whole.noise_floor)
        if not r.pairs and not r.noise_pairs and name not in wanted:
            continue
        shown.append(
            ShadowCell(
                cell=name,
                pairs=r.pairs,
                agreement=r.agreement,
                noise_pairs=r.noise_pairs,
                noise_floor=r.noise_floor,
                adjusted=r.adjusted,
                verdict=_verdict(r, m, min_pairs),
            )
        )
    failing = sorted((c for c in shown if c.verdict == "Fail"), key=lambda c: c.adjusted or 0.0)
    overall = _verdict(whole, m, min_pairs)
    worst = min((c for c in shown if c.adjusted is not None), key=lambda c: c.adjusted or 0.0, default=None)
    status = ShadowResult(
        pairs=whole.pairs,
        agreement=whole.agreement,
        noise_pairs=whole.noise_pairs,
        noise_floor=whole.noise_floor,
        adjusted=whole.adjusted,
        skipped=whole.skipped,
        cells=shown,
        worst_cell=worst.cell if worst is not None else None,
    )
    counts = f"{whole.pairs:.0f} pairs, noise floor {_pct(whole.noise_floor)} over {whole.noise_pairs:.0f}"
    if failing:
        c = failing[0]
        msg = (
            f"cell {c.cell} agrees {_pct(c.adjusted)} after a noise floor of {_pct(c.noise_floor)} "
            f"({c.pairs:.0f} pairs) < {m.min:g}%"
        )
        if len(failing) > 1:
            msg += f"; {len(failing) - 1} more cell(s) below"
        verdict = "Fail"
    elif overall == "Fail":
        msg, verdict = f"{_pct(whole.adjusted)} < {m.min:g}% ({counts})", "Fail"
        if worst is not None:  # no cell has minPairs yet: the one that agrees least is named
            msg += f"; worst: cell {worst.cell} agrees {_pct(worst.adjusted)} ({worst.pairs:.0f} pairs)"
    elif overall == "Inconclusive":
        msg, verdict = f"{whole.pairs:.0f} pairs compared < minPairs {min_pairs}", "Inconclusive"
    else:
        msg, verdict = counts, "Pass"
    result = MetricResult(
        name=m.name,
        value=whole.adjusted,
        threshold=threshold,
        verdict=verdict,
        message=msg,
    )
    return result, status
