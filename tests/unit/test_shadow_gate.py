"""The shadow-agreement gate: noise floor math, per cell and overall, minPairs, dark steps, and
its query through a Prometheus stand-in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tinct.api.v1alpha1.grayrelease import Analysis, Metric
from tinct.operator.grayrelease.agreement import PairSamples, judge, pair_samples
from tinct.operator.grayrelease.analysis import analyse
from tinct.operator.grayrelease.prometheus import PrometheusTarget
from tinct.operator.grayrelease.samples import samples_from
from tinct.operator.grayrelease.verdict import evaluate
from tinct_testing.prometheus_fakes import FakePrometheus, Series

NOW = datetime(2026, 1, 1, tzinfo=UTC)
A, B, C = (
    "len:short+role:user+latency:low",
    "len:long+role:admin+latency:high",
    "len:medium+role:user+latency:low",
)
CELLS = {"cell-a": [A], "cell-b": [B], "default": [C]}
GATE = Metric(name="shadow-agreement", min=90, min_pairs=20)


def rows(*counts: tuple[str, str, str, float]) -> list[dict[str, Any]]:
    return [
        {"metric": {"dye_tag": tag, "target": target, "verdict": verdict}, "value": [0, str(n)]}
        for tag, target, verdict, n in counts
    ]


def samples(**by_tag: dict[str, float]) -> PairSamples:
    """tag name (A/B/C) -> {"same": n, "different": n, "noise_same": n, "noise_different": n, ...}."""
    out = []
    for name, counts in by_tag.items():
        tag = {"A": A, "B": B, "C": C}[name]
        for key, n in counts.items():
            target, verdict = ("stable", key[6:]) if key.startswith("noise_") else ("candidate", key)
            out.append((tag, target, verdict, n))
    return pair_samples(rows(*out))


def test_an_identical_candidate_agrees_fully() -> None:
    r, s = judge(GATE, samples(A={"same": 50, "noise_same": 5}), CELLS, ["cell-a"])
    assert (r.verdict, r.value) == ("Pass", 100)
    assert [(c.cell, c.pairs, c.adjusted, c.verdict) for c in s.cells] == [("cell-a", 50, 100, "Pass")]
    assert (s.pairs, s.noise_pairs, s.noise_floor) == (50, 5, 0)


def test_the_noise_floor_is_subtracted_so_equal_noise_passes() -> None:
    # Stable disagrees with itself on 20 % of the prompts; so does the candidate.
    noisy = {"same": 80, "different": 20, "noise_same": 16, "noise_different": 4}
    r, s = judge(GATE, samples(A=noisy), CELLS, ["cell-a"])
    assert (r.verdict, r.value) == ("Pass", 100)
    (cell,) = s.cells
    assert (cell.agreement, cell.noise_floor, cell.adjusted) == (80, 20, 100)
    # Twice stable's noise is 20 points over it: 80 % after the floor.
    worse = {"same": 60, "different": 40, "noise_same": 16, "noise_different": 4}
    r, s = judge(GATE, samples(A=worse), CELLS, ["cell-a"])
    assert (r.verdict, r.value) == ("Fail", 80)
    assert r.message == "cell cell-a agrees 80% after a noise floor of 20% (100 pairs) < 90%"


def test_one_disagreeing_cell_fails_the_gate_and_is_named() -> None:
    r, s = judge(
        GATE,
        samples(A={"same": 100}, B={"same": 25, "different": 10, "candidate_error": 5}, C={"same": 100}),
        CELLS,
        ["cell-a", "cell-b", "default"],
    )
    assert r.verdict == "Fail"
    assert r.message is not None
    assert r.message.startswith("cell cell-b agrees 62.5%")
    assert s.worst_cell == "cell-b"
    assert {c.cell: c.verdict for c in s.cells} == {"cell-a": "Pass", "cell-b": "Fail", "default": "Pass"}
    # The whole release would pass on its own: the cell decides.
    assert s.adjusted is not None
    assert s.adjusted > 90


def test_a_release_failing_before_any_cell_has_its_pairs_names_the_worst_cell() -> None:
    r, s = judge(GATE, samples(A={"same": 12}, B={"different": 12}), CELLS, ["cell-a", "cell-b"])
    assert {c.cell: c.verdict for c in s.cells} == {"cell-a": "Inconclusive", "cell-b": "Inconclusive"}
    assert r.verdict == "Fail"
    assert (
        r.message == "50% < 90% (24 pairs, noise floor n/a over 0); worst: cell cell-b agrees 0% (12 pairs)"
    )
    assert s.worst_cell == "cell-b"


def test_few_pairs_are_inconclusive_and_skipped_pairs_count_for_neither() -> None:
    r, s = judge(GATE, samples(A={"same": 10, "skipped": 40}), CELLS, ["cell-a", "cell-b"])
    assert (r.verdict, r.message) == ("Inconclusive", "10 pairs compared < minPairs 20")
    assert [(c.cell, c.pairs, c.verdict) for c in s.cells] == [
        ("cell-a", 10, "Inconclusive"),
        ("cell-b", 0, "Inconclusive"),
    ]
    assert s.skipped == 40
    # A cell under minPairs is shown, not judged, when the release has enough pairs.
    r, s = judge(GATE, samples(A={"same": 30}, B={"different": 2}), CELLS, ["cell-a", "cell-b"])
    assert r.verdict == "Pass"
    assert {c.cell: c.verdict for c in s.cells} == {"cell-a": "Pass", "cell-b": "Inconclusive"}


def test_a_cell_with_few_noise_pairs_takes_the_release_noise_floor() -> None:
    r, s = judge(
        GATE,
        samples(
            A={"same": 90, "different": 10, "noise_same": 1, "noise_different": 1},
            C={"noise_same": 90, "noise_different": 10},
        ),
        CELLS,
        ["cell-a", "default"],
    )
    cell = next(c for c in s.cells if c.cell == "cell-a")
    assert cell.noise_floor == s.noise_floor
    assert s.noise_floor is not None
    assert round(s.noise_floor, 2) == round(100 * 11 / 102, 2)
    assert r.verdict == "Pass"


def analysis(*metrics: dict[str, Any]) -> Analysis:
    return Analysis.model_validate(
        {"interval": "30s", "minRequests": 10, "perCell": True, "metrics": list(metrics)}
    )


def test_a_dark_step_does_not_hold_on_router_metrics() -> None:
    spec = analysis({"name": "success-rate", "min": 99}, {"name": "shadow-agreement", "min": 90})
    r = evaluate(
        spec, samples_from({}), {}, NOW, CELLS, pairs=samples(A={"same": 40}), live=False, shadowed=["cell-a"]
    )
    assert r.verdict == "Pass"
    assert [m.name for m in r.metrics] == ["shadow-agreement"]
    assert r.message == (
        "shadow-agreement 100 (40 pairs, noise floor n/a over 0); dark step: success-rate not judged "
        "(no cell sends the candidate live traffic)"
    )
    assert r.cells == []
    assert r.shadow is not None
    assert r.shadow.cells[0].cell == "cell-a"
    # Live, the same empty window is inconclusive for the router metrics.
    live = evaluate(spec, samples_from({}), {}, NOW, CELLS, pairs=samples(A={"same": 40}), live=True)
    assert live.verdict == "Inconclusive"
    # A dark step nothing else judges moves on, as a step without metrics does.
    only_router = evaluate(
        analysis({"name": "success-rate", "min": 99}), samples_from({}), {}, NOW, CELLS, live=False
    )
    assert (only_router.verdict, only_router.metrics) == ("Pass", [])


async def test_the_gate_reads_the_comparers_pairs_of_the_release() -> None:
    series: list[Series] = [
        ("tinct_shadow_pairs_total", {"namespace": "llm", "release": "chat", "dye_tag": A, "target": t, "verdict": v}, n)
        for t, v, n in (("candidate", "same", 30.0), ("candidate", "different", 10.0), ("stable", "same", 5.0))
    ] + [
        # Another release's pairs, and the same name in another namespace, are not read.
        ("tinct_shadow_pairs_total", {"namespace": "llm", "release": "other", "dye_tag": A, "target": "candidate", "verdict": "same"}, 99.0),
        ("tinct_shadow_pairs_total", {"namespace": "dev", "release": "chat", "dye_tag": A, "target": "candidate", "verdict": "same"}, 99.0),
    ]  # fmt: skip
    spec = analysis({"name": "shadow-agreement", "min": 70, "minPairs": 20})
    async with FakePrometheus(series) as prom:
        r = await analyse(
            spec,
            "llm",
            "chat",
            NOW,
            prometheus=PrometheusTarget("default", prom.url),
            cells=CELLS,
            live=False,
        )
        asked = [q["query"] for q in prom.queries]
    assert asked == [
        'sum by (dye_tag, target, verdict) (increase(tinct_shadow_pairs_total{namespace="llm",release="chat"}[30s]))'
    ]
    (m,) = r.metrics
    assert (m.verdict, m.value, r.verdict) == ("Pass", 75, "Pass")
    assert r.shadow is not None
    assert (r.shadow.pairs, r.shadow.noise_pairs) == (40, 5)
