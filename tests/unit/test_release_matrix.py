"""`tinct release status` layout: the dye matrix with the current step marked."""

from __future__ import annotations

from datetime import timedelta

from tinct.api.v1alpha1.grayrelease import AnalysisResult, MetricResult, ShadowCell, ShadowResult
from tinct.release.matrix import matrix, render
from tinct_testing.release_helpers import LONG, SHORT, T0, release, result, step


def test_matrix_marks_the_current_step_and_weights_in_force() -> None:
    gr = step(release(), T0)
    gr = step(gr, T0 + timedelta(minutes=1), result("Pass", T0 + timedelta(minutes=1)))
    data = matrix(gr)
    assert (data["phase"], data["step"], data["steps"]) == ("Progressing", "2/4", 4)
    assert data["cells"][0] == {
        "cell": LONG,
        "weights": [5, 20, 50, 100],
        "inForce": 20,
        "shadow": None,
        "shadowInForce": 0,
    }
    assert not any(ln.startswith("shadow") for ln in render(data).splitlines())
    assert data["lastAnalysis"]["verdict"] == "Pass"
    assert data["lastAnalysis"]["step"] == "1/4"  # the step it judged, numbered as everywhere else

    plain = render(data)
    lines = plain.splitlines()
    assert "\033[" not in plain
    assert lines[0].startswith("GrayRelease llm/chat  phase Progressing  step 2/4")
    header = next(ln for ln in lines if ln.startswith("cell"))
    assert header.split() == ["cell", "step", "1", "step", "2*", "step", "3", "step", "4", "in", "force"]
    row = next(ln for ln in lines if ln.startswith(LONG))
    assert row.split() == [LONG, "5", "20", "50", "100", "20"]
    assert any(ln.strip().startswith("success-rate") and ln.rstrip().endswith("Pass") for ln in lines)
    assert any(ln.startswith("last analysis 2026-01-01T00:01:00Z (step 1/4): Pass") for ln in lines), plain

    colored = render(data, color=True)
    assert "\033[36m" in colored  # the current step's column
    assert "\033[32mPass\033[0m" in colored


def test_rolled_back_matrix_shows_zero_in_force_and_no_marked_step() -> None:
    gr = step(step(release(), T0), T0, actions=["abort@a1-x"])
    text = render(matrix(gr))
    assert "*" not in text.split("\n")[2]
    row = next(ln for ln in text.splitlines() if ln.startswith(LONG))
    assert row.split()[-1] == "0"
    assert "phase RolledBack" in text
    assert "Degraded=True Aborted" in text
    assert "last action abort@a1-x: Done" in text


def test_measured_numbers_in_status_are_readable() -> None:
    from tinct.api.v1alpha1.grayrelease import AnalysisResult, MetricResult

    m = MetricResult(name="latency-p95", value=3.1578947368421053, threshold="<= 800 ms", verdict="Pass")
    r = AnalysisResult(time=T0, verdict="Pass", metrics=[m], requests=1234.5678901)
    wire = r.wire()
    assert wire["metrics"][0]["value"] == 3.15789  # what kubectl describe shows
    assert wire["requests"] == 1234.57
    assert MetricResult(name="x", value=99.995, threshold="t", verdict="Pass").value == 99.995
    assert MetricResult(name="x", value=0.000123456789, threshold="t", verdict="Pass").value == 0.000123457


def test_llm_metrics_show_their_units_and_the_engine_series_read() -> None:
    from tinct.api.v1alpha1.grayrelease import AnalysisResult, MetricResult

    gr = step(release(), T0)
    la = AnalysisResult(
        time=T0,
        verdict="Fail",
        metrics=[
            MetricResult(name="ttft-p95", value=412.5, threshold="<= 1500 ms", verdict="Pass"),
            MetricResult(
                name="queue-depth",
                value=11.0,
                threshold="<= 8 requests",
                verdict="Fail",
                message="11 > 8",
                series="vllm:num_requests_waiting",
            ),
        ],
    )
    assert gr.status is not None
    gr.status.last_analysis = la
    lines = render(matrix(gr)).splitlines()
    ttft = next(ln for ln in lines if ln.strip().startswith("ttft-p95"))
    assert ttft.split() == ["ttft-p95", "412.5", "<=", "1500", "ms", "Pass"]
    queue = next(ln for ln in lines if ln.strip().startswith("queue-depth"))
    assert queue.split() == [
        "queue-depth",
        "11",
        "<=",
        "8",
        "requests",
        "Fail",
        "11",
        ">",
        "8",
        "(vllm:num_requests_waiting)",
    ]


def test_shadow_shares_agreement_per_cell_and_the_noise_floor_are_shown() -> None:
    cells = release().wire()["spec"]["cells"]
    cells[1].update(weights=[0, 1, 10, 100], shadow=[20, 10, 0, 0])
    gr = step(release(cells=cells), T0)
    shadow = ShadowResult(
        pairs=140,
        agreement=80,
        noise_pairs=14,
        noise_floor=7.14,
        adjusted=86.8,
        skipped=3,
        worst_cell=SHORT,
        cells=[
            ShadowCell(
                cell=SHORT,
                pairs=140,
                agreement=80,
                noise_pairs=14,
                noise_floor=7.14,
                adjusted=86.8,
                verdict="Fail",
            )
        ],
    )
    gate = MetricResult(
        name="shadow-agreement", value=86.8, threshold=">= 95% after the noise floor", verdict="Fail"
    )
    st = gr.status
    assert st is not None
    st.last_analysis = AnalysisResult(time=T0, verdict="Fail", metrics=[gate], step=0, shadow=shadow)
    data = matrix(gr)
    assert next(c for c in data["cells"] if c["cell"] == SHORT)["shadowInForce"] == 20
    lines = render(data).splitlines()
    assert lines[lines.index("shadow (percent mirrored per step; agreement in the last analysis)") + 1].split() == [
        SHORT, "20/10/0/0", "in", "force", "20", "agreement", "86.8%", "after", "a", "noise", "floor", "of",
        "7.14%", "(140", "pairs,", "14", "noise", "pairs)", "Fail",
    ]  # fmt: skip
    assert (
        f"  overall agreement 86.8% after a noise floor of 7.14% (140 pairs, 14 noise pairs), 3 skipped; least: {SHORT}"
        in lines
    )
