"""When a release's step window closes, and when the controller looks again; pure.

A step's window starts when the step does (``status.stepStartedAt``) and, for a release whose
analysis names metrics, not before every router serves the step's table
(``status.routing.confirmedAt``) nor before the step's last analysis; it lasts one
``analysis.interval``. Without metrics, the window's end is when the release moves on.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tinct.api.v1alpha1.grayrelease import GrayRelease, GrayReleaseSpec, GrayReleaseStatus, parse_duration

__all__ = ["analysis_due", "has_metrics", "needs_confirmation", "next_wakeup"]


def _interval(release: GrayRelease) -> timedelta:
    analysis = release.spec.analysis
    return timedelta(seconds=parse_duration(analysis.interval if analysis else "1m"))


def has_metrics(spec: GrayReleaseSpec) -> bool:
    """Whether the analysis names metrics that judge the candidate."""
    return spec.analysis is not None and bool(spec.analysis.metrics)


def _running(st: GrayReleaseStatus) -> bool:
    return st.phase == "Progressing" and st.step_started_at is not None and st.next_step is None


def needs_confirmation(release: GrayRelease) -> bool:
    """Whether the routers must still be seen serving the step's table before its window starts."""
    st = release.status
    return (
        st is not None
        and _running(st)
        and has_metrics(release.spec)
        and (st.routing is None or st.routing.confirmed_at is None)
    )


def _due_at(release: GrayRelease) -> datetime | None:
    st = release.status
    if st is None or not _running(st):
        return None
    assert st.step_started_at is not None
    start = st.step_started_at
    if has_metrics(release.spec):
        if st.routing is None or st.routing.confirmed_at is None:
            return None
        start = max(start, st.routing.confirmed_at)
        if (
            st.last_analysis is not None
            and st.last_analysis.step == st.step
            and st.last_analysis.time > start
        ):
            start = st.last_analysis.time
    return start + _interval(release)


def analysis_due(release: GrayRelease, now: datetime) -> bool:
    """Whether the current step's window is complete: time to analyse (or, without analysis
    metrics, to move on)."""
    due = _due_at(release)
    return due is not None and now >= due


def next_wakeup(release: GrayRelease, now: datetime, tick: float) -> float:
    """Seconds until the controller should look at ``release`` again (at most ``tick``)."""
    due = _due_at(release)
    if due is None:
        return tick
    return max(0.05, min(tick, (due - now).total_seconds()))
